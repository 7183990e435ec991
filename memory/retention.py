"""Retention: what Redis holds has a lifetime (``runtime.retention``, docs/operations.md "Retention").

One pass, run by whichever Gateway holds the retention lease (``RetentionLoop``): the Gateway is the
role that reads the archive back (lists and shows archived sessions), so its data dir is where the
files belong; the lease makes it once per pool, not once per replica.

- A session whose last message is older than ``transcript_days`` is archived (memory/archive.py),
  then removed from Redis by ``SessionStore.delete`` (the one way a session goes: its transcript,
  event log, flight record, title, and its words in the memory log). The file is written and fsynced
  before anything is removed, and rewriting it merges (each entry once): a pass killed between the
  two is finished by the next one, nothing lost and nothing twice. The session's own keys go first,
  in one script that checks no message came since the file was written; a pass killed after that is
  finished by the next too (the session is still listed: ``delete`` takes it off and forgets it).
- Dead letters and alerts older than their days are trimmed (``XTRIM MINID``); their lengths are
  capped where they are written (``redis.dead_maxlen``, ``redis.alerts_maxlen``).

Session event logs and call records lapse by their own TTLs where they are written
(``gateway.events.keep_s``/``keep``, ``hands.call_record_s``): nothing to sweep.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass

from pydantic import ValidationError
from redis import exceptions as redis_errors

from bus.lease import Lease
from bus.log import kv
from bus.loops import every, finish
from bus.redis_client import RedisAway
from bus.scripts import lua
from bus.settings import RetentionSettings
from bus.streams import Bus
from bus.text import text
from memory.archive import Archived, SessionArchive
from memory.flight import KEEP_DAYS, FlightRecorder
from memory.sessions import SessionStore, session_keys, stored_bytes

log = logging.getLogger("memory.retention")
GONE_WORKER_S = 3600.0  # a gone worker's stream is deleted once nothing came to it for this long
PASS_S = 60.0  # a retention pass archives for at most this long (or half its interval), then yields
DAY_S = 86_400

# KEYS: the transcript, then the session's other keys (one slot: all are tagged with its id). ARGV: the
# entries archived. Removed only if no message came since the file was written (checked and done at once).
REMOVE_IF_UNCHANGED = lua("memory.retention.remove_if_unchanged", """
if redis.call('LLEN', KEYS[1]) ~= tonumber(ARGV[1]) then return 0 end
redis.call('DEL', unpack(KEYS))
return 1
""")


@dataclass
class Swept:
    archived: int = 0
    dead_letters: int = 0
    alerts: int = 0
    indexed: int = 0  # sessions put in their owner's list (memory/session_index.py)
    lapsed: int = 0  # sessions whose transcript had lapsed, taken off the lists
    worker_streams: int = 0  # streams of Hands workers gone (drop_gone_workers)


class Archiver:
    """Moves idle sessions from Redis to the archive, and reads them back."""

    def __init__(self, bus: Bus, archive: SessionArchive, *, clock: Callable[[], float] = time.time) -> None:
        self.bus, self.archive, self.clock = bus, archive, clock
        self.sessions = SessionStore(bus.redis, bus.keys)
        self.record = FlightRecorder(bus.redis, bus.keys, keep_s=0)
        self._remove_if_unchanged = bus.redis.register_script(REMOVE_IF_UNCHANGED)

    async def idle(self, keep_days: float, *, most: int, skip: int = 0) -> list[str]:
        """Sessions with no message for ``keep_days``, the longest idle first (past the first ``skip``)."""
        before = self.clock() - keep_days * DAY_S
        found = await self.bus.redis.zrangebyscore(self.bus.keys.sessions, "-inf", before, start=skip, num=most)
        return [text(s) for s in found]

    async def gather(self, session_id: str) -> Archived | None:
        """The session as it stands in Redis, or None when its transcript is gone."""
        owner, exists = await self.sessions.ownership(session_id)
        if not exists or owner is None:
            return None
        about = (await self.sessions.about([session_id]))[0]
        about.pop("id")
        return Archived(session_id, owner, about, await self.sessions.load(session_id),
                        await self.record.export(session_id), archived_at=self.clock())

    async def archive_one(self, session_id: str, *,
                          after_write: Callable[[], Awaitable[None]] | None = None) -> bool:
        """Archive the session then remove it from Redis; whether it was archived now."""
        gathered = await self.gather(session_id)
        if gathered is None:  # lapsed, or its keys removed by a pass that died before the rest: finish
            await self.sessions.drop_lapsed([session_id])
            return False
        self.archive.write(gathered)  # fsynced: from here the session is safe on disk
        if after_write is not None:
            await after_write()  # tests stop here, as a kill -9 would, or speak meanwhile
        keys = [self.bus.keys.transcript(session_id), *session_keys(self.bus.keys, session_id)]
        if not await self._remove_if_unchanged(keys=keys, args=[len(gathered.entries)]):
            return False  # a message came meanwhile: not idle any more; the file merges it next time
        # Off the lists, and its words out of the memory log; unless someone spoke in it since the removal
        # (its owner is back): then it is theirs, and nothing of it may go.
        await self.sessions.drop_lapsed([session_id])
        log.info("session archived %s", kv(session=session_id, entries=len(gathered.entries)))
        return True

    def read(self, owner: str, session_id: str) -> Archived | None:
        return self.archive.read(owner, session_id)

    async def restore(self, owner: str, session_id: str, *,
                      charge: Callable[[int], Awaitable[object]] | None = None) -> bool:
        """Put an archived session back in Redis (its transcript, owner and title) and drop its file;
        False when there is none or the name is in use again. ``charge`` is told the bytes about to be
        written, before anything is (it may refuse)."""
        archived = self.archive.read(owner, session_id)
        if archived is None or await self.sessions.exists(session_id):
            return False
        if charge is not None:
            await charge(stored_bytes(archived.entries)
                         + sum(len(line.encode()) for line in archived.record))
        await self.bus.redis.set(self.bus.keys.session_owner(session_id), owner, nx=True)
        await self.sessions.append(session_id, *archived.entries)
        if archived.about.get("named") and archived.about.get("title"):
            await self.sessions.rename(session_id, str(archived.about["title"]))
        if archived.record:
            await FlightRecorder(self.bus.redis, self.bus.keys, keep_s=int(KEEP_DAYS * DAY_S)).import_lines(
                session_id, archived.record)
        self.archive.remove(owner, session_id)
        return True


async def drop_gone_workers(bus: Bus, *, now: float, interval_s: float) -> int:
    """Delete the stream of each Hands worker that is gone (every start has a new id, so each restart
    left one): found so by two passes in a row, with nothing sent to it for GONE_WORKER_S. A worker whose
    heartbeat is late once (a Redis blip, a skewed clock) is not taken for gone; a call in a gone one's
    stream would never be read, and its caller gave up long ago. How many were deleted."""
    from bus.presence import alive  # here: only a retention pass asks

    prefix, live = bus.keys.hands_worker(""), set(await alive(bus, "hands"))
    suspects = {text(m)
                for m in await bus.redis.smembers(bus.keys.hands_workers_gone)}
    gone: list[str] = []
    async for raw in bus.redis.scan_iter(match=f"{prefix}*", count=500, _type="stream"):
        worker_id = text(raw)[len(prefix):]
        if worker_id in live:
            continue
        try:
            last = (await bus.redis.xinfo_stream(prefix + worker_id))["last-generated-id"]
        except redis_errors.ResponseError:  # deleted meanwhile
            continue
        if now * 1000 - int(text(last).partition("-")[0]) > \
                GONE_WORKER_S * 1000:
            gone.append(worker_id)
    dropped = [w for w in gone if w in suspects]
    async with bus.redis.pipeline(transaction=False) as pipe:
        if dropped:
            pipe.delete(*[prefix + w for w in dropped])
        pipe.delete(bus.keys.hands_workers_gone)
        if suspected := [w for w in gone if w not in suspects]:
            pipe.sadd(bus.keys.hands_workers_gone, *suspected)
            pipe.expire(bus.keys.hands_workers_gone, int(interval_s * 3))
        await pipe.execute()
    return len(dropped)


async def trim_older(bus: Bus, stream: str, days: float, *, now: float) -> int:
    """Entries of ``stream`` older than ``days`` removed (ids are milliseconds since the epoch)."""
    floor_ms = int((now - days * DAY_S) * 1000)
    return int(await bus.redis.xtrim(stream, minid=f"{max(floor_ms, 0)}-0", approximate=False))


async def sweep(archiver: Archiver, settings: RetentionSettings) -> Swept:
    """One retention pass over the pool."""
    swept, now = Swept(), archiver.clock()
    if settings.transcript_days is not None:
        try:
            await _archive_idle(archiver, settings, swept)
        except (redis_errors.RedisError, RedisAway):
            raise  # the rest of the pass needs Redis too
        except Exception:  # a full disk, say: the trims and the rest below must still run
            log.exception("archiving idle sessions failed; the rest of the retention pass goes on")
    keys = archiver.bus.keys
    if settings.dead_letter_days is not None:
        swept.dead_letters = await trim_older(archiver.bus, keys.dead, settings.dead_letter_days, now=now)
    if settings.alert_days is not None:
        swept.alerts = await trim_older(archiver.bus, keys.alerts, settings.alert_days, now=now)
    swept.worker_streams = await drop_gone_workers(archiver.bus, now=time.time(), interval_s=settings.interval_s)
    # Last, so a failure here leaves the trims done: what an older release's writer missed, and what lapsed
    caught = await archiver.sessions.catch_up()
    swept.indexed, swept.lapsed = caught.put, caught.dropped
    return swept


async def _archive_idle(archiver: Archiver, settings: RetentionSettings, swept: Swept) -> None:
    """Batch after batch until no idle session is left or the pass has taken its time: one batch an
    interval would fall behind a pool that starts more sessions than that."""
    assert settings.transcript_days is not None
    ends, unreadable = time.monotonic() + min(PASS_S, settings.interval_s / 2), 0
    while True:
        found = await archiver.idle(settings.transcript_days, most=settings.batch, skip=unreadable)
        for session_id in found:
            try:
                swept.archived += await archiver.archive_one(session_id)
            except (ValidationError, ValueError) as exc:  # one unreadable session must not stop the rest
                log.warning("session not archived %s", kv(session=session_id, error=exc))
                unreadable += 1  # still at the head of the idle ones: the next batch starts past it
        if len(found) < settings.batch or time.monotonic() > ends:
            return


class RetentionLoop:
    """Every ``interval_s``, the one Gateway holding the lease sweeps (a holder that dies lets it lapse)."""

    def __init__(self, archiver: Archiver, settings: RetentionSettings, *, holder: str) -> None:
        self.archiver, self.settings = archiver, settings
        bus = archiver.bus
        self.lease = Lease(bus.redis, bus.keys.retention_lease, holder, ttl_ms=int(settings.interval_s * 2000))
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="retention")

    async def close(self) -> None:
        await finish(self._task, self._stop, grace_s=10)
        with contextlib.suppress(redis_errors.RedisError, OSError):
            await self.lease.release()

    async def _loop(self) -> None:
        async for _ in every(self.settings.interval_s, self._stop):
            try:
                if await self.lease.take():
                    counts = asdict(await sweep(self.archiver, self.settings))
                    if any(counts.values()):
                        log.info("retention pass %s", kv(**counts))
            except (redis_errors.RedisError, OSError) as exc:
                log.warning("retention pass failed: %s", exc)
            except Exception:  # a loop that ended would let Redis grow again, silently
                log.exception("retention pass failed unexpectedly; the next pass tries again")
