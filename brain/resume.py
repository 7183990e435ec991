"""What a turn resumed on another Brain reads from its transcript: whether it ended, and its calls' ids."""

from __future__ import annotations

import hashlib

from bus.protocol import ChatError, ChatMessage, ChatReply, ErrorCode
from memory.sessions import TranscriptEntry


def finished_answer(message: ChatMessage, turn: list[TranscriptEntry]) -> ChatReply | ChatError | None:
    """The answer of a turn the transcript shows ended (its Brain died before sending it), else None."""
    last = turn[-1]
    if last.role != "assistant":
        return None
    marks = last.marks
    if marks.final:
        return ChatReply(session_id=message.session_id, message_id=message.message_id, text=last.content or "",
                         model=marks.model, usage=marks.usage)
    if marks.stopped:
        return ChatError(session_id=message.session_id, message_id=message.message_id, code=ErrorCode(marks.stopped),
                         message=marks.told or last.content or marks.stopped)
    return None


def call_id_of(message_id: str, iteration: int, index: int, model_call_id: str) -> str:
    """The same call gets the same id in every Brain that runs its turn: Hands' record is found by it."""
    return hashlib.sha256(f"{message_id}:{iteration}:{index}:{model_call_id}".encode()).hexdigest()[:32]
