"""What operators ask of a running pool: its status, and the dead-letter stream.

Plain async functions over a Bus returning JSON-ready dicts; the CLI renders
them (``pincer status``, ``pincer dead ...``), scripts take ``--json``.
"""

from __future__ import annotations

import json
import time
from typing import Any, cast

from redis.exceptions import ResponseError

from bus.codec import MalformedMessage, decode
from bus.keys import BRAIN_GROUP, HANDS_GROUP
from bus.presence import ROLES, instances
from bus.records import DeadLetter
from bus.streams import Bus
from bus.text import text


async def status(bus: Bus, *, with_metrics: bool = False) -> dict[str, Any]:
    """The pool now; ``with_metrics``: with each instance's counters (for /metrics) as well."""
    now = time.time()
    roles: dict[str, list[dict[str, Any]]] = {}
    backlog: dict[str, Any] = {}  # the pool's, as the worker with the freshest heartbeat measured it
    freshest = float("inf")
    for role in ROLES:
        roles[role] = []
        for info in await instances(bus, role):
            beat = float(info.get("beat", now))
            if not with_metrics:
                info.pop("metrics", None)
            mcp = _json_field(info.pop("mcp", None))
            lanes = _json_field(info.pop("backlog", None))
            if role == "hands" and now - beat < freshest:
                backlog, freshest = lanes, now - beat
            roles[role].append({**info, **({"mcp": mcp} if mcp else {}), "last_heartbeat_s": round(now - beat, 1)})
    queues = [await _stream(bus, "hands:requests", bus.keys.hands_requests, HANDS_GROUP),
              await _stream(bus, "brain:inbox", bus.keys.brain_inbox, BRAIN_GROUP)]
    async for key in bus.redis.scan_iter(match=f"{bus.keys.hands_worker('')}*", count=500, _type="stream"):
        name = key.decode()
        queues.append(await _stream(bus, name[len(bus.keys.prefix):], name, HANDS_GROUP))
    for lane in sorted(await bus.redis.smembers(bus.keys.hands_lanes)):
        key = bus.keys.hands_lane(text(lane))
        queues.append(await _stream(bus, key[len(bus.keys.prefix):], key, HANDS_GROUP))
    return {"time": now, "prefix": bus.keys.prefix, "instances": roles, "streams": queues, "backlog": backlog,
            "channels": channel_states(roles["channel"], now=now), "dead": await bus.redis.xlen(bus.keys.dead),
            "scheduler": await scheduler_state(bus, now), "versions": versions(roles),
            "schema": int(await bus.redis.get(bus.keys.schema) or 1), "redis_memory": await redis_memory(bus)}


async def redis_memory(bus: Bus) -> dict[str, Any]:
    """Redis's memory against its bound (``redis.memory_bound_mb``, else Redis's own maxmemory), and a
    warning from ``redis.memory_warn_ratio`` of it, or when Redis would evict keys (Pincer's streams and
    records must never be dropped silently: it must refuse writes instead)."""
    info = await bus.redis.info("memory")
    used, maxmemory = int(info.get("used_memory", 0)), int(info.get("maxmemory", 0))
    policy = info.get("maxmemory_policy", "noeviction")
    policy = text(policy)
    configured = bus.settings.memory_bound_mb
    bound = int(configured * 2**20) if configured else maxmemory or None
    warnings = []
    if bound and used >= bound * bus.settings.memory_warn_ratio:
        warnings.append(f"Redis uses {used / 2**20:,.0f} MB of its {bound / 2**20:,.0f} MB bound "
                        f"({used / bound:.0%}): shorten retention or raise the bound (docs/operations.md)")
    if maxmemory and policy != "noeviction":
        warnings.append(f"Redis evicts keys when full (maxmemory-policy {policy}): Pincer's data could vanish "
                        "without a word; set maxmemory-policy noeviction")
    return {"used_bytes": used, "bound_bytes": bound, "policy": policy, "warnings": warnings}


def versions(roles: dict[str, list[dict[str, Any]]]) -> dict[str, list[str]]:
    """The releases the live processes run (version: instance ids); more than one is a rolling upgrade
    in progress, or one that stopped half-way (docs/upgrades.md)."""
    found: dict[str, list[str]] = {}
    for role in roles.values():
        for info in role:
            found.setdefault(str(info.get("version") or "unknown"), []).append(str(info.get("id", "")))
    return dict(sorted(found.items()))


