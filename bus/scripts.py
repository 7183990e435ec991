"""The catalogue of every Lua script Pincer runs on Redis.

A script stays beside the code that calls it (its keys and arguments are read there), declared with
``lua(name, source)``, which records it here. The catalogue is what makes the rules checkable in
one place: a test loads every script into a real Redis (each compiles), and finds any script run
without being declared. Each is run with ``register_script`` (EVALSHA, loaded on first use per
server) or, inside a pipeline that must not wait for a load, by EVAL; every key it touches is
passed in ``KEYS`` from ``bus/keys.py``, or, for a lane's per-session queues that only the
script can name, built from a key passed in ``KEYS`` under the same hash tag.
"""

from __future__ import annotations

CATALOGUE: dict[str, str] = {}  # name -> source, every script declared by a module imported so far


def lua(name: str, source: str) -> str:
    """``source``, recorded in the catalogue as ``name`` (``module.what``: ``lease.take``)."""
    known = CATALOGUE.setdefault(name, source)
    if known != source:
        raise ValueError(f"two different Lua scripts are both named {name!r}: name each after its module")
    return source
