"""What `pincer setup` and `pincer channels add` share: questions answered at a terminal or by flags, and the
data dir's two files they write (``config.yaml``, only the keys answered; ``secrets.env``, 0600).

A question shows at a terminal (a secret through getpass: never echoed); without one, its flag must answer
it, or the command stops naming that flag. ``--yes`` takes every default without asking. No secret is
printed, nor written anywhere but secrets.env.
"""

from __future__ import annotations

import getpass
import os
import sys
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from bus.config import DEFAULT_CONFIG, ConfigError, data_dir_config
from bus.errors import PincerError
from bus.numbers import whole_number
from bus.private_file import write_private
from bus.secrets_file import save_secrets, secrets_path


class Unanswered(PincerError):
    """A question had no answer: no terminal to ask it at, and no flag given for it (the message names it)."""


class Asker:
    """Questions to a person at a terminal, or answers from flags when there is none."""

    def __init__(self, *, interactive: bool | None = None, accept_defaults: bool = False) -> None:
        self.interactive = sys.stdin.isatty() if interactive is None else interactive
        self.accept_defaults = accept_defaults

    def text(self, question: str, *, flag: str, given: str | None = None, default: str | None = None,
             check: Callable[[str], str | None] | None = None) -> str:
        """``given`` (a flag's value), else the default under --yes, else the person's answer (the default
        when they just press Enter); ``check`` returns what is wrong with an answer, and it is asked again."""
        if given is not None:
            problem = check(given) if check else None
            if problem:
                raise Unanswered(f"{flag} {given}: {problem}")
            return given
        if default is not None and self.accept_defaults:
            return default
        if not self.interactive:
            raise Unanswered(f"no terminal to ask {question!r}: give {flag}")
        while True:
            shown = f" [{default}]" if default else ""
            print(f"{question}{shown}: ", end="", file=sys.stderr, flush=True)
            line = sys.stdin.readline()
            if not line:
                raise Unanswered(f"no answer to {question!r} (input ended): give {flag}")
            answer = line.strip() or (default or "")
            problem = check(answer) if check else (None if answer else "an answer is needed")
            if not problem:
                return answer
            print(f"  {problem}", file=sys.stderr)

    def secret(self, question: str, *, flags: str, from_file: str | None = None, from_env: str | None = None,
               optional: bool = False) -> str:
        """A secret from a file or an environment variable a flag names, else typed at the terminal (hidden).
        With ``optional``, an empty answer (or none, without a terminal) is ""."""
        if from_file is not None:
            try:
                value = Path(from_file).expanduser().read_text(encoding="utf-8").strip()
            except OSError as exc:
                raise Unanswered(f"cannot read {from_file}: {exc.strerror}") from None
            if not value:
                raise Unanswered(f"{from_file} is empty: it should hold the {question}")
            return value
        if from_env is not None:
            value = os.environ.get(from_env, "").strip()
            if not value:
                raise Unanswered(f"{from_env} is not set in the environment (it should hold the {question})")
            return value
        if not self.interactive or (optional and self.accept_defaults):
            if optional:
                return ""
            raise Unanswered(f"no terminal to ask for the {question}: give {flags}")
        while True:
            value = getpass.getpass(f"{question} (typing is not shown{', empty: none' if optional else ''}): ",
                                    stream=sys.stderr).strip()
            if value or optional:
                return value
            print("  an answer is needed", file=sys.stderr)

    def choice(self, question: str, options: Mapping[str, str], *, flag: str, default: str | None = None) -> str:
        """One of ``options`` (name -> what it is), asked as a numbered list; a name or its number is an answer."""
        names = list(options)
        if default is not None and self.accept_defaults:
            return default
        if not self.interactive:
            raise Unanswered(f"no terminal to ask {question!r}: give {flag}")
        print(question, file=sys.stderr)
        for number, name in enumerate(names, 1):
            print(f"  {number}. {options[name]}", file=sys.stderr)

        def known(answer: str) -> str | None:
            if answer in names or 1 <= (whole_number(answer) or 0) <= len(names):
                return None
            return f"answer a number from 1 to {len(names)}, or one of: {', '.join(names)}"

        answer = self.text("choose", flag=flag, default=default, check=known)
        picked = whole_number(answer)
        return names[picked - 1] if picked is not None else answer


# --- the data dir's files ---

MARK = "# Written by `pincer "  # what our header starts with


def header(command: str) -> str:
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return (f"{MARK}{command}` ({when}): only the keys its answers set.\n"
            f"# Every other key keeps its default; each one is shown and explained in the packaged\n"
            f"# defaults, {DEFAULT_CONFIG.resolve()}.\n"
            f"# Secrets are not in this file: `${{NAME}}` reads NAME from the environment, or from\n"
            f"# secrets.env beside this file (readable by its owner only; the environment wins).\n")


def config_target() -> Path:
    """The data dir's config file, the one `pincer setup` writes and `pincer` reads unless told otherwise."""
    return data_dir_config(os.environ)


def secrets_target() -> Path:
    return secrets_path(os.environ)


def write_config(path: Path, values: dict[str, Any], *, command: str) -> None:
    """``path`` replaced whole by ``values`` under a header saying what wrote it (its folder made 0700)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    body = yaml.safe_dump(values, default_flow_style=False, sort_keys=False, allow_unicode=True, width=100)
    write_private(path, header(command) + body)


def merge_config(path: Path, values: dict[str, Any], *, command: str) -> Path | None:
    """``values`` set in ``path`` (made if missing), every other key kept. A file with comments a person
    wrote is copied to ``<path>.bak`` first (YAML is rewritten without them): that copy, else None."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        write_config(path, values, command=command)
        return None
    try:
        found = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"config {path}: not valid YAML ({exc}); fix it, or move it aside") from None
    if not isinstance(found, dict):
        raise ConfigError(f"config {path}: the top level must be a mapping of sections")
    backup = None
    if any(line.lstrip().startswith("#") for line in text.splitlines()) and not text.startswith(MARK):
        backup = path.with_name(path.name + ".bak")
        write_private(backup, text)
    write_config(path, _merged(found, values), command=command)
    return backup


def _merged(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    merged = dict(old)
    for key, value in new.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merged(merged[key], value)
        else:
            merged[key] = value
    return merged


def store_secrets(values: Mapping[str, str]) -> Path:
    """``values`` set in the data dir's secrets.env (0600 from the start); its path."""
    path = secrets_target()
    save_secrets(path, values)
    return path


def outranked(source: Path | None) -> str:
    """A note when the configuration in use is not the data dir's file, which then does not count."""
    if source is None:
        return ""
    used = Path(source).resolve()
    if used in (config_target().resolve(), DEFAULT_CONFIG.resolve()):
        return ""
    return (f"note: this pincer reads {used} (--config or PINCER_CONFIG), not {config_target()}: "
            "run it without either to use what was written here")
