"""The Redis client every Pincer process uses: bytes in and out, commands packed in C, errors as Pincer's.

redis-py's asyncio connections pack commands in Python; its sync client
packs them with hiredis when installed. Every tool call packs at least two
XADDs, so Pincer's connections use hiredis too (figures in docs/bus.md).

This module is Redis's one edge: every connection it makes raises
``RedisAway`` when Redis does not answer and ``RedisRefused`` when it answers
with an error, so nothing outside the bus imports redis-py's exceptions.
Both still subclass redis-py's own (ConnectionError, ResponseError), which
redis-py's pools, pipelines and retries go on recognising.
"""

from __future__ import annotations

import asyncio
import socket
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from redis._parsers import _AsyncHiredisParser
from redis.asyncio import Redis
from redis.asyncio.connection import AbstractConnection, ConnectionPool
from redis.client import EMPTY_RESPONSE, NEVER_DECODE
from redis.exceptions import ConnectionError, DataError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeout

from bus.errors import PincerError

_hiredis_pack: Callable[[tuple[Any, ...]], Any] | None
try:
    from hiredis import pack_command as _hiredis_pack
except ImportError:  # hiredis is a dependency, but a missing wheel must not stop Pincer
    _hiredis_pack = None


class RedisAway(PincerError, ConnectionError):
    """Redis did not answer (restarting, failing over, unreachable, or no connection came free):
    what was sent on that connection is not known to be done, and may be sent again."""


class RedisRefused(PincerError, ResponseError):
    """Redis answered a command with an error: a script's, a wrong type, a stream or group not there."""


# What a lost or stuck connection raises: RedisAway, and before translation redis-py's own and the OS's.
CONNECTION_ERRORS = (ConnectionError, RedisTimeout, OSError)


def away(exc: BaseException) -> RedisAway:
    """``exc`` (a lost connection, a timeout, a socket error) as the bus says it."""
    return exc if isinstance(exc, RedisAway) else RedisAway(str(exc) or type(exc).__name__)


def refusal(reply: Any) -> Any:
    """A plain refusal redis-py parsed as RedisRefused; its own kinds (NOSCRIPT, EXECABORT, ...) stay,
    since redis-py catches them by type; anything else as it is."""
    if type(reply) is ResponseError:
        translated = RedisRefused(*reply.args)
        translated.__cause__ = reply
        return translated
    return reply


class Translating:
    """Mixin for a redis-py asyncio connection class: its errors leave as RedisAway and RedisRefused."""

    async def connect(self) -> None:
        try:
            await super().connect()  # type: ignore[misc]
        except CONNECTION_ERRORS as exc:
            raise away(exc) from exc

    async def send_packed_command(self, *args: Any, **kwargs: Any) -> None:
        try:
            await super().send_packed_command(*args, **kwargs)  # type: ignore[misc]
        except CONNECTION_ERRORS as exc:
            raise away(exc) from exc

    async def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().read_response(*args, **kwargs)  # type: ignore[misc]
        except CONNECTION_ERRORS as exc:
            raise away(exc) from exc
        except ResponseError as exc:
            raise refusal(exc) from None


class HiredisPacking:
    """Mixin for a redis-py asyncio connection class: pack commands with hiredis."""

    def pack_command(self, *args: Any) -> list[bytes]:
        head = args[0]
        # A command name with spaces ("CLIENT SETNAME") goes out as separate words.
        if (" " if isinstance(head, str) else b" ") in head:
            args = (*head.split(), *args[1:])
        assert _hiredis_pack is not None  # this class is only used when hiredis is there
        try:
            return [_hiredis_pack(args)]
        except TypeError:
            pass
        try:  # buffers as bytes; anything else (None, a dict) is the caller's mistake
            return [_hiredis_pack(tuple(bytes(a) if isinstance(a, (bytearray, memoryview)) else a for a in args))]
        except TypeError as exc:  # the same error redis-py's own packer raises
            raise DataError(str(exc)) from None


