"""litellm's bundled price table is read once per model, and not kept: reading it per model call was most of a
Brain's CPU, and keeping all of it ~6 MB for the one or two models a pool names."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from brain.model_table import context_window, table_entries
from brain.spend import table_price


def test_the_table_is_read_once_per_model_and_answers_prices_and_windows(monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[Path] = []
    original = Path.read_text

    def counted(self: Path, *args: object, **kwargs: object) -> str:
        reads.append(self)
        return original(self, *args, **kwargs)  # type: ignore[arg-type]

    table_entries.cache_clear()
    context_window.cache_clear()
    monkeypatch.setattr(Path, "read_text", counted)
    for _ in range(3):
        price = table_price("openai/gpt-4o-mini")
        window = context_window("openai/gpt-4o-mini")
    assert price is not None and price.input_per_mtok > 0 and window >= 100_000
    assert len(reads) == 1 and reads[0].name == "model_prices_and_context_window_backup.json"
    assert table_price("openai/no-such-model-anywhere") is None
    assert len(reads) == 2  # another model: read again, the table was not kept


def test_what_is_kept_is_the_models_entries_not_the_table() -> None:
    """In a fresh interpreter: in this one, other tests' imports of litellm hold its own copy of the table."""
    probe = (
        "import gc, sys\n"
        "from brain.model_table import table_entries\n"
        "entries = table_entries('openai/gpt-4o-mini')\n"
        "assert entries and all('input_cost_per_token' in info for info in entries)\n"
        "gc.collect()\n"
        "print('litellm' in sys.modules, any(isinstance(o, dict) and len(o) > 1000 and 'gpt-4o-mini' in o\n"
        "                                    for o in gc.get_objects()))\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr
    # litellm not imported (its module keeps the whole table), and the only dict of the table's size would be it
    assert done.stdout.split() == ["False", "False"]


def test_a_model_is_found_by_its_name_without_the_providers_prefix() -> None:
    table_entries.cache_clear()
    spec = importlib.util.find_spec("litellm")
    assert spec is not None and spec.submodule_search_locations
    spec_dir = Path(next(iter(spec.submodule_search_locations)))
    table = json.loads((spec_dir / "model_prices_and_context_window_backup.json").read_text())
    assert table_entries("someprovider/gpt-4o-mini") == (table["gpt-4o-mini"],)
