"""Questions to a person (the ask_user tool): put where the turn's person listens, answered by them alone.

The call's ``approvals_to`` says where its person listens (their Gateway's or channel's stream), as for an
exec approval: a ``question:request`` goes there, a pending record (``bus.records.PendingQuestion``) lets any
Gateway or channel replica take the answers, even one started after the question was asked, and the call
waits for the ``question:answer`` on this worker's own reply stream. A Brain that dies meanwhile changes
nothing here: the one that resumes the turn sends the same call again, and the worker's call record makes
it wait for this one's result. Nobody to ask (a job's turn: ``approvals_to`` is "") or no answer in time is
not a failure: the model is told ``no_answer`` and goes on.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from bus.protocol import Question, QuestionAnswer, QuestionRequest, ToolExecute, now_ms
from bus.records import PendingQuestion
from bus.replies import ReplyInbox
from bus.streams import Bus
from hands.approvals import made_visible
from memory.flight import FlightRecorder, Step

log = logging.getLogger("hands.questions")

MARGIN_S = 2.0  # the answer must reach the Brain before the call's deadline does


@dataclass(frozen=True)
class Asked:
    """How a question ended: the person's answers (one per question) and who gave them, or why there are none."""

    answers: list[str] | None
    by: str = ""
    reason: str = ""


def shown_question(text: str, choices: list[str]) -> Question:
    """A question as a person may be shown it: control characters written out (a choice on one line)."""
    return Question(text=made_visible(text), choices=[made_visible(c, keep="") for c in choices])


class PersonAsker:
    def __init__(self, *, bus: Bus | None, inbox: ReplyInbox | None, timeout_s: float) -> None:
        self.bus, self.inbox, self.timeout_s = bus, inbox, timeout_s

    async def ask(self, call: ToolExecute, questions: list[Question]) -> Asked:
        """Put ``questions`` to the call's person and wait for every answer (never past the call's deadline)."""
        if self.bus is None or self.inbox is None or not call.approvals_to:
            return Asked(None, reason="nobody is there to ask: this turn runs unattended (a scheduled job, or a "
                                      "call from no chat); decide without them")
        timeout = min(self.timeout_s, max(1.0, (call.deadline - now_ms()) / 1000 - MARGIN_S))
        request = QuestionRequest(call_id=call.call_id, session_id=call.session_id, message_id=call.message_id or "",
                                  questions=questions, expires_at=now_ms() + int(timeout * 1000),
                                  reply_to=self.inbox.stream)
        key = self.bus.keys.question(request.question_id)
        pending = PendingQuestion(reply_to=request.reply_to, session_id=call.session_id, questions=questions,
                                  expires_at=request.expires_at)
        async with self.bus.redis.pipeline(transaction=True) as pipe:
            pipe.hset(key, mapping=pending.encode())  # type: ignore[arg-type]  # an invariant key type
            pipe.expire(key, int(timeout) + 5)
            await pipe.execute()
        log.info("question asked question=%s call=%s", request.question_id, call.call_id)
        try:
            reply = await self.inbox.request(call.approvals_to, request, request.question_id, timeout=timeout,
                                             final=(QuestionAnswer,))
        except TimeoutError:
            await self._record(call, request, None, "")
            return Asked(None, reason=f"no answer within {timeout:g}s; go on without it, or ask again later")
        finally:
            await self.bus.redis.delete(key)
        assert isinstance(reply, QuestionAnswer)
        await self._record(call, request, reply.answers, reply.by)
        log.info("question answered question=%s by=%s", request.question_id, reply.by)
        return Asked(list(reply.answers), by=reply.by)

    async def _record(self, call: ToolExecute, request: QuestionRequest, answers: list[str] | None, by: str) -> None:
        """The questions and their answers in the session's flight record (when it keeps one)."""
        assert self.bus is not None
        step = Step(kind="question", message_id=call.message_id or "",
                    data={"call_id": call.call_id, "question_id": request.question_id,
                          "questions": [q.model_dump() for q in request.questions],
                          "answers": answers, "by": by})
        await FlightRecorder(self.bus.redis, self.bus.keys, keep_s=0).add_if_kept(call.session_id, step)