class WaitingPool(ConnectionPool):
    """A pool whose callers wait for a free connection when all ``max_connections`` are in use.

    redis-py's plain pool fails them (a burst of 100 HTTP requests made the Gateway answer 500);
    its BlockingConnectionPool waits, but takes a Condition and a timeout on every command (~5-10 µs
    here). This one costs nothing until the pool is full.
    """

    WAIT_S = 30.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._waiters: deque[asyncio.Future[None]] = deque()

    async def get_connection(self, *args: Any, **kwargs: Any) -> AbstractConnection:
        while not self.can_get_connection():
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                async with asyncio.timeout(self.WAIT_S):
                    await waiter
            except TimeoutError:
                raise RedisAway(f"no Redis connection came free within {self.WAIT_S:g}s (all "
                                      f"{self.max_connections} in use: redis.max_connections)") from None
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._wake_one()  # woken, then cancelled: the free connection is someone else's
                raise
            finally:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
        # redis-py leaves get_connection unannotated: its return is the pool's connection class
        return await super().get_connection(*args, **kwargs)  # type: ignore[no-any-return,no-untyped-call]

    async def release(self, connection: AbstractConnection) -> None:
        await super().release(connection)
        self._wake_one()

    def _wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return


# A peer that vanished (host down, network cut) is found by TCP keepalive within ~20 s.
KEEPALIVE = {socket.TCP_KEEPIDLE: 10, socket.TCP_KEEPINTVL: 3, socket.TCP_KEEPCNT: 3} \
    if hasattr(socket, "TCP_KEEPIDLE") else {}


def connect(url: str, *, max_connections: int = 128) -> Redis:
    """A Redis client for the bus; bytes in, bytes out.

    No socket timeout: with one, redis-py wraps every send in ``asyncio.wait_for`` (a task each)
    and every reply it reads in ``asyncio.timeout``, ~25 µs per pipeline plus ~5 per command on
    this machine kind. What the timeout guarded against is handled where it matters instead:
    a dead peer by TCP keepalive (above), a slow or stuck Redis by every caller's own deadline
    (a tool call's timer, the blocking reads' short blocks), and connecting still times out.
    A ``?socket_timeout=N`` in the URL still applies, for whoever wants one anyway.
    """
    tcp = {"socket_keepalive": True, "socket_keepalive_options": KEEPALIVE} if url.startswith("redis") else {}
    pool = WaitingPool.from_url(url, decode_responses=False, health_check_interval=30, socket_timeout=None,
                                socket_connect_timeout=5, max_connections=max_connections, **tcp)
    _edge(pool)  # TCP, TLS or unix socket, as the URL says
    return Redis.from_pool(pool)


def connect_sentinel(sentinels: Sequence[str], master: str, *, password: str | None = None,
                     sentinel_password: str | None = None, max_connections: int = 128) -> Redis:
    """A client of whichever server the sentinels name master now: a failover is followed on reconnect
    (redis-py's own Sentinel support, with the same waiting pool and hiredis packing as ``connect``)."""
    from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool

    class WaitingSentinelPool(WaitingPool, SentinelConnectionPool):
        pass

    addresses = [(host.strip("[]"), int(port)) for host, _, port in (a.rpartition(":") for a in sentinels)]
    sentinel_kwargs = {"password": sentinel_password, "socket_connect_timeout": 2, "socket_timeout": 2}
    sentinel = Sentinel(addresses, sentinel_kwargs=sentinel_kwargs,  # type: ignore[no-untyped-call,unused-ignore]  # unannotated before redis 8.2
                        socket_connect_timeout=5)
    redis: Redis = sentinel.master_for(
        master, redis_class=Redis, connection_pool_class=WaitingSentinelPool, password=password,
        decode_responses=False, health_check_interval=30, socket_timeout=None, max_connections=max_connections,
        socket_keepalive=True, socket_keepalive_options=KEEPALIVE)
    _edge(redis.connection_pool)
    return redis


def _edge(pool: ConnectionPool) -> None:
    """The pool's connections translate their errors, and pack with hiredis where it is installed."""
    base = pool.connection_class
    mixins: tuple[type, ...] = (Translating, HiredisPacking) if _hiredis_pack is not None else (Translating,)
    prefix = "Hiredis" if _hiredis_pack is not None else "Translating"
    pool.connection_class = type(f"{prefix}{base.__name__}", (*mixins, base), {})


