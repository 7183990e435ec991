"""Records two processes share outside the wire's messages, each with its one encode and decode.

A dead letter (written by any consumer, read by ``pincer dead``), a pending
approval and a pending question (each written by the Hands worker that asks,
read by the Gateway or channel that answers). Both sides import these models; nobody reads the fields by
hand.
"""

from __future__ import annotations

import json

from pydantic import BaseModel, ConfigDict

from bus.protocol import Question

DEAD_PREFIX = b"dead:"


class DeadLetter(BaseModel):
    """An entry that could not be handled: where it came from, why, and the entry itself."""

    model_config = ConfigDict(frozen=True)

    source: str  # the stream it was read from
    group: str
    entry: str  # its id there
    reason: str
    original: dict[bytes, bytes]  # the entry's own fields, as they were

    def encode(self) -> dict[bytes, bytes]:
        """The dead stream's entry: our fields beside the original's (which never start with ``dead:``)."""
        return {b"dead:source": self.source.encode(), b"dead:group": self.group.encode(),
                b"dead:entry": self.entry.encode(), b"dead:reason": self.reason.encode(), **self.original}

    @classmethod
    def decode(cls, fields: dict[bytes, bytes]) -> DeadLetter:
        def text(name: str) -> str:
            return fields.get(DEAD_PREFIX + name.encode(), b"").decode(errors="replace")

        return cls(source=text("source"), group=text("group"), entry=text("entry"), reason=text("reason"),
                   original={k: v for k, v in fields.items() if not k.startswith(DEAD_PREFIX)})

    @classmethod
    def of(cls, *, source: str, group: str, entry: str, reason: str, fields: dict[bytes, bytes]) -> DeadLetter:
        """A dead letter for an entry (a dead letter dead-lettered again keeps only its original)."""
        return cls(source=source, group=group, entry=entry, reason=reason,
                   original={k: v for k, v in fields.items() if not k.startswith(DEAD_PREFIX)})


class PendingApproval(BaseModel):
    """An exec approval waiting for a person: where the answer goes, and what it is about."""

    model_config = ConfigDict(frozen=True)

    reply_to: str  # the asking worker's stream
    session_id: str
    tool: str
    summary: str
    expires_at: int

    def encode(self) -> dict[str, str]:
        return {k: str(v) for k, v in self.model_dump().items()}

    @classmethod
    def decode(cls, raw: dict[bytes, bytes]) -> PendingApproval | None:
        """The approval, or None for a hash that is gone (answered, expired) or not one of ours."""
        try:
            return cls.model_validate({k.decode(): v.decode() for k, v in raw.items()})
        except (ValueError, UnicodeDecodeError):
            return None


ANSWER_PREFIX = "a:"  # a pending question's hash: one field per question answered so far (a:0, a:1, ...)


class PendingQuestion(BaseModel):
    """An ``ask_user`` call waiting for its person: where the answers go, whose session, what was asked.

    The hash also holds the answers given so far (``a:<index>``), since a chat answers one question at a
    time (a button, a reply); the Gateway's script sends the answers once every question has one."""

    model_config = ConfigDict(frozen=True)

    reply_to: str  # the asking worker's stream
    session_id: str
    questions: list[Question]
    expires_at: int

    def encode(self) -> dict[str, str]:
        return {"reply_to": self.reply_to, "session_id": self.session_id, "expires_at": str(self.expires_at),
                "questions": json.dumps([q.model_dump() for q in self.questions], ensure_ascii=False)}

    @classmethod
    def decode(cls, raw: dict[bytes, bytes]) -> PendingQuestion | None:
        """The question, or None for a hash that is gone (answered, expired) or not one of ours."""
        try:
            fields = {k.decode(): v.decode() for k, v in raw.items()}
            return cls(reply_to=fields["reply_to"], session_id=fields["session_id"],
                       expires_at=int(fields["expires_at"]),
                       questions=[Question.model_validate(q) for q in json.loads(fields["questions"])])
        except (KeyError, ValueError, UnicodeDecodeError):
            return None

    @staticmethod
    def answered(raw: dict[bytes, bytes]) -> dict[int, str]:
        """The answers given so far, by question index."""
        prefix = ANSWER_PREFIX.encode()
        return {int(k[len(prefix):]): v.decode(errors="replace") for k, v in raw.items()
                if k.startswith(prefix) and k[len(prefix):].isdigit()}
