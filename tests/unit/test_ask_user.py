"""The ask_user tool without Redis: its arguments, what the model reads back, a job's turn, the answers' checks."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from bus.protocol import ErrorCode, Question, ToolExecute, now_ms
from bus.records import PendingQuestion
from bus.replies import ReplyInbox
from gateway.turns.questions import checked_answers
from gateway.turns.refusal import Refused
from hands.config import HandsSettings
from hands.executor import Executor
from hands.questions import PersonAsker
from hands.worker import build_registry
from tests.fakes import FakeQuestions, fake_bus


def executor(tmp_path: Path, **services) -> Executor:
    (tmp_path / "ws").mkdir(exist_ok=True)
    return Executor(build_registry(), HandsSettings(workspace=tmp_path / "ws"), worker_id="w-fake", **services)


async def ask(hands: Executor, questions, *, approvals_to: str | None = "p:reply:gateway"):
    return await hands.execute(ToolExecute(tool="ask_user", args={"questions": questions}, session_id="alice/s",
                                           sender="alice", reply_to="r", deadline=now_ms() + 10_000,
                                           approvals_to=approvals_to, message_id="m1"))


@pytest.mark.parametrize(("questions", "says"), [
    ([], "should be non-empty"),
    ([{"text": f"q{n}"} for n in range(4)], "is too long"),
    ([{"text": "pick", "choices": [str(n) for n in range(7)]}], "is too long"),
    ([{"text": "pick", "choices": ["a", "a"]}], "non-unique"),
    ([{"text": "pick", "choices": ["x" * 61]}], "is too long"),
    ([{"text": ""}], "should be non-empty"),
    ([{"text": "x" * 1001}], "is too long"),
    ([{"text": "pick", "options": ["a"]}], "Additional properties"),
])
async def test_arguments_outside_the_schema_are_refused_before_anyone_is_asked(tmp_path: Path, questions,
                                                                              says: str) -> None:
    person = FakeQuestions(["never"])
    refused = await ask(executor(tmp_path, questions=person), questions)
    assert refused.error is not None and refused.error.code is ErrorCode.INVALID_ARGUMENTS
    assert says in refused.error.message
    assert person.asked == []


async def test_blank_or_alike_choices_are_refused(tmp_path: Path) -> None:
    person = FakeQuestions(["never"])
    for choices in (["  ", "b"], ["a  b", "a b"]):
        refused = await ask(executor(tmp_path, questions=person), [{"text": "pick", "choices": choices}])
        assert refused.error is not None and refused.error.code is ErrorCode.INVALID_ARGUMENTS
        assert "differ from one another" in refused.error.message
    assert person.asked == []


async def test_the_answers_come_back_as_data_one_per_question(tmp_path: Path) -> None:
    person = FakeQuestions(["blue", "because"], by="alice")
    result = await ask(executor(tmp_path, questions=person),
                       [{"text": "Which colour?", "choices": ["red", "blue"]}, {"text": "Why?"}])
    assert result.success and result.data == {"answers": ["blue", "because"], "by": "alice"}
    assert person.asked == [[Question(text="Which colour?", choices=["red", "blue"]), Question(text="Why?")]]


async def test_what_a_person_is_shown_has_its_control_characters_written_out(tmp_path: Path) -> None:
    person = FakeQuestions(["ok"])
    await ask(executor(tmp_path, questions=person),
              [{"text": "Go\x1b[2J on?\nreally", "choices": ["yes\x07", "no\nway"]}])
    shown = person.asked[0][0]
    assert shown.text == "Go\\x1b[2J on?\nreally"  # a line break stays in the question, never in a choice
    assert shown.choices == ["yes\\x07", "no way"]


async def test_no_answer_is_data_the_model_reads_not_a_failure(tmp_path: Path) -> None:
    result = await ask(executor(tmp_path, questions=FakeQuestions(None)), [{"text": "Still there?"}])
    assert result.success and result.data == {"no_answer": True, "reason": "the fake person is away"}


@pytest.mark.parametrize("approvals_to", ["", None])
async def test_a_turn_nobody_watches_gets_no_answer_at_once(tmp_path: Path, approvals_to: str | None) -> None:
    bus = fake_bus()
    asker = PersonAsker(bus=bus, inbox=ReplyInbox(bus, "w-fake"), timeout_s=300)
    started = time.monotonic()
    result = await ask(executor(tmp_path, questions=asker), [{"text": "Deploy now?", "choices": ["yes", "no"]}],
                       approvals_to=approvals_to)
    assert time.monotonic() - started < 5  # nobody waited for the 300 s
    assert result.success and result.data["no_answer"] is True and "unattended" in result.data["reason"]
    assert await bus.redis.keys("*") == []  # nothing was asked: no pending question, no request sent


def test_answers_are_checked_against_the_questions() -> None:
    questions = [Question(text="Which?", choices=["red", "blue"]), Question(text="Why?")]
    assert checked_answers(questions, ["blue", " because "]) == {0: "blue", 1: "because"}
    assert checked_answers(questions, [None, "later"]) == {1: "later"}  # a chat answers one at a time
    for wrong, says in ((["blue"], "a list of 2"), ("blue", "a list of 2"), (["green", None], "one of red, blue"),
                        ([None, None], "at least one"), ([None, "  "], "text, or null"), ([None, 5], "text, or null")):
        with pytest.raises(Refused) as refused:
            checked_answers(questions, wrong)
        assert refused.value.code is ErrorCode.BAD_REQUEST and says in refused.value.message


def test_a_pending_question_reads_back_with_its_answers_so_far() -> None:
    pending = PendingQuestion(reply_to="p:reply:w1", session_id="alice/s", expires_at=123,
                              questions=[Question(text="Which ✓?", choices=["a", "b"]), Question(text="Why?")])
    raw = {k.encode(): v.encode() for k, v in pending.encode().items()} | {b"a:1": "because ✓".encode()}
    assert PendingQuestion.decode(raw) == pending
    assert PendingQuestion.answered(raw) == {1: "because ✓"}
    assert PendingQuestion.decode({}) is None and PendingQuestion.decode({b"questions": b"not json"}) is None


def test_a_call_that_waits_for_a_person_may_take_as_long_as_hands_says_within_the_turn() -> None:
    from brain.hands_calls import call_deadline_s
    from bus.protocol import ToolSpec

    asking = ToolSpec(name="ask_user", description="d", parameters={"type": "object"},
                      metadata={"category": "person_interaction", "timeout_s": 300})
    plain = ToolSpec(name="read_file", description="d", parameters={"type": "object"},
                     metadata={"category": "file_operation", "timeout_s": 300})
    assert call_deadline_s(asking, 60, turn_left_s=900) == 305  # the question's wait, and time to say no_answer
    assert call_deadline_s(asking, 60, turn_left_s=100) == 100  # never past the turn's own end ...
    assert call_deadline_s(asking, 60, turn_left_s=10) == 60  # ... nor shorter than any call's
    assert call_deadline_s(plain, 60, turn_left_s=900) == 60 and call_deadline_s(None, 60, turn_left_s=900) == 60
