"""Taking a platform's updates into the channel's inbox stream: by long polling (one poller per bot across
the replicas, under a fenced lease) or by a webhook (every replica serves it). Either way an update is
taken only once the bus holds it, and never twice."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Coroutine
from functools import partial
from typing import Any, TypeVar

from bus.codec import encode
from bus.lease import HOLDS, Lease
from bus.loops import sleep_or_stop
from bus.presence import alive
from bus.protocol import ChannelUpdate
from bus.redis_client import RedisAway
from bus.scripts import lua
from bus.streams import Bus
from gateway.channels.config import ChannelCommon
from gateway.channels.errors import PlatformAway, PlatformRefused
from gateway.channels.platform import Heard, Listening, Platform, Polled, Webhooked, backoff
from gateway.channels.report import Progress

log = logging.getLogger("gateway.channels")
T = TypeVar("T")

ROLE = "channel"
INBOX_KEEP = 10_000  # inbox entries kept (acknowledged ones are only history)

# KEYS: lease, inbox, offset. ARGV: holder, new offset, inbox length kept, then each entry as its
# field count and its fields. -1: the lease is not ours (nothing written); 1: written.
TAKE_UPDATES = lua("gateway.channels.intake.take_updates", HOLDS + """
local i = 4
while i <= #ARGV do
  local n = tonumber(ARGV[i])
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[3], '*', unpack(ARGV, i + 1, i + n))
  i = i + n + 1