_UNKNOWN = object()
_PARSER_OPTIONS = frozenset({"keys", NEVER_DECODE, EMPTY_RESPONSE})


def _raising_reader(connection: AbstractConnection) -> Callable[[], Awaitable[Any]]:
    """The connection's own read, with a refusal returned rather than raised (as hiredis gives it)."""
    async def read() -> Any:
        try:
            return await connection.read_response()
        except ResponseError as refused:
            return refused

    return read


def _hiredis_reader(connection: AbstractConnection) -> Callable[[], Awaitable[Any]] | None:
    """The hiredis parser's own read, for a stock redis-py connection that reads through it
    (not, say, fakeredis's, which answers without parsing); None otherwise."""
    parser = getattr(connection, "_parser", None)
    if isinstance(parser, _AsyncHiredisParser) and _reads_as_stock(type(connection)):
        return parser.read_response
    return None


def _reads_as_stock(cls: type) -> bool:
    """Whether ``cls`` reads a reply as redis-py's own connection does (the error translation aside)."""
    own = next(c for c in cls.__mro__ if c is not Translating and "read_response" in vars(c))
    return own is AbstractConnection


def _closed_by_server(connection: AbstractConnection) -> bool:
    """Whether the server closed the connection (its end of stream has been read): checked without I/O,
    as redis-py's pool does for the connections it hands out (those of a HeldConnection it never sees)."""
    reader = connection._reader  # noqa: SLF001 - redis-py has no public way to see the close without a read
    return reader is not None and reader.at_eof()


class NotReplicated(RedisAway):
    """Fewer replicas than ``redis.min_replicas`` confirmed a write within its timeout: it does not
    count as sent (a failover now could lose it), so it fails as a lost connection does. Yet the
    primary applied it: ``applied`` holds each command's result there, for a caller that would
    rather wait for the replicas than send it again (and write it twice)."""

    def __init__(self, message: str, applied: list[Any] | None = None) -> None:
        super().__init__(message)
        self.applied = applied

    def part(self, start: int, size: int) -> NotReplicated:
        """The same failure, with the results of ``size`` commands from ``start`` (one caller's share)."""
        return NotReplicated(str(self), None if self.applied is None else self.applied[start:start + size])