async def scheduler_state(bus: Bus, now: float) -> dict[str, Any]:
    """The jobs' scheduler: idle (no job due), running, or stalled (jobs are due and the holder of its lease
    has not looked for SCHEDULER_STALL_S, or a job is overdue by more than JOB_OVERDUE_S)."""
    jobs = int(await bus.redis.zcard(bus.keys.jobs_due))
    tick: bytes | None = await bus.redis.get(bus.keys.scheduler_tick)  # type: ignore[assignment]  # bytes
    tick_age = round(now - float(tick), 1) if tick else None
    oldest: list[tuple[bytes, float]] = await bus.redis.zrange(bus.keys.jobs_due, 0, 0,  # type: ignore[assignment]
                                                               withscores=True)
    overdue = round(max(0.0, now - float(oldest[0][1]) / 1000), 1) if oldest else 0.0
    state = "idle" if not jobs else "stalled" if tick_age is None or tick_age > SCHEDULER_STALL_S \
        or overdue > JOB_OVERDUE_S else "running"
    return {"state": state, "jobs": jobs, "last_tick_s_ago": tick_age, "overdue_s": overdue,
            "overdue_job": oldest[0][0].decode() if oldest and overdue > JOB_OVERDUE_S else ""}


SCHEDULER_STALL_S = 10.0  # the holder looks every second at most: this long without, it has stalled
JOB_OVERDUE_S = 60.0  # a due instant not fired this long after


def channel_states(running: list[dict[str, Any]], *, now: float | None = None) -> list[dict[str, Any]]:
    """Each chat channel's state from its instances' heartbeats: connected (its poller made progress within
    its stall_s), stalled, or no poller (replicas alive, none holding the poll lease); messages and errors."""
    now = time.time() if now is None else now
    states = []
    for name in sorted({i.get("channel", "") for i in running} - {""}):
        replicas = [i for i in running if i.get("channel") == name]
        poller = next((i for i in replicas if i.get("polling") == "1"), None)
        progress = float(poller.get("last_progress") or 0) if poller else 0.0
        age = round(now - progress, 1) if progress else None
        stall = float(poller.get("stall_s") or 90) if poller else 90.0
        state = "no poller" if poller is None else "stalled" if age is None or age > stall else "connected"
        states.append({"channel": name, "state": state, "replicas": len(replicas),
                       "bot": (poller or replicas[0]).get("username", ""), "last_progress_s_ago": age,
                       "in": sum(int(i.get("in") or 0) for i in replicas),
                       "out": sum(int(i.get("out") or 0) for i in replicas),
                       "errors": sum(int(i.get("errors") or 0) for i in replicas),
                       "last_error": next((i["last_error"] for i in replicas if i.get("last_error")), "")})
    return states


async def channel_rows(bus: Bus, enabled: list[str]) -> list[dict[str, Any]]:
    """What `pincer channels` and ``GET /v1/channels`` show: each channel that runs or is enabled, by name, with
    its state (``not running`` for an enabled one with no live instance) and whether the config enables it."""
    found = {row["channel"]: row for row in channel_states(await instances(bus, "channel"))}
    idle = {"state": "not running", "replicas": 0, "bot": "", "last_progress_s_ago": None, "in": 0, "out": 0,
            "errors": 0, "last_error": ""}
    return [{**found.get(name, {"channel": name, **idle}), "enabled": name in enabled}
            for name in sorted({*enabled, *found})]


def _json_field(raw: str | None) -> dict[str, Any]:
    """A heartbeat field written as JSON (MCP server states); empty when absent or garbage."""
    try:
        value = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


async def _stream(bus: Bus, label: str, key: str, group: str) -> dict[str, Any]:
    found: dict[str, Any] = {"stream": label, "length": 0, "group": group, "pending": 0, "undelivered": 0,
                             "oldest_pending_s": None, "consumers": 0}
    if not await bus.redis.exists(key):
        return found
    found["length"] = await bus.redis.xlen(key)
    groups = {text(g["name"]): g
              for g in await bus.redis.xinfo_groups(key)}
    info = groups.get(group)
    if info is None:
        return found
    found["consumers"] = info.get("consumers", 0)
    found["undelivered"] = await undelivered(bus, key, info)
    summary = await bus.redis.xpending(key, group)
    found["pending"] = summary["pending"]
    if summary["pending"]:
        oldest_ms = int(summary["min"].decode().split("-")[0])
        found["oldest_pending_s"] = round(time.time() - oldest_ms / 1000, 1)
    return found