end
redis.call('SET', KEYS[3], ARGV[2])
return 1
""")
# KEYS: seen, inbox. ARGV: keep s, inbox length kept, then the entry's fields. 1: written; 0: a repeat.
TAKE_PUSHED = lua("gateway.channels.intake.take_pushed", """
if not redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[1]) then return 0 end
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[2], '*', unpack(ARGV, 3))
return 1
""")
PUSHED_KEEP_S = 86_400  # a platform retries a webhook delivery for hours at most
LISTEN_CHECK_S = 1.0  # how often a kept connection is looked at (its progress)
CONNECT_S = 90.0  # a connection not made in this long is made afresh (a platform may bound it tighter)
# KEYS: lease. ARGV: the dead holder, us, ttl ms. The lease of a holder whose heartbeat stopped, taken.
TAKE_OVER = lua("gateway.channels.intake.take_over", """
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3]) return 1 end
return 0
""")


class Intake:
    def __init__(self, bus: Bus, platform: Platform, settings: ChannelCommon, *, instance_id: str,
                 progress: Progress) -> None:
        self.bus, self.platform, self.settings = bus, platform, settings
        self.instance_id, self.progress = instance_id, progress
        self.name = platform.name
        self.hung_s = settings.poll_timeout_s + 2 * settings.poll_grace_s  # a poll this long has hung
        self._take = bus.redis.register_script(TAKE_UPDATES)
        self._take_over = bus.redis.register_script(TAKE_OVER)
        self._take_pushed = bus.redis.register_script(TAKE_PUSHED)

    async def run(self, stop: asyncio.Event) -> None:
        hooked = self.platform if isinstance(self.platform, Webhooked) else None
        if hooked is not None and hooked.webhook_url:
            from gateway.channels.webhook import serve_webhook  # a web server only for a channel that takes one

            await serve_webhook(hooked, self.take_event, self.progress, stop)
        elif isinstance(self.platform, Listening):
            await self._listen(self.platform, stop)
        elif isinstance(self.platform, Polled):
            await self._poll(self.platform, hooked, stop)
        else:
            raise TypeError(f"{self.name}: the platform neither polls, listens nor takes a webhook")

    # --- a connection the platform pushes events over: every replica keeps one ---

    async def _listen(self, listening: Listening, stop: asyncio.Event) -> None:
        """Keep the platform's connection until ``stop``. Its progress is what arrives on it (a platform that
        can say: ``Heard``), else being connected; a connection silent or down past stall_s is replaced here,
        on the kit's own backoff (capped, with jitter), whatever the library's reconnecting would do."""
        failures, down_since = 0, 0.0
        try:
            while not stop.is_set():
                try:
                    if not self.progress.polling:
                        try:
                            await abandoned_after(CONNECT_S, listening.listen(self.take_event),
                                                  what=f"{self.name} connect")
                        except TimeoutError as exc:  # a handshake into a dead network can hang for minutes
                            raise PlatformAway(str(exc)) from None
                        self.progress.polling, down_since, failures = True, 0.0, 0
                        log.info("%s: connected", self.name)
                    heard = await listening.heard() if isinstance(listening, Heard) else None
                    if heard is not None:
                        self.progress.last = heard
                        quiet = time.time() - heard
                        if quiet > self.settings.stall_s:
                            raise PlatformAway(f"nothing arrived for {quiet:.0f}s (stall_s {self.settings.stall_s:g})")
                    elif await listening.connected():
                        self.progress.last, down_since = time.time(), 0.0
                    else:
                        down_since = down_since or time.monotonic()
                        if time.monotonic() - down_since > self.settings.stall_s:
                            raise PlatformAway(f"disconnected for {self.settings.stall_s:g}s")
                    await sleep_or_stop(stop, LISTEN_CHECK_S)
                except PlatformAway as exc:
                    self.progress.failed(exc)
                    self.progress.polling = False
                    delay = backoff(failures, exc.retry_after, jitter=True)
                    failures += 1
                    log.warning("%s connect: %s; again in %.1fs", self.name, exc, delay)
                    with contextlib.suppress(TimeoutError):  # closing waits on the far end, which may be gone
                        await abandoned_after(self.settings.poll_grace_s, self.platform.close(),
                                              what=f"{self.name} close")
                    await sleep_or_stop(stop, delay)
        finally:
            self.progress.polling = False

    async def take_event(self, event_id: str, update: ChannelUpdate | None) -> bool:
        """An event pushed to us, in the inbox once (a platform redelivers until acknowledged): whether it
        may be acknowledged (False while Redis is away: the platform delivers it again)."""
        if update is None:
            return True
        try:
            if await self._store_once(event_id, update):
                self.progress.counts["in"] += 1
        except RedisAway as exc:
            self.progress.failed(exc)
            log.warning("%s: Redis away (%s); event %s left with the platform", self.name, exc, event_id)
            return False
        self.progress.last = time.time()
        return True

    async def _store_once(self, event_id: str, update: ChannelUpdate) -> bool:
        inbox = self.bus.keys.channel_inbox(self.name, self.platform.bot_id)
        seen = self.bus.keys.channel_delivery(self.name, f"pushed:{event_id}")
        args: list[Any] = [PUSHED_KEEP_S, INBOX_KEEP]
        for key, value in encode(update).items():
            args.extend((key, value))
        return bool(await self._take_pushed(keys=[seen, inbox], args=args))

    async def _poll(self, polled: Polled, hooked: Webhooked | None, stop: asyncio.Event) -> None:
        if hooked is not None:
            with contextlib.suppress(PlatformAway, PlatformRefused):  # polling cannot start while a webhook is set
                await hooked.drop_webhook()
        lease = Lease(self.bus.redis, self.bus.keys.channel_poller(self.name, self.platform.bot_id),
                      self.instance_id, ttl_ms=int((self.hung_s + self.settings.poll_grace_s) * 1000))
        failures = 0
        try:
            while not stop.is_set():
                try:
                    if not await lease.take() and not await self._take_over_dead(lease):
                        self.progress.polling = False
                        await sleep_or_stop(stop, min(5.0, lease.ttl_ms / 3000))
                        continue
                    self.progress.polling = True
                    await self._poll_once(polled, lease)
                    failures = 0
                except PlatformAway as exc:
                    self.progress.failed(exc)
                    delay = backoff(failures, exc.retry_after)
                    failures += 1
                    log.warning("%s poll: %s; again in %.1fs", self.name, exc, delay)
                    await sleep_or_stop(stop, delay)
                except TimeoutError:  # a poll that hung past its own timeout: a fresh connection
                    self.progress.failed(TimeoutError("a poll hung; reconnecting"))
                    failures += 1
                    log.warning("%s poll hung past %ss; reconnecting", self.name, self.hung_s)
                    with contextlib.suppress(TimeoutError):
                        await abandoned_after(self.settings.poll_grace_s, self.platform.close(),
                                              what=f"{self.name} close")
                except PlatformRefused as exc:  # e.g. the token was revoked: said, then tried again slowly
                    self.progress.failed(exc)
                    log.error("%s poll refused: %s", self.name, exc)
                    await sleep_or_stop(stop, 30.0)
                except RedisAway as exc:
                    self.progress.failed(exc)
                    failures += 1
                    log.warning("%s poll: Redis away (%s)", self.name, exc)
                    await sleep_or_stop(stop, backoff(failures))
                except Exception as exc:  # a poller that ended would leave the bot deaf, silently
                    self.progress.failed(exc)
                    log.exception("%s poll failed unexpectedly; again in 5s", self.name)
                    await sleep_or_stop(stop, 5.0)
        finally:
            self.progress.polling = False
            with contextlib.suppress(RedisAway):
                await lease.release()

    async def _take_over_dead(self, lease: Lease) -> bool:
        """The lease of a holder whose heartbeat has stopped (killed, its host gone): ours at once."""
        holder: bytes | None = await self.bus.redis.get(lease.key)  # type: ignore[assignment]  # bytes
        if holder is None or holder.decode() in await alive(self.bus, ROLE):
            return False
        lease.held = bool(await self._take_over(keys=[lease.key], args=[holder, self.instance_id, lease.ttl_ms]))
        if lease.held:
            log.info("%s poller taken over from %s (no heartbeat)", self.name, holder.decode())
        return lease.held

    async def _poll_once(self, polled: Polled, lease: Lease) -> None:
        offset_key = self.bus.keys.channel_offset(self.name, self.platform.bot_id)
        stored: bytes | None = await self.bus.redis.get(offset_key)  # type: ignore[assignment]  # bytes
        offset = stored.decode() if stored else ""
        next_offset, updates = await abandoned_after(self.hung_s, polled.poll(offset), what=f"{self.name} poll")
        if next_offset != offset:
            args: list[Any] = [self.instance_id, next_offset, INBOX_KEEP]
            for update in updates:
                fields = encode(update)
                args.append(len(fields) * 2)
                for key, value in fields.items():
                    args.extend((key, value))
            inbox = self.bus.keys.channel_inbox(self.name, self.platform.bot_id)
            if await self._take(keys=[lease.key, inbox, offset_key], args=args) != 1:
                lease.held = False  # another poller holds it now: it fetches these again
                return
            self.progress.counts["in"] += len(updates)
        self.progress.last = time.time()


async def abandoned_after(seconds: float, work: Coroutine[Any, Any, T], *, what: str) -> T:
    """``work``'s result, or TimeoutError after ``seconds``. Run as a task of its own so that a library
    that swallows cancellation (and would hang a plain timeout with it) cannot hold the caller: the task
    is cancelled and left behind, and whatever it ends with later is only logged."""
    task = asyncio.ensure_future(work)
    done, _ = await asyncio.wait({task}, timeout=seconds)
    if task in done:
        return task.result()
    task.cancel()
    task.add_done_callback(partial(_left_behind, what))
    raise TimeoutError(f"{what} did not finish in {seconds:g}s")


def _left_behind(what: str, task: asyncio.Future[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.info("%s, abandoned, ended with %r", what, task.exception())
