"""The wire: every message survives a round trip; everything else is refused with a reason."""

from __future__ import annotations

import msgpack
import pytest

from bus.codec import MESSAGE_TYPES, MalformedMessage, decode, encode
from bus.protocol import (
    ApprovalDecision,
    ApprovalRequest,
    ChannelFile,
    ChannelSend,
    ChannelUpdate,
    ChatCancel,
    ChatDelta,
    ChatError,
    ChatMessage,
    ChatReply,
    ChatTool,
    ErrorCode,
    Question,
    QuestionAnswer,
    QuestionRequest,
    ResultMetadata,
    ToolCancel,
    ToolError,
    ToolExecute,
    ToolProgress,
    ToolResult,
    ToolsAvailable,
    ToolsList,
    ToolSpec,
)

SAMPLES = [
    ToolsList(reply_to="p:reply:b1", session_id="s1", deadline=123),
    ToolsAvailable(request_id="r1", tools=[ToolSpec(name="read_file", description="d",
                                                    parameters={"type": "object"}, metadata={"category": "file"})],
                   digest="abc", worker_id="w1"),
    ToolExecute(tool="read_file", args={"path": "a.txt", "nested": {"n": [1, 2.5, None, True]}},
                session_id="s1", reply_to="p:reply:b1", deadline=1_700_000_000_000),
    ToolResult(call_id="c1", success=True, data={"content": "hi ✓"}, metadata=ResultMetadata(tool_name="read_file")),
    ToolResult(call_id="c2", success=False,
               error=ToolError(code=ErrorCode.FILE_NOT_FOUND, message="nope", recoverable=True, suggestions=["ls"]),
               metadata=ResultMetadata(tool_name="read_file", truncated=True, worker_id="w", attempts=2)),
    ToolProgress(call_id="c1", status="output", message="line", elapsed_ms=5),
    ChatMessage(session_id="s1", text="hello", reply_to="p:reply:g1"),
    ChatCancel(session_id="s1", by="me"),
    ToolCancel(call_id="c1", reason="stop"),
    ChatDelta(session_id="s1", message_id="m1", text="he"),
    ChatTool(session_id="s1", message_id="m1", call_id="c1", tool="read_file", status="started", summary="x"),
    ChatReply(session_id="s1", message_id="m1", text="done", model="m", usage={"total_tokens": 3}),
    ChatError(session_id="s1", message_id="m1", code=ErrorCode.MODEL_ERROR, message="boom"),
    ApprovalRequest(call_id="c1", session_id="s1", tool="exec", summary="rm", expires_at=1, reply_to="p:reply:g"),
    ApprovalDecision(approval_id="a1", decision="allow-once", by="me"),
    QuestionRequest(call_id="c1", session_id="s1", message_id="m1", expires_at=1, reply_to="p:reply:h",
                    questions=[Question(text="Which colour?", choices=["red", "blue"]), Question(text="Why?")]),
    QuestionAnswer(question_id="q1", answers=["red", "I like it"], by="alice"),
    ChannelUpdate(channel="telegram", event_id="5001", user="111", username="alice", chat="-5001", group=True,
                  text="hi", mentioned=True, files=[ChannelFile(ref="f1", name="a.txt", size=3)], platform_message="7"),
    ChannelSend(channel="telegram", chat="111", text="the job's answer", key="turn1:telegram:111"),
]


def test_samples_cover_every_message_type() -> None:
    assert {m.type for m in SAMPLES} == MESSAGE_TYPES


@pytest.mark.parametrize("message", SAMPLES, ids=lambda m: m.type)
def test_round_trip(message) -> None:
    fields = encode(message)
    assert fields[b"type"] == message.type.encode()
    assert len(fields[b"id"]) == 32
    assert decode(fields) == message


def test_reply_to_is_copied_to_the_envelope() -> None:
    fields = encode(ChatMessage(session_id="s", text="t", reply_to="p:reply:x"))
    assert fields[b"reply_to"] == b"p:reply:x"
    assert b"reply_to" not in encode(ChatCancel(session_id="s"))


def _entry(kind: bytes, data: object) -> dict[bytes, bytes]:
    return {b"type": kind, b"id": b"x", b"data": msgpack.packb(data)}


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({b"id": b"x", b"data": b""}, "no 'type' field"),
        ({b"type": b"tool:execute", b"id": b"x"}, "no 'data' field"),
        ({b"type": b"\xff\xfe", b"data": b""}, "not UTF-8"),
        (_entry(b"tool:explode", {}), "unknown message type 'tool:explode'"),
        ({b"type": b"tool:execute", b"data": b"\xc1garbage"}, "not msgpack"),
        (_entry(b"tool:execute", [1, 2]), "must be a map"),
        (_entry(b"tool:execute", {"tool": "x", "reply_to": "r"}), "deadline: Field required"),
        (_entry(b"tool:execute", {"tool": "x", "reply_to": "r", "deadline": "soon"}), "deadline"),
        (_entry(b"tool:result", {"call_id": "c", "success": False, "metadata": {"tool_name": "t"},
                                 "error": {"code": 7, "message": "m"}}), "error.code"),
    ],
)
def test_malformed_entries_are_refused_with_a_reason(fields, reason) -> None:
    with pytest.raises(MalformedMessage) as info:
        decode(fields)
    assert reason in str(info.value)


