"""Exec approvals through the bus: deny, allowlist, and ask (a stand-in Gateway answers)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bus.protocol import ApprovalDecision, ApprovalRequest, ErrorCode, ToolExecute, ToolResult, now_ms
from bus.replies import ReplyInbox
from bus.streams import Bus
from hands.approvals import remembered
from memory.flight import FlightRecorder, Step
from tests.conftest import identity_tree


@pytest.fixture
async def person(bus: Bus):
    """A stand-in for the person's Gateway: receives approval requests, answers with a scripted decision."""
    inbox = ReplyInbox(bus, "gateway-person", block_ms=100)
    await inbox.start()
    yield inbox
    await inbox.close()


async def ask_and_answer(bus: Bus, call, person: ReplyInbox, command: str, decision: str | None,
                         check_before: Path | None = None, *, sender: str = "alice",
                         by: str = "tester") -> tuple[ToolResult, ApprovalRequest]:
    """Send exec as ``sender``'s chat turn would; answer its approval request with ``decision`` (None: stay
    silent)."""
    message_id = f"turn-{now_ms()}"
    request = ToolExecute(tool="exec", args={"command": command}, session_id=f"{sender}/s", sender=sender,
                          reply_to=call.inbox.stream, deadline=now_ms() + 20_000, approvals_to=person.stream,
                          message_id=message_id)
    async with person.expect(message_id) as asks:
        pending = asyncio.create_task(call.inbox.request(bus.keys.hands_requests, request, request.call_id,
                                                         timeout=20, final=(ToolResult,)))
        asked = await asyncio.wait_for(asks.get(), 10)
        assert isinstance(asked, ApprovalRequest)
        if check_before is not None:
            assert not check_before.exists()  # nothing ran before the answer
        if decision is not None:
            assert await bus.redis.exists(bus.keys.approval(asked.approval_id))
            await bus.publish(asked.reply_to, ApprovalDecision(approval_id=asked.approval_id, decision=decision,
                                                               by=by))
        return await pending, asked


async def test_deny_and_allowlist_modes(engine, call, ws: Path) -> None:
    await engine(workspace=ws, sandbox={"allow_degraded": True}, exec={"mode": "deny"})
    off = await call("exec", {"command": "true"})
    assert off.error.code is ErrorCode.PERMISSION_DENIED and "hands.exec.mode: deny" in off.error.message


async def test_allowlist_mode(engine, call, ws: Path) -> None:
    await engine(workspace=ws, sandbox={"allow_degraded": True},
                 exec={"mode": "allowlist", "allowlist": [{"path": "/usr/bin/echo"}, {"path": "/usr/bin/wc"}]})
    ok = await call("exec", {"command": "echo one two | wc -w"})
    assert ok.success and ok.data["stdout"].strip() == "2"
    refused = await call("exec", {"command": "echo x > made.txt"})
    assert refused.error.code is ErrorCode.PERMISSION_DENIED and "redirections" in refused.error.message
    assert not (ws / "made.txt").exists()
    other = await call("exec", {"argv": ["touch", "made.txt"]})
    assert other.error.code is ErrorCode.PERMISSION_DENIED and "/usr/bin/touch is not on the allowlist" in \
        other.error.message


async def test_ask_mode_runs_only_after_a_yes(engine, call, person: ReplyInbox, bus: Bus, ws: Path) -> None:
    await engine(workspace=ws, sandbox={"allow_degraded": True}, exec={"mode": "ask"})
    result, asked = await ask_and_answer(bus, call, person, "echo yes > approved.txt", "allow-once",
                                         check_before=identity_tree(ws, "alice") / "approved.txt")
    assert "echo yes > approved.txt" in asked.summary and asked.tool == "exec"
    assert result.success and (identity_tree(ws, "alice") / "approved.txt").read_text() == "yes\n"
    assert not await bus.redis.exists(bus.keys.approval(asked.approval_id))  # answered: gone

    denied, _ = await ask_and_answer(bus, call, person, "echo no > denied.txt", "deny")
    assert denied.error.code is ErrorCode.APPROVAL_DENIED and "tester denied" in denied.error.message
    assert not (identity_tree(ws, "alice") / "denied.txt").exists()


