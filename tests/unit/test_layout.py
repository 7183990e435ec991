"""The layout's import rule, kept true: each package and each room of the front door imports only what sits
below it (docs/code.md has the map)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import ROOT

OURS = ("bus", "memory", "hands", "brain", "gateway", "localmodel")
# What each place may import of ours, by the longest prefix of its module name.
ALLOWED = {
    "bus": {"bus"},
    "memory": {"bus", "memory"},
    "hands": {"bus", "memory", "hands"},
    "brain": {"bus", "memory", "brain"},
    "localmodel": {"bus", "localmodel"},
    "gateway": {"bus", "memory", "gateway.config", "gateway.tokens"},  # what every room shares
    # The turn core both doors share: nothing of either door, nothing of HTTP.
    "gateway.turns": {"bus", "memory", "gateway.config", "gateway.tokens", "gateway.turns"},
    # The server reads and writes the channels' pairing through the kit's own store, and names the channels.
    "gateway.server": {"bus", "memory", "gateway.config", "gateway.tokens", "gateway.turns", "gateway.server",
                       "gateway.channels.access", "gateway.channels.config"},
    "gateway.channels": {"bus", "memory", "gateway.config", "gateway.tokens", "gateway.turns", "gateway.channels"},
    # The process runtime starts the other roles, so it may read their settings.
    "gateway.runtime": {"bus", "memory", "gateway.config", "gateway.tokens", "gateway.runtime", "brain", "hands",
                        "localmodel", "gateway.channels.config"},
    "gateway.cli": {*OURS},  # the top room: it dispatches to all of them
}


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _place(module: str) -> str:
    return max((p for p in ALLOWED if module == p or module.startswith(p + ".")), key=len)


def _imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] if node.module != "gateway" else [f"gateway.{a.name}" for a in node.names]
            found += [(node.lineno, n) for n in names]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
    return [(line, name) for line, name in found if name.split(".")[0] in OURS]


def test_no_package_or_room_imports_one_above_it() -> None:
    crossing = []
    for package in OURS:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.name == "__main__.py":  # a role's entry point starts what it names
                continue
            module = _module(path)
            allowed = ALLOWED[_place(module)]
            for line, name in _imports(path):
                if not any(name == a or name.startswith(a + ".") for a in allowed):
                    crossing.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    assert not crossing, "\n".join(crossing)


def test_the_turn_core_speaks_no_http() -> None:
    """A chat channel loads the core without a web framework, and a refusal there is a code, not a status."""
    web = ("starlette", "uvicorn", "httpx")
    found = []
    for path in sorted((ROOT / "gateway" / "turns").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
                [a.name for a in node.names] if isinstance(node, ast.Import) else []
            found += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] in web]
    assert not found, found


def test_outside_the_bus_redis_away_has_one_name() -> None:
    """Redis not answering is ``RedisAway`` everywhere but the bus's edge: no module above it catches the
    connection tuple (it holds OSError: a file's error would read as Redis away) or imports redis-py's errors."""
    found = []
    for package in OURS:
        if package == "bus":
            continue
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                name = node.id if isinstance(node, ast.Name) else node.name if isinstance(node, ast.alias) else ""
                if name == "CONNECTION_ERRORS":
                    found.append(f"{path.relative_to(ROOT)}: CONNECTION_ERRORS")
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("redis.exceptions"):
                    found.append(f"{path.relative_to(ROOT)}: imports {node.module}")
    assert not found, found


def test_every_exception_of_ours_is_a_pincer_error() -> None:
    """One root (bus.errors.PincerError): a class that subclasses a builtin exception descends from it too."""
    builtin = {"Exception", "ValueError", "RuntimeError", "KeyError", "TypeError", "LookupError", "OSError"}
    classes: dict[str, tuple[str, set[str]]] = {}  # name -> (where, base names)
    for package in OURS:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef):
                    bases = {b.id for b in node.bases if isinstance(b, ast.Name)}
                    classes[node.name] = (str(path.relative_to(ROOT)), bases)
    ours = {"PincerError"}
    while grown := {name for name, (_, bases) in classes.items() if bases & ours} - ours:
        ours |= grown
    found = [f"{where}: {name}" for name, (where, bases) in classes.items()
             if bases & builtin and name not in ours]
    assert not found, found


def test_the_rule_sees_a_crossing(tmp_path: Path) -> None:
    """The check itself: a Hands module importing the Brain is found."""
    bad = tmp_path / "bad.py"
    bad.write_text("from brain.worker import BrainWorker\nimport bus.keys\n")
    assert [name for _, name in _imports(bad)] == ["brain.worker", "bus.keys"]
    assert not any(n.startswith(a) for n in ["brain.worker"] for a in ALLOWED[_place("hands.tools")])


def test_every_command_the_parser_knows_has_a_runner_and_no_runner_is_orphaned() -> None:
    import argparse

    from gateway.cli import COMMANDS, _parser, runner

    subparsers = next(a for a in _parser(None)._actions if isinstance(a, argparse._SubParsersAction))
    assert set(subparsers.choices) == set(COMMANDS)
    for command in COMMANDS:
        assert callable(runner(command)), command
