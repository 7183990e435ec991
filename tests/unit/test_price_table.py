"""litellm's bundled price table is read once per process: reading it per model call was most of a Brain's CPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from brain.llm import context_window, price_table
from brain.spend import table_price


def test_the_table_is_read_once_and_answers_prices_and_windows(monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[Path] = []
    original = Path.read_text

    def counted(self: Path, *args: object, **kwargs: object) -> str:
        reads.append(self)
        return original(self, *args, **kwargs)  # type: ignore[arg-type]

    price_table.cache_clear()
    monkeypatch.setattr(Path, "read_text", counted)
    for _ in range(3):
        price = table_price("openai/gpt-4o-mini")
        window = context_window("openai/gpt-4o-mini")
    assert price is not None and price.input_per_mtok > 0 and window >= 100_000
    assert len(reads) == 1 and reads[0].name == "model_prices_and_context_window_backup.json"
