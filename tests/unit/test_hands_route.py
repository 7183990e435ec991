"""Hands' routing rule, without a worker: where a call read from each stream goes (run, refuse, park, give
back), decided from the stream, the delivery count, the call's wait and this worker's room."""

from __future__ import annotations

import pytest

from bus.protocol import ErrorCode, ToolExecute, now_ms
from bus.streams import Bus
from hands.config import ConcurrencySettings, QueueSettings
from hands.lanes import Entry, GiveBack, Lanes, Park, Run, Ungated, Unrun
from hands.limits import Limiter
from hands.registry import Category, ToolDefinition, ToolRegistry
from tests.fakes import fake_bus

LANE = "u:hands:lane:tool:slow"  # a lane stream this worker reads


@pytest.fixture
def lanes() -> Lanes:
    bus: Bus = fake_bus()
    queue = QueueSettings(wait_s=30)
    registry = ToolRegistry()
    registry.register(ToolDefinition(name="slow", description="slow", handler=print, parameters={"type": "object"},
                                     category=Category.SKILL, max_concurrency=1))
    found = Lanes(bus, queue, Limiter(ConcurrencySettings(), queue), registry, worker_id="w1", freed=lambda: None)
    gates = found.gates("slow")
    assert gates is not None
    found.streams[LANE] = gates
    return found


def read(waited_s: float = 0.0) -> tuple[ToolExecute, Entry]:
    call = ToolExecute(tool="slow", reply_to="u:brain:replies:b1", deadline=now_ms() + 60_000)
    entry_id = f"{now_ms() - int(waited_s * 1000)}-0"
    return call, ("", entry_id, {})


def test_a_call_with_room_runs_and_one_without_parks_from_the_entrance_or_goes_back_to_its_lane(
        lanes: Lanes) -> None:
    call, entry = read()
    requests = lanes.bus.keys.hands_requests
    routed = lanes.route(call, requests, entry, delivery=1)
    assert isinstance(routed, Run)
    lanes.take(routed.gates)  # the one place of the tool taken
    assert isinstance(lanes.route(call, requests, entry, delivery=1), Park)
    assert isinstance(lanes.route(call, LANE, entry, delivery=1), GiveBack)
    lanes.release(routed.gates)
    assert isinstance(lanes.route(call, LANE, entry, delivery=1), Run)


def test_a_call_taken_over_or_handed_here_runs_even_without_room_and_is_never_late(lanes: Lanes) -> None:
    call, entry = read(waited_s=120)  # long past hands.queue.wait_s
    gates = lanes.gates("slow")
    assert gates is not None
    lanes.take(gates)
    own = lanes.bus.keys.hands_worker("w1")
    assert isinstance(lanes.route(call, own, entry, delivery=1), Run)  # handed to this worker
    assert isinstance(lanes.route(call, LANE, entry, delivery=2), Run)  # a dead worker's, taken over
    assert isinstance(lanes.route(call, lanes.bus.keys.hands_requests, entry, delivery=3), Park)  # no room yet


def test_a_call_that_waited_too_long_is_refused_unrun_and_a_tool_this_worker_lacks_skips_the_lanes(
        lanes: Lanes) -> None:
    call, entry = read(waited_s=31)
    routed = lanes.route(call, lanes.bus.keys.hands_requests, entry, delivery=1)
    assert isinstance(routed, Unrun) and routed.failure.code == ErrorCode.QUEUE_TIMEOUT
    assert "hands.queue.wait_s" in routed.failure.message
    other = call.model_copy(update={"tool": "not_here"})
    assert isinstance(lanes.route(other, lanes.bus.keys.hands_requests, entry, delivery=1), Ungated)
