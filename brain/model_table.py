"""What litellm's bundled table says of a model (its input window, its price entries), read from the table's
JSON file: never fetched, and without importing litellm, which a Brain whose models all take the direct road
never loads (~150 MB resident)."""

from __future__ import annotations

import functools
import importlib.util
import json
from pathlib import Path
from typing import Any

DEFAULT_WINDOW_TOKENS = 32_000


@functools.cache
def context_window(model: str) -> int:
    """The model's input window by litellm's table; 32k tokens for a model it does not know."""
    for info in table_entries(model) if model else ():
        if info.get("max_input_tokens") or info.get("max_tokens"):
            return int(info.get("max_input_tokens") or info["max_tokens"])
    return DEFAULT_WINDOW_TOKENS


# Parsing the file takes 30 ms of CPU (per model call it was most of a Brain's work), and keeping the whole
# table ~6 MB for the one or two models a pool names: each model's entries are kept, the table is not.
@functools.lru_cache(maxsize=256)
def table_entries(model: str) -> tuple[dict[str, Any], ...]:
    """litellm's bundled table's entries for ``model``: by its full name, then without the provider's prefix
    (read from the file, never fetched; none where litellm is not installed or the file is unreadable)."""
    spec = importlib.util.find_spec("litellm")
    if spec is None or not spec.submodule_search_locations:
        return ()
    path = Path(next(iter(spec.submodule_search_locations))) / "model_prices_and_context_window_backup.json"
    try:
        table = json.loads(path.read_text())
    except (OSError, ValueError):
        return ()
    if not isinstance(table, dict):
        return ()
    found = (table.get(name) for name in (model, model.partition("/")[2]) if name)
    return tuple(info for info in found if isinstance(info, dict))
