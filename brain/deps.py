"""What a turn is given: the Brain's services, shared by every turn it runs."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from brain.catalog import ToolCatalog
from brain.config import BrainSettings
from brain.llm import LLMClient
from brain.spend import Governor
from bus.metrics import Meter
from bus.replies import ReplyInbox
from bus.streams import Bus
from memory.flight import FlightRecorder
from memory.longterm import LongTermMemory
from memory.sessions import SessionStore


@dataclass
class TurnDeps:
    bus: Bus
    inbox: ReplyInbox
    sessions: SessionStore
    memory: LongTermMemory
    catalog: ToolCatalog
    settings: BrainSettings
    llm: LLMClient | None  # None: no model configured
    meter: Meter = field(default_factory=Meter)  # what /metrics shows of this Brain (sent with its heartbeat)
    spend: Governor | None = None  # the pool's spend governor (None: nothing counted, only in unit tests)
    recorder: FlightRecorder | None = None  # the flight record (None: brain.record.enabled is off)
    # The consumer's slot: a turn waiting on its sub-agents lends it out (they may need it) and takes it back.
    set_aside: Callable[[], bool] = lambda: False
    take_back: Callable[[], Awaitable[None]] = field(default=lambda: _nothing())
    pause_at: str = ""  # a test seam (brain/pause.py): the point of a turn where this Brain stops for good



async def _nothing() -> None:
    return None
