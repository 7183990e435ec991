"""Loop detection: notice a model going round in circles, warn it once, then end the turn.

Detectors (each counts over the turn's tool calls):
- **repeat**: the same tool with the same arguments and the same result; a
  call whose result changes (a poll that sees new output) is progress. Clock
  fields (``runtime_ms``, ``elapsed_ms``, ...) do not count as a change, so
  polling a background process that prints nothing new is a repeat.
- **ping-pong**: two calls alternating (A, B, A, B, ...) with unchanged results.
- **unknown tool**: calls to tools that do not exist.
At ``warn_at`` the model is told, in the tool result it reads; at ``stop_at``
the turn ends with ``LOOP_DETECTED`` and the reason.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import dataclass, field

from brain.llm import ToolCall
from bus.protocol import ErrorCode, ToolResult

CLOCK_FIELDS = frozenset({"runtime_ms", "elapsed_ms", "duration_ms", "timestamp", "now"})


@dataclass
class Verdict:
    warning: str | None = None
    stop: str | None = None


@dataclass
class LoopDetector:
    warn_at: int = 3
    stop_at: int = 5
    history: list[str] = field(default_factory=list)  # one fingerprint per call: tool, arguments, result
    repeats: Counter[str] = field(default_factory=Counter)
    unknown: int = 0
    warned: set[str] = field(default_factory=set)

    def observe(self, call: ToolCall, result: ToolResult) -> Verdict:
        if result.error is not None and result.error.code is ErrorCode.TOOL_NOT_FOUND:
            self.unknown += 1
            return self._judge("unknown", self.unknown, f"called tools that do not exist {self.unknown} times "
                               "(use only the tools you were given)")
        data = result.data
        if isinstance(data, dict):
            data = {key: value for key, value in data.items() if key not in CLOCK_FIELDS}
        outcome = json.dumps([result.success, data, result.error and result.error.model_dump(mode="json")],
                             sort_keys=True, default=str)
        fingerprint = hashlib.sha256(f"{call.name}\0{call.arguments}\0{outcome}".encode()).hexdigest()[:16]
        self.history.append(fingerprint)
        self.repeats[fingerprint] += 1
        verdict = self._judge(f"repeat:{fingerprint}", self.repeats[fingerprint],
                              f"called {call.name} with the same arguments {self.repeats[fingerprint]} times and "
                              "got the same result each time")
        if verdict.warning or verdict.stop:
            return verdict
        return self._judge("ping-pong", self._alternations(),
                           "alternated between the same two calls without any new result")

    def _alternations(self) -> int:
        """How many of the latest calls form an A, B, A, B, ... run (A != B)."""
        run = self.history[-1:]
        for fingerprint in reversed(self.history[:-1]):
            expected = run[-2] if len(run) >= 2 else None
            if fingerprint == run[-1] or (expected is not None and fingerprint != expected):
                break
            run.append(fingerprint)
        return len(run) // 2 if len(run) >= 4 else 0

    def _judge(self, key: str, count: int, what: str) -> Verdict:
        if count >= self.stop_at:
            return Verdict(stop=f"the model {what}; ending the turn (brain.loop_stop_at = {self.stop_at})")
        if count >= self.warn_at and key not in self.warned:
            self.warned.add(key)
            return Verdict(warning=f"[Pincer: you have {what}. Doing it again will not help: change your approach, "
                                   "or answer the user with what you know.]")
        return Verdict()