class HeldConnection:
    """One connection of ``redis``'s pool, taken at the first command and kept until ``aclose``.

    A command through the pool takes and gives back a connection each time (a lock, a readiness
    check, observability counters), and redis-py 8's ``Pipeline.execute`` also scans for HIMPORT
    field sets and gives its connection back through ``asyncio.shield`` (a task and a loop turn).
    A loop of blocking reads, or the batcher's writes, keep one instead and send on it directly:
    commands packed in one write, optionally as one MULTI/EXEC transaction, each reply read by
    the connection's hiredis parser and given redis-py's own response callback. ~3.4 µs per
    command in a batch of 16 against ~7.7 through a pipeline (~4.6 through ``Redis.parse_response``),
    ~34 µs per XREAD against ~40 through a held client, on this machine kind. One user at a
    time: a consumer's reader, or the batcher's one flusher.
    """

    def __init__(self, redis: Redis) -> None:
        self.redis = redis
        self._connection: AbstractConnection | None = None
        self._read: Callable[[], Awaitable[Any]] | None = None  # set with the connection
        self._callbacks: dict[str | bytes, Any] = {}  # command name -> redis-py's response callback, or None

    async def send(self, commands: Sequence[tuple[Sequence[Any], dict[str, Any]]], *,
                   transaction: bool = False, replicas: tuple[int, int] | None = None) -> list[Any]:
        """Send (args, options) commands in one write; each one's result, a refused one's error
        among them, as a redis-py pipeline gives them.

        ``transaction``: wrapped in MULTI/EXEC, so Redis applies them as a whole (and a reader
        blocked on their keys wakes once, for all of them). One refused while queued (out of
        memory, an ACL, a read-only replica, a malformed command) means none is applied: that
        refusal is raised. A broken connection fails the whole send (the bus's connections have
        no redis-py retries) and the next send connects afresh; a send cut short (cancelled
        mid-read) drops the connection rather than leave replies unread on it.
        """
        if self._connection is None:
            self._connection = await self.redis.connection_pool.get_connection()  # type: ignore[no-untyped-call]  # redis-py: unannotated
            # How its replies are read is fixed for its life (its parser survives reconnects).
            self._read = _hiredis_reader(self._connection) or _raising_reader(self._connection)
        connection, read = self._connection, self._read
        assert read is not None
        if connection.is_connected and _closed_by_server(connection):
            # Redis restarted or failed over since the last send: nothing is sent yet, so reconnecting
            # now loses nothing, where sending would fail the whole batch ("Connection closed by server").
            await connection.disconnect(nowait=True)
        if not connection.is_connected:
            # connect() is the connection class's own: a Sentinel-managed one asks where the master is
            # now (send_packed_command's implicit reconnect would go back to the old address).
            await connection.connect()
        wire = [args for args, _ in commands]
        if transaction:
            wire = [("MULTI",), *wire, ("EXEC",)]
        if replicas is not None:  # after the writes, on their connection: WAIT counts this client's writes
            wire = [*wire, ("WAIT", *replicas)]
        try:
            await connection.send_packed_command(connection.pack_commands(wire))
            replies = [refusal(await read()) for _ in wire]
        except BaseException as exc:
            await connection.disconnect(nowait=True)
            if isinstance(exc, CONNECTION_ERRORS):
                raise away(exc) from exc
            raise
        short = None
        if replicas is not None:
            confirmed = replies.pop()
            if not isinstance(confirmed, int) or confirmed < replicas[0]:
                short = (f"{confirmed} of the {replicas[0]} replicas redis.min_replicas asks for confirmed the write "
                         f"within {replicas[1]} ms")
        if transaction:
            applied = replies[-1]
            if not isinstance(applied, list):  # EXECABORT: the refusal is among the QUEUED replies
                if short:  # a demoted primary refuses writes: nothing applied, and sending again is safe
                    raise NotReplicated(short)
                raise next((r for r in replies if isinstance(r, ResponseError)),
                           RedisRefused(f"transaction not applied: {applied!r}"))
            replies = applied
        try:
            results = [self._parsed(args[0], reply, options)
                       for (args, options), reply in zip(commands, replies, strict=True)]
        except Exception:
            if short:  # unconfirmed all the same: what the primary applied is not known to the caller
                raise NotReplicated(short) from None
            raise
        if short:
            raise NotReplicated(short, results)
        return results

    def _parsed(self, command: str | bytes, reply: Any, options: dict[str, Any]) -> Any:
        """A reply as ``Redis.parse_response`` (or a transaction pipeline) would give it: redis-py's
        callback for the command, with the command's options; a refusal as it is.

        Read straight from the hiredis parser, a reply skips ``parse_response``'s layers (its
        connection's ``read_response``, the case-insensitive callback lookup): ~1 µs of ~3.5 per
        command in a batch, on every tool call's two XADDs. (The connection's health-check clock
        is not advanced this way: an idle-time PING goes out every ``health_check_interval``
        under load too, which costs nothing.)
        """
        if isinstance(reply, ResponseError):
            return options.get(EMPTY_RESPONSE, reply)
        callback = self._callbacks.get(command, _UNKNOWN)
        if callback is _UNKNOWN:
            callback = self._callbacks[command] = self.redis.response_callbacks.get(command)
        if callback is None:
            return reply
        if options:  # the parser's own directives are not the callback's
            return callback(reply, **{k: v for k, v in options.items() if k not in _PARSER_OPTIONS})
        return callback(reply)

    async def execute(self, *args: Any) -> Any:
        """One command's result; a refusal is raised."""
        (result,) = await self.send([(args, {})])
        if isinstance(result, ResponseError):
            raise result
        return result

    async def aclose(self) -> None:
        """Give the connection back to the pool."""
        if self._connection is not None:
            connection, self._connection = self._connection, None
            await self.redis.connection_pool.release(connection)
