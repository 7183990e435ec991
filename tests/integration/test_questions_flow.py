"""ask_user through the bus and a real Redis: a Hands worker asks, the Gateway's TurnRunner takes the answers
(only from the session's own person), and the flight record keeps each question with its answers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bus.protocol import ErrorCode, QuestionRequest, ToolExecute, ToolResult, now_ms
from bus.replies import ReplyInbox
from bus.streams import Bus
from gateway.config import GatewaySettings
from gateway.tokens import Identity
from gateway.turns.limits import CallerLimits
from gateway.turns.refusal import Refused
from gateway.turns.runner import TurnRunner
from memory.flight import FlightRecorder, Step
from memory.sessions import SessionStore

ALICE, BOB, OPERATOR = Identity(name="alice"), Identity(name="bob"), Identity(name="root", scope="operator")
QUESTIONS = [{"text": "Which colour?", "choices": ["red", "blue"]}, {"text": "Why?"}]


@pytest.fixture
async def gateway(bus: Bus) -> AsyncIterator[TurnRunner]:
    """The Gateway's side: its inbox (where questions arrive) and its TurnRunner (which takes answers)."""
    inbox = ReplyInbox(bus, "gateway-person", block_ms=100)
    await inbox.start()
    sessions = SessionStore(bus.redis, bus.keys)
    await sessions.claim_and_number("alice/s", "alice", owner="alice")
    settings = GatewaySettings()
    runner = TurnRunner(bus, inbox, sessions, CallerLimits(bus, settings.limits), settings)
    yield runner
    await runner.close()
    await inbox.close()


async def asked(bus: Bus, call, gateway: TurnRunner, questions=QUESTIONS,
                deadline_s: float = 20) -> tuple[asyncio.Task[ToolResult], QuestionRequest]:
    """Send ask_user as alice's chat turn would; the question as her Gateway receives it."""
    message_id = f"turn-{now_ms()}"
    request = ToolExecute(tool="ask_user", args={"questions": questions}, session_id="alice/s", sender="alice",
                          reply_to=call.inbox.stream, deadline=now_ms() + int(deadline_s * 1000),
                          approvals_to=gateway.inbox.stream, message_id=message_id)
    async with gateway.inbox.expect(message_id) as events:
        pending = asyncio.create_task(call.inbox.request(bus.keys.hands_requests, request, request.call_id,
                                                         timeout=deadline_s + 1, final=(ToolResult,)))
        question = await asyncio.wait_for(events.get(), 10)
    assert isinstance(question, QuestionRequest)
    return pending, question


async def test_the_owner_answers_one_question_at_a_time_and_the_model_gets_both(engine, call, bus: Bus,
                                                                                gateway: TurnRunner) -> None:
    await engine()
    pending, question = await asked(bus, call, gateway)
    assert [q.text for q in question.questions] == ["Which colour?", "Why?"]
    assert question.questions[0].choices == ["red", "blue"] and await bus.redis.exists(
        bus.keys.question(question.question_id))
    first = await gateway.answer_question(ALICE, question.question_id, ["blue", None])  # a button, in a chat
    assert first["complete"] is False and not pending.done()
    done = await gateway.answer_question(ALICE, question.question_id, [None, "it is calm"])  # her next message
    assert done == {"question_id": question.question_id, "answers": ["blue", "it is calm"], "complete": True,
                    "by": "alice"}
    result = await asyncio.wait_for(pending, 10)
    assert result.success and result.data == {"answers": ["blue", "it is calm"], "by": "alice"}
    assert not await bus.redis.exists(bus.keys.question(question.question_id))  # answered: gone
    with pytest.raises(Refused) as again:
        await gateway.answer_question(ALICE, question.question_id, ["red", "x"])
    assert again.value.code is ErrorCode.NOT_FOUND


async def test_another_persons_answer_is_refused_as_if_there_were_no_question(engine, call, bus: Bus,
                                                                             gateway: TurnRunner) -> None:
    await engine()
    pending, question = await asked(bus, call, gateway, questions=[{"text": "Deploy?", "choices": ["yes", "no"]}])
    with pytest.raises(Refused) as refused:
        await gateway.answer_question(BOB, question.question_id, ["yes"])
    assert refused.value.code is ErrorCode.NOT_FOUND and "no pending question" in refused.value.message
    with pytest.raises(Refused) as wrong:
        await gateway.answer_question(ALICE, question.question_id, ["maybe"])
    assert wrong.value.code is ErrorCode.BAD_REQUEST
    assert not pending.done() and await bus.redis.exists(bus.keys.question(question.question_id))
    await gateway.answer_question(OPERATOR, question.question_id, ["no"])  # an operator may, as for approvals
    result = await asyncio.wait_for(pending, 10)
    assert result.data == {"answers": ["no"], "by": "root"}


async def test_no_answer_in_time_is_no_answer_and_both_are_in_the_flight_record(engine, call, bus: Bus,
                                                                                 gateway: TurnRunner,
                                                                                 tmp_path: Path) -> None:
    await engine(ask_user={"timeout_s": 1})
    recorder = FlightRecorder(bus.redis, bus.keys, keep_s=60)
    await recorder.write("alice/s", Step(kind="turn", data={"text": "ask me"}))  # the Brain's first step
    pending, question = await asked(bus, call, gateway)
    result = await asyncio.wait_for(pending, 10)
    assert result.success and result.data["no_answer"] is True and "no answer within 1s" in result.data["reason"]
    assert not await bus.redis.exists(bus.keys.question(question.question_id))
    pending, question = await asked(bus, call, gateway, questions=[{"text": "Deploy?", "choices": ["yes", "no"]}])
    await gateway.answer_question(ALICE, question.question_id, ["yes"])
    assert (await asyncio.wait_for(pending, 10)).data["answers"] == ["yes"]
    steps = [(s.data["questions"][0]["text"], s.data["answers"], s.data["by"])
             for s in await recorder.steps("alice/s") if s.kind == "question"]
    assert steps == [("Which colour?", None, ""), ("Deploy?", ["yes"], "alice")]


async def test_the_wait_is_bounded_by_the_calls_deadline(engine, call, bus: Bus, gateway: TurnRunner) -> None:
    await engine()  # ask_user.timeout_s: 300, far past the call's deadline
    pending, question = await asked(bus, call, gateway, deadline_s=4)
    assert question.expires_at - now_ms() < 4_000
    result = await asyncio.wait_for(pending, 10)
    assert result.success and result.data["no_answer"] is True
