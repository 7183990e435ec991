"""Why a turn (or any request of a door) will not be served: one error code from ``bus.protocol.ErrorCode``,
a sentence that says what to do, and when to come back. The HTTP server maps it to a status and a JSON body
(gateway/server/errors.py); a chat channel tells the person the sentence."""

from __future__ import annotations

from bus.errors import PincerError
from bus.protocol import ErrorCode


class Refused(PincerError):
    def __init__(self, code: ErrorCode, message: str, *, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.code, self.message = code, message
        self.retry_after = None if retry_after is None else max(1, retry_after)


def not_found(message: str) -> Refused:
    return Refused(ErrorCode.NOT_FOUND, message)


def redis_away(exc: Exception) -> Refused:
    """Redis did not answer: nothing was started, so the request may be sent again in a moment."""
    return Refused(ErrorCode.SERVICE_UNAVAILABLE,
                   f"Pincer's Redis did not answer ({exc}); it may be restarting or failing over: "
                   "try again in a few seconds", retry_after=2)
