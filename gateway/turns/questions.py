"""Answers to an ask_user call's questions: checked, kept until every question has one, then sent once.

A page answers all its questions at once; a chat answers one at a time (a button, a reply). Each answer is
written into the pending question's hash (``bus.records.PendingQuestion``) by one script, which also sees
whether every question has one now: if so it deletes the hash and hands back the answers, so exactly one
caller, on whichever Gateway or channel replica, sends the ``question:answer``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bus.protocol import ErrorCode, Question
from bus.records import ANSWER_PREFIX, PendingQuestion
from bus.scripts import lua
from bus.streams import Bus
from gateway.turns.refusal import Refused, not_found

ANSWER_CHARS = 2_000  # a written answer, as the model will read it

# KEYS: the pending question. ARGV: its number of questions, then pairs of (index, answer).
# Returns nil when it is gone (answered, expired), {0} while a question still has no answer, else {1, answers...}.
ANSWER = lua("gateway.turns.questions.answer", f"""
if redis.call('EXISTS', KEYS[1]) == 0 then return nil end
for i = 2, #ARGV, 2 do redis.call('HSET', KEYS[1], '{ANSWER_PREFIX}' .. ARGV[i], ARGV[i + 1]) end
local all = {{1}}
for i = 0, tonumber(ARGV[1]) - 1 do
  local answer = redis.call('HGET', KEYS[1], '{ANSWER_PREFIX}' .. i)
  if not answer then return {{0}} end
  all[#all + 1] = answer
end
redis.call('DEL', KEYS[1])
return all
""")


def gone(question_id: str) -> Refused:
    return not_found(f"no pending question {question_id!r}: it was answered, or it expired")


def checked_answers(questions: list[Question], given: Any) -> dict[int, str]:
    """The answers a client gave (a list, one per question, null for one not answered yet), by index; each a
    choice of its question, or for a question without choices, its text. ``Refused`` says what does not fit."""
    if not isinstance(given, list) or len(given) != len(questions):
        raise Refused(ErrorCode.BAD_REQUEST, f"answers: a list of {len(questions)} (one per question; null for "
                      "one not answered yet)")
    answers: dict[int, str] = {}
    for n, (question, answer) in enumerate(zip(questions, given, strict=True)):
        if answer is None:
            continue
        if not isinstance(answer, str) or not answer.strip():
            raise Refused(ErrorCode.BAD_REQUEST, f"answers/{n}: text, or null")
        answer = answer.strip()
        if question.choices and answer not in question.choices:
            raise Refused(ErrorCode.BAD_REQUEST, f"answers/{n}: one of {', '.join(question.choices)}")
        answers[n] = answer[:ANSWER_CHARS]
    if not answers:
        raise Refused(ErrorCode.BAD_REQUEST, "answers: answer at least one question")
    return answers


class PendingQuestions:
    """The questions waiting for their people, as the Gateway and channels answer them."""

    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self._answer = bus.redis.register_script(ANSWER)

    async def find(self, question_id: str) -> PendingQuestion:
        """The pending question, or ``Refused`` (404) when it is gone."""
        key = self.bus.keys.question(question_id)
        raw: dict[bytes, bytes] = await self.bus.redis.hgetall(key)  # type: ignore[assignment]  # bytes
        found = PendingQuestion.decode(raw)
        if found is None:
            raise gone(question_id)
        return found

    async def unanswered(self, question_id: str) -> tuple[PendingQuestion, list[int]] | None:
        """The pending question and the indexes of its questions with no answer yet (None: it is gone)."""
        key = self.bus.keys.question(question_id)
        raw: dict[bytes, bytes] = await self.bus.redis.hgetall(key)  # type: ignore[assignment]  # bytes
        found = PendingQuestion.decode(raw)
        if found is None:
            return None
        answered = PendingQuestion.answered(raw)
        return found, [n for n in range(len(found.questions)) if n not in answered]

    async def add(self, question_id: str, count: int, answers: Mapping[int, str]) -> list[str] | None:
        """Write ``answers``; every question's answer once the last is in (the caller sends them), else None."""
        args: list[Any] = [count]
        for index, answer in sorted(answers.items()):
            args += [index, answer]
        outcome = await self._answer(keys=[self.bus.keys.question(question_id)], args=args)
        if outcome is None:
            raise gone(question_id)
        if not int(outcome[0]):
            return None
        return [a.decode() for a in outcome[1:]]
