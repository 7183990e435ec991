"""The order of one model response's tool calls: in parallel, unless a tool declares it comes after another.

A tool's ``after`` (from Hands, in its ToolSpec metadata) lists tool names or
``category:<name>``; a call of such a tool waits for the calls of those tools in
the same response and is sent their results. Hands refuses cyclic declarations
when tools register; a cycle can still reach us from workers running different
tool versions, so its calls are refused here rather than left waiting for ever.
"""

from __future__ import annotations

import graphlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from brain.llm import ToolCall
from bus.protocol import ToolSpec


@dataclass
class Plan:
    waits: list[set[int]]  # per call (by index in the response): the calls it runs after
    refused: dict[int, str]  # calls in a dependency cycle, with why

    @property
    def sequential(self) -> bool:
        return any(self.waits)


def plan(calls: Sequence[ToolCall], specs: Mapping[str, ToolSpec]) -> Plan:
    graph: dict[int, set[int]] = {index: set() for index in range(len(calls))}
    for index, call in enumerate(calls):
        spec = specs.get(call.name)
        wanted = set(spec.meta.after) if spec else set()
        if not wanted:
            continue
        for other_index, other in enumerate(calls):
            other_spec = specs.get(other.name)
            category = f"category:{other_spec.meta.category}" if other_spec else ""
            if other.name != call.name and (other.name in wanted or category in wanted):
                graph[index].add(other_index)
    refused: dict[int, str] = {}
    while True:
        try:
            graphlib.TopologicalSorter(graph).prepare()
            break
        except graphlib.CycleError as exc:
            cycle: list[int] = exc.args[1]
            names = " → ".join(calls[index].name for index in cycle)
            for index in cycle:
                refused[index] = (f"the tools' declared order forms a cycle ({names}), so none of them can go "
                                  "first; ask for these calls in separate responses, one at a time")
                graph[index] = set()  # a refused call waits for nothing, so the cycle is broken
    return Plan(waits=[graph[index] for index in range(len(calls))], refused=refused)