async def undelivered(bus: Bus, key: str, group: dict[str, Any], *, cap: int = 10_000) -> int:
    """Entries of ``key`` that ``group`` has not read yet: its lag on Redis 7, counted (up to ``cap``) on 6.2."""
    if group.get("lag") is not None:
        return int(group["lag"])
    last = text(group["last-delivered-id"])
    return len(await bus.redis.xrange(key, min=f"({last}", count=cap) or [])


async def unread(bus: Bus, key: str, group_name: str, *, cap: int = 10_000) -> int:
    """Entries of stream ``key`` that group ``group_name`` has not read yet (all of them before the group
    exists; none before the stream does)."""
    try:
        groups: list[dict[str, Any]] = await bus.redis.xinfo_groups(key)
    except ResponseError:  # no such key
        return 0
    group = next((g for g in groups if g.get("name") in (group_name, group_name.encode())), None)
    if group is None:
        return int(await bus.redis.xlen(key))
    return await undelivered(bus, key, group, cap=cap)


Entries = list[tuple[bytes, dict[bytes, bytes]]]


async def _dead(bus: Bus, *, newest_first: bool = False, **bounds: Any) -> Entries:
    """Entries of the dead-letter stream, as bytes (the bus's client never decodes)."""
    read = bus.redis.xrevrange if newest_first else bus.redis.xrange
    return cast(Entries, await read(bus.keys.dead, **bounds) or [])


async def dead_list(bus: Bus, *, limit: int = 50) -> list[dict[str, Any]]:
    """The newest dead-lettered entries first."""
    return [_describe(raw_id, fields) for raw_id, fields in await _dead(bus, newest_first=True, count=limit)]


async def dead_show(bus: Bus, entry_id: str) -> dict[str, Any] | None:
    found = await _dead(bus, min=entry_id, max=entry_id)
    if not found:
        return None
    raw_id, fields = found[0]
    described = _describe(raw_id, fields)
    try:
        described["message"] = decode(DeadLetter.decode(fields).original).model_dump(mode="json")
    except MalformedMessage as exc:
        described["message"] = None
        described["raw"] = {k.decode(errors="replace"): v.decode(errors="replace") for k, v in fields.items()}
        described["malformed"] = str(exc)
    return described


async def dead_retry(bus: Bus, entry_ids: list[str] | None) -> list[dict[str, str]]:
    """Put entries back on the stream they came from (as new entries); ``None``: all of them."""
    entries = await _select(bus, entry_ids)
    moved = []
    for raw_id, fields in entries:
        letter = DeadLetter.decode(fields)
        source = letter.source
        if not source:
            continue
        async with bus.redis.pipeline(transaction=False) as pipe:  # two cluster slots: added first, then removed
            pipe.xadd(source, cast(dict[Any, Any], letter.original))
            pipe.xdel(bus.keys.dead, raw_id)
            new_id, _ = await pipe.execute()
        moved.append({"dead_id": raw_id.decode(), "stream": source, "new_id": new_id.decode()})
    return moved


async def dead_purge(bus: Bus, entry_ids: list[str] | None) -> int:
    """Delete entries for good; ``None``: all of them."""
    if entry_ids is None:
        count = await bus.redis.xlen(bus.keys.dead)
        await bus.redis.delete(bus.keys.dead)
        return int(count)
    return int(await bus.redis.xdel(bus.keys.dead, *entry_ids)) if entry_ids else 0


async def _select(bus: Bus, entry_ids: list[str] | None) -> Entries:
    if entry_ids is None:
        return await _dead(bus)
    selected: Entries = []
    for entry_id in entry_ids:
        selected += await _dead(bus, min=entry_id, max=entry_id)
    return selected


def _describe(raw_id: bytes, fields: dict[bytes, bytes]) -> dict[str, Any]:
    letter = DeadLetter.decode(fields)
    at_ms = int(raw_id.decode().split("-")[0])
    return {"id": raw_id.decode(), "at": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at_ms / 1000)),
            "source": letter.source, "group": letter.group, "reason": letter.reason,
            "type": letter.original.get(b"type", b"?").decode(errors="replace")}
