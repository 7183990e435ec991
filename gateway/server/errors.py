"""Every answer the Gateway refuses with, in one shape: ``{"error": {"code", "message", "type"}}``.

``code`` comes from the one error enum (``bus.protocol.ErrorCode``); ``type``
is the OpenAI error type for the same status, so OpenAI clients read our
refusals as they read OpenAI's. Handlers raise ``Refused``; the app turns it
into a response in one place.
"""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse

from bus.errors import PincerError
from bus.protocol import ErrorCode
from bus.redis_client import RedisAway

OPENAI_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
}

# A chat turn that ended in error: the HTTP status that says so.
TURN_STATUS = {
    ErrorCode.MODEL_NOT_CONFIGURED: 503,
    ErrorCode.SERVICE_UNAVAILABLE: 503,
    ErrorCode.RATE_LIMITED: 429,
    ErrorCode.BUDGET_EXCEEDED: 429,  # as a provider says a quota is spent
    ErrorCode.TIMEOUT: 504,
    ErrorCode.INVALID_ARGUMENTS: 400,
}


# Redis not answering (restarting, failing over, or gone): what a request that needs it is told.
REDIS_AWAY = (RedisAway,)


class Refused(PincerError):
    """A request the Gateway will not serve; becomes one JSON error response."""

    def __init__(self, status: int, code: ErrorCode, message: str, *, retry_after: int | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message
        self.headers = dict(headers or {})
        if retry_after is not None:
            self.headers["Retry-After"] = str(max(1, retry_after))

    def response(self, **extra: Any) -> JSONResponse:
        return error_response(self.status, self.code, self.message, headers=self.headers, **extra)


def error_body(status: int, code: ErrorCode | str, message: str) -> dict[str, Any]:
    kind = OPENAI_TYPES.get(status, "server_error")
    return {"error": {"code": str(code), "message": message, "type": kind, "param": None}}


def error_response(status: int, code: ErrorCode | str, message: str, *, headers: dict[str, str] | None = None,
                   **extra: Any) -> JSONResponse:
    return JSONResponse({**error_body(status, code, message), **extra}, status_code=status, headers=headers)


def unauthenticated(message: str) -> Refused:
    return Refused(401, ErrorCode.UNAUTHENTICATED, message, headers={"WWW-Authenticate": "Bearer"})


def not_found(message: str) -> Refused:
    return Refused(404, ErrorCode.NOT_FOUND, message)


def redis_away(exc: Exception) -> Refused:
    """503 with Retry-After for a request Redis did not answer: nothing was started, so it may be sent again."""
    return Refused(503, ErrorCode.SERVICE_UNAVAILABLE,
                   f"Pincer's Redis did not answer ({exc}); it may be restarting or failing over: "
                   "try again in a few seconds", retry_after=2)
