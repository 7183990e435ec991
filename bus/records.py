"""Records two processes share outside the wire's messages, each with its one encode and decode.

A dead letter (written by any consumer, read by ``pincer dead``) and a
pending approval (written by the Hands worker that asks, read by the Gateway
that answers). Both sides import these models; nobody reads the fields by
hand.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

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