async def test_allow_always_remembers_and_silence_is_a_no(engine, call, person: ReplyInbox, bus: Bus,
                                                          ws: Path) -> None:
    await engine(workspace=ws, sandbox={"allow_degraded": True}, exec={"mode": "ask", "approval_timeout_s": 0.5})
    first, _ = await ask_and_answer(bus, call, person, "date", "allow-always")
    assert first.success
    again = await call("exec", {"command": "date"}, sender="alice")  # no one asked this time
    assert again.success
    silent, _ = await ask_and_answer(bus, call, person, "touch silent.txt", None)
    assert silent.error.code is ErrorCode.APPROVAL_DENIED and "within 0.5s" in silent.error.message
    assert not (identity_tree(ws, "alice") / "silent.txt").exists()
    nobody = await call("exec", {"command": "touch nobody.txt"})  # not from a chat: no one to ask
    assert nobody.error.code is ErrorCode.APPROVAL_DENIED and "no chat" in nobody.error.message


async def test_allow_always_widens_only_what_the_deciding_identity_may_run(engine, call, person: ReplyInbox,
                                                                           bus: Bus, ws: Path) -> None:
    await engine(workspace=ws, sandbox={"allow_degraded": True}, exec={"mode": "ask", "approval_timeout_s": 0.5})
    for command in ("date", "echo hi", "ls"):  # several programs of the class, each allowed by alice for alice
        allowed, _ = await ask_and_answer(bus, call, person, command, "allow-always", by="alice")
        assert allowed.success, allowed.error
        assert (await call("exec", {"command": command}, sender="alice")).success
        # bob's sessions are asked again (no one answers: a no), and so is a call from no identity
        for sender in ("bob", "alice2", ""):
            asked, request = await ask_and_answer(bus, call, person, command, None, sender=sender)
            assert asked.error.code is ErrorCode.APPROVAL_DENIED and request.tool == "exec", (command, sender)
        other_agent = await call("exec", {"command": command}, sender="alice", agent="coder")
        assert other_agent.error.code is ErrorCode.APPROVAL_DENIED  # and only on the agent it was allowed for
    rules = await remembered(bus, "main", "alice")
    assert sorted(r.entry.path for r in rules) == sorted({"/usr/bin/date", "/usr/bin/echo", "/usr/bin/ls"})
    assert {(r.covers, r.by) for r in rules} == {("alice", "alice")} and all(r.at > 0 for r in rules)
    assert await remembered(bus, "main", "bob") == [] and await remembered(bus, "main", "") == []


async def test_allow_always_for_a_call_from_no_identity_is_allow_once(engine, call, person: ReplyInbox,
                                                                      bus: Bus, ws: Path) -> None:
    await engine(workspace=ws, sandbox={"allow_degraded": True}, exec={"mode": "ask", "approval_timeout_s": 0.5})
    once, _ = await ask_and_answer(bus, call, person, "date", "allow-always", sender="")
    assert once.success
    again, _ = await ask_and_answer(bus, call, person, "date", None, sender="")
    assert again.error.code is ErrorCode.APPROVAL_DENIED
    assert not [k async for k in bus.redis.scan_iter(match=bus.keys.exec_allowlist("main", "*"))]


async def test_each_decision_is_in_a_kept_flight_record_with_who_decided(engine, call, person: ReplyInbox,
                                                                         bus: Bus, ws: Path) -> None:
    await engine(workspace=ws, sandbox={"allow_degraded": True}, exec={"mode": "ask", "approval_timeout_s": 0.5})
    recorder = FlightRecorder(bus.redis, bus.keys, keep_s=60)
    await recorder.write("alice/s", Step(kind="turn", data={"text": "run things"}))  # the Brain's first step
    await ask_and_answer(bus, call, person, "true", "allow-once", by="alice")
    await ask_and_answer(bus, call, person, "echo no", "deny", by="bob")
    await ask_and_answer(bus, call, person, "echo silent", None)
    decided = [(s.data["decision"], s.data["by"], s.data["summary"].splitlines()[0])
               for s in await recorder.steps("alice/s") if s.kind == "approval"]
    assert decided == [("allow-once", "alice", "true"), ("deny", "bob", "echo no"), ("no answer", "", "echo silent")]
    assert 0 < await bus.redis.ttl(bus.keys.session_record("alice/s")) <= 60  # its expiry is the record's own
    # a session that keeps no record gets none started by Hands
    await ask_and_answer(bus, call, person, "true", "allow-once", sender="carol")
    assert not await bus.redis.exists(bus.keys.session_record("carol/s"))
