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

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

CATALOGUE: dict[str, str] = {}  # name -> source, every script declared by a module imported so far


def lua(name: str, source: str) -> str:
    """``source``, recorded in the catalogue as ``name`` (``module.what``: ``lease.take``)."""
    known = CATALOGUE.setdefault(name, source)
    if known != source:
        raise ValueError(f"two different Lua scripts are both named {name!r}: name each after its module")
    return source


@dataclass(frozen=True)
class ScriptCall:
    """A declared script with its keys and arguments, to run in a pipeline (EVAL), alone or after a gate
    (``gated``); ``read`` turns its result into the caller's value."""

    script: str
    keys: tuple[str, ...]
    args: tuple[Any, ...]
    read: Callable[[Any], Any] = lambda result: result

    def add(self, pipe: Any) -> None:
        """Queue it in ``pipe`` (a batcher's build): by EVAL, as EVALSHA in a pipeline would first ask
        SCRIPT EXISTS, a round trip."""
        pipe.eval(self.script, len(self.keys), *self.keys, *self.args)


def gated(gate: ScriptCall, then: ScriptCall) -> ScriptCall:
    """One script run: ``gate`` first, then ``then`` only when the gate returned 0, in one step (nothing
    between them). Its result reads as ``(gate's result, then's result or None)``. Each keeps its own text,
    keys and arguments; the pair is declared in the catalogue under both names."""
    script = _gated_script(gate.script, then.script)
    read_gate, read_then = gate.read, then.read

    def read(result: list[Any]) -> tuple[Any, Any]:
        return read_gate(result[0]), (read_then(result[1]) if len(result) > 1 else None)

    return ScriptCall(script, gate.keys + then.keys, (len(gate.keys), len(gate.args), *gate.args, *then.args),
                      read)


@functools.cache
def _gated_script(gate: str, then: str) -> str:
    names = {source: name for name, source in CATALOGUE.items()}
    # Each body becomes a function whose parameters shadow KEYS and ARGV, so it reads its own share.
    return lua(f"{names[gate]} then {names[then]}", f"""
local function gate(KEYS, ARGV)
{gate}
end
local function after(KEYS, ARGV)
{then}
end
local gate_keys, gate_args = tonumber(ARGV[1]), tonumber(ARGV[2])
local gk, ga, tk, ta = {{}}, {{}}, {{}}, {{}}
for i = 1, #KEYS do if i <= gate_keys then gk[#gk + 1] = KEYS[i] else tk[#tk + 1] = KEYS[i] end end
for i = 3, #ARGV do if i - 2 <= gate_args then ga[#ga + 1] = ARGV[i] else ta[#ta + 1] = ARGV[i] end end
local said = gate(gk, ga)
if said ~= 0 then return {{said}} end
return {{said, after(tk, ta)}}
""")
