"""What a matrix-nio call's outcome means to the channel kit: nio returns error responses rather than raising,
and its transport raises aiohttp's and the OS's errors; both become the kit's ``PlatformAway`` (wait and try
again) or ``PlatformRefused`` (a person must fix something)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import nio

from gateway.channels.errors import PlatformAway, PlatformRefused

REFUSED = {"M_UNKNOWN_TOKEN", "M_MISSING_TOKEN", "M_FORBIDDEN", "M_NOT_FOUND", "M_TOO_LARGE", "M_BAD_JSON",
           "M_NOT_JSON", "M_UNRECOGNIZED", "M_USER_DEACTIVATED", "M_INVALID_PARAM"}


def checked(response: Any, what: str) -> Any:
    """A response, or the kit's error for an error response (nio returns errors rather than raising)."""
    if not isinstance(response, nio.ErrorResponse):
        return response
    code = str(response.status_code or "")
    said = f"Matrix {what}: {code} {response.message or ''}".strip()
    if code == "M_LIMIT_EXCEEDED":
        raise PlatformAway(said, retry_after=(response.retry_after_ms or 1000) / 1000)
    if code in REFUSED:
        raise PlatformRefused(said)
    raise PlatformAway(said)


@contextlib.asynccontextmanager
async def translated(what: str) -> AsyncIterator[None]:
    try:
        yield
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        raise PlatformAway(f"Matrix {what}: {type(exc).__name__}: {exc}") from None
