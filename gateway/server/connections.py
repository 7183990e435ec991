"""Open connections end when their credential does: revocation and sign-out reach every socket and stream.

A request is checked once, when it arrives; a WebSocket or an SSE stream
lives on. Each one registers here with the credential it was opened with (the
bearer token's digest, or the sign-in cookie's session), and once a second
every Gateway checks the distinct credentials of its open connections in one
Redis round trip. A credential that is gone (``pincer token revoke``, the
page's sign-out, a cookie's week over) ends every connection opened with it,
on every Gateway of the pool, within about two seconds; so does a
connection's maximum lifetime (``gateway.limits.max_connection_s``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Literal, TypeVar

from bus.log import kv
from bus.protocol import ErrorCode
from gateway.server.errors import REDIS_AWAY
from gateway.tokens import TokenStore, WebSessions

log = logging.getLogger("gateway.connections")

CHECK_S = 1.0
Ended = Literal["revoked", "expired"]
T = TypeVar("T")


@dataclass(frozen=True)
class Credential:
    """What a connection was opened with: a bearer token's digest, or a sign-in cookie's session."""

    token_digest: str | None = None
    web_session: str | None = None  # the cookie's value (its digest is what Redis keys)


@dataclass(eq=False)
class Connection:
    credential: Credential
    deadline: float  # time.monotonic() past which it ends
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    reason: Ended | None = None

    def end(self, reason: Ended) -> None:
        if self.reason is None:
            self.reason = reason
            self.ended.set()

    @property
    def code(self) -> ErrorCode:
        return ErrorCode.UNAUTHENTICATED if self.reason == "revoked" else ErrorCode.TIMEOUT

    @property
    def why(self) -> str:
        return ("the token or sign-in it was opened with was revoked or ended" if self.reason == "revoked"
                else "the connection reached its maximum lifetime (gateway.limits.max_connection_s); reconnect")


class Connections:
    def __init__(self, tokens: TokenStore, web: WebSessions, *, max_life_s: float, check_s: float = CHECK_S) -> None:
        self.tokens, self.web, self.max_life_s, self.check_s = tokens, web, max_life_s, check_s
        self._open: set[Connection] = set()
        self._task: asyncio.Task[None] | None = None

    @contextlib.contextmanager
    def opened(self, credential: Credential | None) -> Iterator[Connection]:
        """Register a connection while it is open (``credential`` None: one the Gateway could not name)."""
        connection = Connection(credential or Credential(), time.monotonic() + self.max_life_s)
        self._open.add(connection)
        try:
            yield connection
        finally:
            self._open.discard(connection)

    async def stream(self, credential: Credential | None, events: AsyncIterator[dict[str, str]],
                     farewell: Callable[[ErrorCode, str], dict[str, str]]) -> AsyncIterator[dict[str, str]]:
        """An SSE stream's items while its connection stands; when it ends, ``farewell`` says why, last."""
        with self.opened(credential) as connection:
            async for item in until_ended(events, connection):
                yield item
            if connection.reason is not None:
                yield farewell(connection.code, connection.why)

    async def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._watch())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.check_s)
            try:
                await self.check()
            except REDIS_AWAY as exc:  # checked again next round; nothing is ended on a guess
                log.warning("could not check open connections' credentials: %s", exc)
            except Exception:
                log.exception("checking open connections failed")

    async def check(self) -> None:
        """End every open connection whose credential is gone or whose lifetime is over."""
        now = time.monotonic()
        for connection in [c for c in self._open if c.deadline <= now]:
            connection.end("expired")
        credentials = list({c.credential for c in self._open if c.reason is None})
        if not credentials:
            return
        valid = await self.still_valid(credentials)
        gone = {c for c, ok in zip(credentials, valid, strict=True) if not ok}
        for connection in [c for c in self._open if c.credential in gone]:
            log.info("connection ended: its credential is gone %s", kv(kind="cookie" if connection.credential
                                                                       .web_session else "token"))
            connection.end("revoked")

    async def still_valid(self, credentials: list[Credential]) -> list[bool]:
        """Whether each credential still stands: its token not revoked, its sign-in (if any) not ended."""
        tokens = await self.tokens.valid_digests([c.token_digest or "" for c in credentials])
        signed_in = iter(await self.web.alive([c.web_session for c in credentials if c.web_session]))
        return [token_ok and (next(signed_in) if c.web_session else True)
                for c, token_ok in zip(credentials, tokens, strict=True)]


_DONE = object()


async def until_ended(events: AsyncIterator[T], connection: Connection) -> AsyncIterator[T]:
    """The items of ``events`` until the connection ends; then ``events`` is cancelled and the stream closes.

    ``events`` runs whole in one task of its own (a generator that holds ``asyncio.timeout`` across its
    yields must stay in one task), handing items over one at a time, so a slow client still holds it back."""
    handed: asyncio.Queue[object] = asyncio.Queue(1)

    async def pump() -> None:
        try:
            async for item in events:
                await handed.put(item)
        except Exception as exc:  # raised again in the reader's task
            await handed.put(exc)
        finally:  # cancelled between items: the generator's own clean-up runs now, in this task
            aclose = getattr(events, "aclose", None)
            if aclose is not None:
                await aclose()
        await handed.put(_DONE)

    pumping = asyncio.ensure_future(pump())
    ended = asyncio.ensure_future(connection.ended.wait())
    try:
        while True:
            taking = asyncio.ensure_future(handed.get())
            await asyncio.wait({taking, ended}, return_when=asyncio.FIRST_COMPLETED)
            if connection.ended.is_set():  # ended wins over an item that is ready too
                taking.cancel()
                return
            item = taking.result()
            if item is _DONE:
                return
            if isinstance(item, Exception):
                raise item
            yield item  # type: ignore[misc]  # the queue holds only ``events``' items besides the markers
    finally:
        for task in (pumping, ended):
            task.cancel()
        await asyncio.gather(pumping, ended, return_exceptions=True)
