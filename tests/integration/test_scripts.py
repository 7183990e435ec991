"""Every Lua script Pincer runs is in the catalogue (bus/scripts.py), and each compiles on a real Redis."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import redis.asyncio as redis

from bus.scripts import CATALOGUE

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("bus", "brain", "hands", "memory", "gateway", "skills")
SKIP = ("__main__",)  # entry points run on import


def import_everything() -> list[str]:
    names = []
    for package in PACKAGES:
        module = importlib.import_module(package)
        for info in pkgutil.walk_packages(module.__path__, f"{package}."):
            if info.name.rpartition(".")[2] not in SKIP:
                importlib.import_module(info.name)
                names.append(info.name)
    return names


def run_scripts() -> list[tuple[str, int, str]]:
    """Each (file, line, constant) whose value is handed to ``register_script``, ``eval`` or ``ScriptCall``."""
    found = []
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                if not isinstance(node, ast.Call) or not node.args:
                    continue
                called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                if called in ("register_script", "eval", "ScriptCall"):
                    first = node.args[0]
                    name = first.id if isinstance(first, ast.Name) else ast.unparse(first)
                    found.append((str(path.relative_to(ROOT)), node.lineno, name))
    return found


def test_every_script_run_is_declared_in_the_catalogue() -> None:
    import_everything()
    sources = set(CATALOGUE.values())
    undeclared = []
    run = run_scripts()
    for file, line, name in run:
        if name in ("script", "self.script"):  # a helper's parameter (ScriptCall's, say): its callers' are checked
            continue
        module = importlib.import_module(file.removesuffix(".py").replace("/", "."))
        if getattr(module, name, None) not in sources:
            undeclared.append(f"{file}:{line} {name}")
    assert not undeclared, f"run without lua(name, source) (bus/scripts.py): {undeclared}"
    assert len(run) >= 30 and len(CATALOGUE) >= 30


async def test_every_catalogued_script_compiles_on_a_real_redis(redis_url: str) -> None:
    import_everything()
    client = redis.Redis.from_url(redis_url)
    try:
        for name, source in sorted(CATALOGUE.items()):
            sha = await client.script_load(source)  # a Lua syntax error is refused here, by name below
            assert (await client.script_exists(sha)) == [True], name
    finally:
        await client.aclose()
