"""What a chat platform's calls fail with, in the kit's terms (each platform module translates its library's)."""

from __future__ import annotations

from bus.errors import PincerError


class PlatformAway(PincerError):
    """The platform did not serve the call now (network, timeout, 5xx, flood control): try again later,
    after ``retry_after`` seconds when the platform said how long."""

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class PlatformRefused(PincerError):
    """The platform refused the call as asked (a bad token, a chat the bot may not write to, a file too big):
    trying it again will not help."""
