"""The environment a sandboxed command gets: a minimal base plus the caller's safe extras."""

from __future__ import annotations

import re

from bus.protocol import ErrorCode
from hands.errors import ToolFailure

BASE = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/workspace",
    "TMPDIR": "/tmp",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
}
# Names that change how programs load code or run shells: never accepted from a call.
BLOCKED_NAMES = frozenset({
    "PATH", "HOME", "PYTHONPATH", "PYTHONSTARTUP", "PYTHONHOME", "BASH_ENV", "ENV", "SHELL", "IFS",
    "GLIBC_TUNABLES", "NODE_OPTIONS", "PERL5OPT", "PERL5LIB", "RUBYOPT", "JAVA_TOOL_OPTIONS", "PROMPT_COMMAND",
    "GCONV_PATH", "LOCPATH", "HOSTALIASES", "RESOLV_HOST_CONF",
})
BLOCKED_PREFIXES = ("LD_", "DYLD_", "BASH_FUNC_", "GIT_", "NPM_CONFIG_", "PIP_")
NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


def sandbox_env(extra: dict[str, str] | None) -> dict[str, str]:
    env = dict(BASE)
    refused = []
    for name, value in (extra or {}).items():
        if not NAME.match(name) or "\x00" in value:
            raise ToolFailure(ErrorCode.INVALID_ARGUMENTS, f"env: {name!r} is not a valid variable name or value")
        if name in BLOCKED_NAMES or name.startswith(BLOCKED_PREFIXES):
            refused.append(name)
        env[name] = value
    if refused:
        raise ToolFailure(
            ErrorCode.PERMISSION_DENIED,
            f"env: {', '.join(sorted(refused))} may change how programs load code, so tools may not set it",
            suggestions=["drop those variables; set anything the command needs inside the command itself"],
        )
    return env
