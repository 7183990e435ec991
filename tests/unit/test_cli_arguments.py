"""Each `pincer` command's arguments are declared by its own module, read only when it runs."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from gateway.cli import COMMANDS, _command, _parser


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_each_command_declares_its_arguments_beside_the_function_that_runs_it(command: str) -> None:
    module_name, _, function = COMMANDS[command][0].partition(":")
    module = importlib.import_module(f"gateway.cli.{module_name}")
    assert callable(getattr(module, function)) and command in module.ARGUMENTS
    parser = _parser(command)
    with pytest.raises(SystemExit) as help_shown:
        parser.parse_args([command, "--help"])
    assert help_shown.value.code == 0


def test_the_command_is_the_first_word_not_an_option() -> None:
    assert _command(["--config", "chat", "status", "--json"]) == "status"  # --config's value is not one
    assert _command(["cron", "add", "x"]) == "cron"
    assert _command(["--help"]) is None and _command(["nope"]) is None


def test_a_client_command_loads_neither_the_engine_nor_the_channels() -> None:
    code = ("import sys; from gateway.cli import _command, _parser; _parser(_command(['chat', '-m', 'hi']))"
            ".parse_args(['chat', '-m', 'hi']); "
            "print(sorted(m for m in sys.modules if m.startswith(('hands', 'brain', 'gateway.channels'))))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]", loaded


def test_version_is_the_release_this_code_is(capsys: pytest.CaptureFixture[str]) -> None:
    import tomllib
    from pathlib import Path

    from bus.release import VERSION
    from gateway.cli import main

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"pincer {VERSION}"
    # a built wheel's metadata takes the same one
    project = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "bus.release.VERSION"}
