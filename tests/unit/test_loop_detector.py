"""Loop detection: repeats with the same result, ping-pong, unknown tools; progress is not a loop."""

from __future__ import annotations

from brain.llm import ToolCall
from brain.loop_detector import LoopDetector
from bus.protocol import ErrorCode, ResultMetadata, ToolError, ToolResult


def ok(data: object) -> ToolResult:
    return ToolResult(call_id="c", success=True, data=data, metadata=ResultMetadata(tool_name="t"))


def call(name: str, args: str = "{}") -> ToolCall:
    return ToolCall(id="x", name=name, arguments=args)


def run(detector: LoopDetector, steps: list[tuple[ToolCall, ToolResult]]) -> list[str]:
    marks = []
    for tool_call, result in steps:
        verdict = detector.observe(tool_call, result)
        marks.append("stop" if verdict.stop else "warn" if verdict.warning else ".")
    return marks


def test_same_call_same_result_warns_then_stops() -> None:
    assert run(LoopDetector(), [(call("ls"), ok("same"))] * 5) == [".", ".", "warn", ".", "stop"]


def test_a_poll_that_sees_new_output_is_progress() -> None:
    steps = [(call("process", '{"action": "poll"}'), ok(f"line {n}")) for n in range(8)]
    assert set(run(LoopDetector(), steps)) == {"."}


def test_polling_a_background_process_that_prints_nothing_new_is_a_repeat() -> None:
    poll = call("process", '{"action": "poll", "process_id": "p1"}')
    steps = [(poll, ok({"process_id": "p1", "status": "running", "stdout": "", "runtime_ms": 1000 * n}))
             for n in range(5)]
    assert run(LoopDetector(), steps) == [".", ".", "warn", ".", "stop"]


def test_ping_pong_between_two_calls() -> None:
    a, b = (call("read_file", '{"path": "a"}'), ok("A")), (call("read_file", '{"path": "b"}'), ok("B"))
    marks = run(LoopDetector(warn_at=3, stop_at=4), [a, b, a, b, a, b, a, b])
    assert "warn" in marks and marks[-1] == "stop"


def test_unknown_tools() -> None:
    missing = ToolResult(call_id="c", success=False, metadata=ResultMetadata(tool_name="t"),
                         error=ToolError(code=ErrorCode.TOOL_NOT_FOUND, message="no"))
    marks = run(LoopDetector(), [(call(f"made_up_{n}"), missing) for n in range(5)])
    assert marks == [".", ".", "warn", ".", "stop"]
