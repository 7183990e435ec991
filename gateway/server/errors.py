"""Every answer the Gateway refuses with, in one shape: ``{"error": {"code", "message", "type"}}``.

``code`` comes from the one error enum (``bus.protocol.ErrorCode``) and
decides the HTTP status; ``type`` is the OpenAI error type for that status,
so OpenAI clients read our refusals as they read OpenAI's. Handlers raise
the turn core's ``Refused``; the app turns it into a response in one place.
"""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse

from bus.protocol import ErrorCode
from bus.redis_client import RedisAway
from gateway.turns.refusal import Refused

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

# A refusal's HTTP status, by its code (a code not here is a client error: 400).
STATUS = {
    ErrorCode.UNAUTHENTICATED: 401,
    ErrorCode.FORBIDDEN: 403,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.CONFLICT: 409,
    ErrorCode.PAYLOAD_TOO_LARGE: 413,
    ErrorCode.UNSUPPORTED_MEDIA_TYPE: 415,
    ErrorCode.RATE_LIMITED: 429,
    ErrorCode.SERVICE_UNAVAILABLE: 503,
}


def http_status(refusal: Refused) -> int:
    return STATUS.get(refusal.code, 400)


def refusal_response(refusal: Refused, **extra: Any) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if refusal.code == ErrorCode.UNAUTHENTICATED else {}
    if refusal.retry_after is not None:
        headers["Retry-After"] = str(refusal.retry_after)
    return error_response(http_status(refusal), refusal.code, refusal.message, headers=headers, **extra)


def error_body(status: int, code: ErrorCode | str, message: str) -> dict[str, Any]:
    kind = OPENAI_TYPES.get(status, "server_error")
    return {"error": {"code": str(code), "message": message, "type": kind, "param": None}}


def error_response(status: int, code: ErrorCode | str, message: str, *, headers: dict[str, str] | None = None,
                   **extra: Any) -> JSONResponse:
    return JSONResponse({**error_body(status, code, message), **extra}, status_code=status, headers=headers)
