"""W3C trace context across the bus: one chat turn is one trace in every process it touches.

``current`` holds the ``traceparent`` of what this task is doing. The
Gateway starts one per chat request (or continues the client's header); a
consumer sets it from each entry it reads before running the handler; every
entry a task writes carries it as the stream field ``traceparent`` (a reply
carries its request's). With OpenTelemetry on (``bus.otel``) the spans each
process opens become the parents written out; without it the ids still join
the processes' logs and records.
"""

from __future__ import annotations

import os
import re
from contextvars import ContextVar

TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
FIELD = b"traceparent"

current: ContextVar[str | None] = ContextVar("traceparent", default=None)


def start(inbound: str | None = None) -> str:
    """A traceparent for new work: a child of a valid inbound one, else a new trace (sampled)."""
    found = TRACEPARENT.match(inbound.strip().lower()) if inbound else None
    if found and found.group(1) != "0" * 32 and found.group(2) != "0" * 16:
        return f"00-{found.group(1)}-{os.urandom(8).hex()}-{found.group(3)}"
    return f"00-{os.urandom(16).hex()}-{os.urandom(8).hex()}-01"


def from_entry(fields: dict[bytes, bytes]) -> str | None:
    """The traceparent a stream entry carries, if it is well formed (anyone may write the stream)."""
    raw = fields.get(FIELD)
    if raw is None or len(raw) != 55:
        return None
    value = raw.decode("ascii", errors="replace")
    return value if TRACEPARENT.match(value) else None


def trace_id(traceparent: str | None) -> str | None:
    return traceparent[3:35] if traceparent else None