def test_error_codes_are_the_seeds_and_retryable_ones_are_marked() -> None:
    from bus.protocol import RETRYABLE

    seeds = {"TOOL_NOT_FOUND", "INVALID_ARGUMENTS", "PERMISSION_DENIED", "FILE_NOT_FOUND", "TIMEOUT", "NETWORK_ERROR",
             "RATE_LIMITED", "SERVICE_UNAVAILABLE", "RESOURCE_EXHAUSTED", "QUEUE_FULL", "QUEUE_TIMEOUT",
             "RETRY_EXHAUSTED", "ALL_FAILED", "WORKER_LOST", "APPROVAL_DENIED", "CANCELLED", "UNHANDLED"}
    assert seeds <= {c.value for c in ErrorCode}
    assert {c.value for c in RETRYABLE} == {"TIMEOUT", "NETWORK_ERROR", "RATE_LIMITED", "SERVICE_UNAVAILABLE"}


@pytest.mark.parametrize(("data", "reason"), [
    (msgpack.packb([[]] * 2_000_000), "exceeds max_array_len"),  # 2 MB on the bus, ~130 MB as lists
    (msgpack.packb({str(i): 0 for i in range(200_000)}), "exceeds max_map_len"),
    (b"\x91" * 5000 + b"\x90", "not msgpack"),  # nesting past the unpacker's stack
    (b"\xc4\x00" + b"\0" * (17 * 2**20), "the most an entry may carry"),
])
def test_entries_that_would_decode_to_too_much_are_malformed(data: bytes, reason: str) -> None:
    with pytest.raises(MalformedMessage, match=reason):
        decode({b"type": b"tool:execute", b"id": b"x", b"data": data})


def test_shared_records_round_trip_through_their_one_encoding() -> None:
    from bus.records import DeadLetter, PendingApproval

    original = {b"type": b"tool:execute", b"id": b"x", b"data": b"\x80"}
    letter = DeadLetter.of(source="pincer:hands:requests", group="hands", entry="1-0", reason="why", fields=original)
    again = DeadLetter.of(source="pincer:dead", group="ops", entry="2-0", reason="again", fields=letter.encode())
    assert DeadLetter.decode(letter.encode()) == letter and again.original == original  # never nested
    pending = PendingApproval(reply_to="r", session_id="s", tool="exec", summary="ls", expires_at=5)
    raw = {k.encode(): v.encode() for k, v in pending.encode().items()}
    assert PendingApproval.decode(raw) == pending
    assert PendingApproval.decode({}) is None and PendingApproval.decode({b"reply_to": b"r"}) is None


def test_every_exception_in_the_drawing_is_a_pincer_error() -> None:
    import importlib
    import re

    import bus.errors

    drawn = re.findall(r"[├└]── (\w+)\s+([\w.]+)", bus.errors.__doc__ or "")
    drawn += re.findall(r"│   \((\w+)\s+([\w.]+)", bus.errors.__doc__ or "")  # a subclass, drawn inside
    assert len(drawn) == 35
    for name, module in drawn:
        found = getattr(importlib.import_module(module if module != "hands.sandbox" else "hands.sandbox.runner"), name)
        assert issubclass(found, bus.errors.PincerError), name


def test_tool_metadata_has_one_typed_home_for_both_sides() -> None:
    from bus.protocol import ToolMeta, ToolSpec
    from hands.registry import Category, ToolDefinition

    tool = ToolDefinition(name="t", description="d", parameters={"type": "object"}, handler=lambda a, c: None,
                          category=Category.CODE, after=("category:file_operation",), timeout_s=7, idempotent=False)
    spec = tool.spec()
    assert spec.metadata == {"category": "code_execution", "idempotent": False, "after": ["category:file_operation"],
                             "timeout_s": 7.0}  # the wire as it was
    assert spec.meta == ToolMeta(category="code_execution", idempotent=False, after=("category:file_operation",),
                                 timeout_s=7)
    newer = ToolSpec(name="n", description="", parameters={}, metadata={"category": "skill", "cost": "high"})
    assert newer.meta.category == "skill" and newer.meta.model_extra == {"cost": "high"}
    broken = ToolSpec(name="b", description="", parameters={}, metadata={"after": 5})
    assert broken.meta == ToolMeta()  # a malformed value reads as the default, not a crash


def test_a_newer_releases_fields_and_error_codes_still_read() -> None:
    """The compatibility rule (docs/upgrades.md): an unknown field is dropped, an unknown code is UNHANDLED."""
    execute = decode(_entry(b"tool:execute", {"tool": "x", "reply_to": "r", "deadline": 1, "priority": "high"}))
    assert execute.tool == "x" and "priority" not in execute.model_dump()
    result = decode(_entry(b"tool:result", {"call_id": "c", "success": False, "metadata": {"tool_name": "t", "gpu": 1},
                                            "error": {"code": "QUOTA_GONE", "message": "over quota", "hint": "h"}}))
    assert result.error is not None
    assert (result.error.code, result.error.message) == (ErrorCode.UNHANDLED, "over quota")
