"""The data dir's ``secrets.env``: credentials as ``NAME=value`` lines, readable by its owner alone.

``pincer setup`` and ``pincer channels add`` write it (``<data dir>/secrets.env``, the data dir being
``PINCER_DATA_DIR``, else ``~/.pincer``), and the ``pincer`` command reads it as it starts: each name it
holds becomes an environment variable unless the environment already sets it (the environment wins).
So a model provider's key (``OPENAI_API_KEY``) or a channel's token (named in the config as
``${TELEGRAM_BOT_TOKEN}``) never sits in ``config.yaml``, and ``pincer up`` hands each of its processes
only its own role's share, as it does with the environment.

The format is the one systemd's ``EnvironmentFile=`` reads: ``NAME=value``, the value bare or in double
quotes (``\\"`` and ``\\\\`` inside), ``#`` comments, an optional ``export``. Values are never printed:
an error names the line, not what it holds.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, MutableMapping
from pathlib import Path

from bus.config import ConfigError, data_dir_config
from bus.private_file import write_private

FILE_NAME = "secrets.env"
NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
BARE = re.compile(r"^[A-Za-z0-9_@%+=:,./~^-]*$")  # written without quotes: nothing a shell or systemd reads twice
HEADER = ("# Written by `pincer setup` / `pincer channels add`: secrets, readable by their owner only (0600).\n"
          "# NAME=value; a variable set in the environment wins over its line here.\n")


def secrets_path(env: Mapping[str, str]) -> Path:
    """Where the data dir keeps its secrets: beside the config file ``pincer setup`` writes."""
    return data_dir_config(env).with_name(FILE_NAME)


def read_secrets(path: Path) -> dict[str, str]:
    """The names and values ``path`` holds ({} when there is no such file); a line that is not
    ``NAME=value`` is a ``ConfigError`` naming the file and the line (never its value)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read it: {exc.strerror}") from None
    found: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        parsed = _parse(line)
        if parsed is None:
            raise ConfigError(f"{path}, line {number}: not NAME=value (a name of letters, digits and _, then =, "
                              "then the value, bare or in double quotes)")
        if parsed:
            found[parsed[0]] = parsed[1]
    return found


def _parse(line: str) -> tuple[str, str] | tuple[()] | None:
    """``(name, value)``, ``()`` for a blank or comment line, or None for a line that is neither."""
    stripped = line.strip()
    if not stripped or stripped.startswith("#"):
        return ()
    stripped = stripped.removeprefix("export ").lstrip()
    name, equals, value = stripped.partition("=")
    name, value = name.strip(), value.strip()
    if not equals or not NAME.match(name):
        return None
    if value.startswith('"'):
        quoted = re.fullmatch(r'"((?:[^"\\]|\\.)*)"', value)
        if quoted is None:
            return None
        return name, re.sub(r"\\(.)", r"\1", quoted.group(1))
    if value.startswith("'"):
        if len(value) < 2 or not value.endswith("'"):
            return None
        return name, value[1:-1]
    return name, value


def private_enough(path: Path) -> bool:
    """Whether no one but its owner may read or change ``path`` (true when there is no file)."""
    try:
        return not path.stat().st_mode & 0o077
    except FileNotFoundError:
        return True


def apply_secrets(env: MutableMapping[str, str], path: Path) -> list[str]:
    """Set each name ``path`` holds that ``env`` does not set already; the names set."""
    added = {name: value for name, value in read_secrets(path).items() if name not in env}
    env.update(added)
    return list(added)


def save_secrets(path: Path, values: Mapping[str, str]) -> None:
    """Set ``values`` in ``path``, keeping its other lines: the whole file replaced at once, created 0600
    (never readable by others, not even while it is written), its folder 0700 when it is made."""
    for name, value in values.items():
        if not NAME.match(name):
            raise ConfigError(f"{name!r} cannot name an environment variable (letters, digits and _)")
        if "\n" in value or "\r" in value or "\0" in value:
            raise ConfigError(f"the value for {name} holds a line break: a secret is one line")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        lines = HEADER.splitlines()
    left = dict(values)
    kept = []
    for line in lines:
        parsed = _parse(line)
        if parsed and parsed[0] in values:
            if parsed[0] in left:
                kept.append(_line(parsed[0], left.pop(parsed[0])))
            continue  # a second line of a name given anew goes
        kept.append(line)
    kept += [_line(name, value) for name, value in left.items()]
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    write_private(path, "\n".join(kept) + "\n")


def _line(name: str, value: str) -> str:
    if BARE.match(value):
        return f"{name}={value}"
    return f'{name}="' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'

