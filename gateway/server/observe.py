"""``/metrics`` and ``/readyz``: the pool as an orchestrator and Prometheus see it.

``/metrics`` reads, once per scrape, every live instance's heartbeat (its
load and the counters it carries, see ``bus.metrics``) and the streams'
state, and serves them in Prometheus' text format through
``prometheus_client``. ``/readyz`` is 200 only while Redis answers, a Brain
and a Hands worker are alive and the Brain inbox is not too far behind.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from bus import pool as ops
from bus.metrics import BUCKETS_S, METRICS, read_snapshot
from bus.presence import ROLES
from bus.streams import Bus

LOAD = {  # heartbeat field -> (metric, help)
    "in_flight": ("pincer_in_flight", "Calls or turns an instance is working on"),
    "capacity": ("pincer_capacity", "Calls or turns an instance runs at once"),
    "queued": ("pincer_queued", "Calls waiting for a slot in a Hands worker"),
    "waiting": ("pincer_waiting", "Messages a Brain holds until their session's earlier turn ends"),
}


class PoolCollector(Collector):
    """What one scrape found, as Prometheus metric families."""

    def __init__(self, found: dict[str, Any]) -> None:
        self.found = found

    def collect(self) -> Iterator[Metric]:
        instances = self.found["instances"]
        alive = GaugeMetricFamily("pincer_instances", "Live instances by role", labels=["role"])
        for role in ROLES:
            alive.add_metric([role], len(instances[role]))
        yield alive
        for field, (name, text) in LOAD.items():
            family = GaugeMetricFamily(name, text, labels=["role", "instance"])
            for role in ROLES:
                for inst in instances[role]:
                    if inst.get(field, "") not in ("", None):
                        family.add_metric([role, inst["id"]], float(inst[field]))
            yield family
        yield from self._streams()
        yield from self._channels()
        yield from self._counted(inst for role in ROLES for inst in instances[role])
        yield self._cache_hits(instances["brain"])
        yield from self._redis_memory(self.found["redis_memory"])

    @staticmethod
    def _redis_memory(memory: dict[str, Any]) -> Iterator[Metric]:
        yield GaugeMetricFamily("pincer_redis_memory_used_bytes", "Memory Redis uses", value=memory["used_bytes"])
        if memory["bound_bytes"]:
            yield GaugeMetricFamily("pincer_redis_memory_bound_bytes", "The bound Pincer warns against "
                                    "(redis.memory_bound_mb, else Redis's maxmemory)", value=memory["bound_bytes"])

    def _streams(self) -> Iterator[Metric]:
        labels = ["stream", "group"]
        length = GaugeMetricFamily("pincer_stream_length", "Entries in a stream", labels=labels)
        pending = GaugeMetricFamily("pincer_stream_pending", "Entries delivered and not yet acknowledged",
                                    labels=labels)
        undelivered = GaugeMetricFamily("pincer_stream_undelivered", "Entries no consumer has read yet",
                                        labels=labels)
        oldest = GaugeMetricFamily("pincer_stream_oldest_pending_seconds", "Age of the oldest pending entry",
                                   labels=labels)
        for q in self.found["streams"]:
            key = [q["stream"], q["group"]]
            length.add_metric(key, q["length"])
            pending.add_metric(key, q["pending"])
            undelivered.add_metric(key, q["undelivered"])
            oldest.add_metric(key, q["oldest_pending_s"] or 0.0)
        yield from (length, pending, undelivered, oldest)
        yield GaugeMetricFamily("pincer_dead_letters", "Entries in the dead-letter stream", value=self.found["dead"])
        scheduler = self.found["scheduler"]
        yield GaugeMetricFamily("pincer_jobs_scheduled", "Jobs with a next due instant", value=scheduler["jobs"])
        yield GaugeMetricFamily("pincer_scheduler_stalled", "1 while jobs are due and the scheduler does not fire them",
                                value=1.0 if scheduler["state"] == "stalled" else 0.0)
        yield GaugeMetricFamily("pincer_jobs_overdue_seconds", "How late the most overdue job's instant is",
                                value=scheduler["overdue_s"])

    def _channels(self) -> Iterator[Metric]:
        labels = ["channel"]
        up = GaugeMetricFamily("pincer_channel_connected", "1 while a chat channel's poller makes progress",
                               labels=labels)
        age = GaugeMetricFamily("pincer_channel_last_poll_age_seconds", "Seconds since a channel's last good poll",
                                labels=labels)
        moved = CounterMetricFamily("pincer_channel_messages", "Messages a channel took in and answered",
                                    labels=["channel", "direction"])
        errors = CounterMetricFamily("pincer_channel_errors", "Failed platform calls of a channel", labels=labels)
        for c in self.found["channels"]:
            up.add_metric([c["channel"]], 1.0 if c["state"] == "connected" else 0.0)
            if c["last_progress_s_ago"] is not None:
                age.add_metric([c["channel"]], c["last_progress_s_ago"])
            moved.add_metric([c["channel"], "in"], c["in"])
            moved.add_metric([c["channel"], "out"], c["out"])
            errors.add_metric([c["channel"]], c["errors"])
        yield from (up, age, moved, errors)

    def _counted(self, instances: Iterable[dict[str, Any]]) -> Iterator[Metric]:
        families: dict[str, Any] = {}
        for metric in METRICS.values():
            kind = CounterMetricFamily if metric.kind == "counter" else HistogramMetricFamily
            families[metric.name] = kind(metric.name, metric.help, labels=[*metric.labels, "instance"])
        bounds = [str(b) for b in BUCKETS_S] + ["+Inf"]
        for inst in instances:
            snapshot = read_snapshot(inst.get("metrics"))
            for name, series in snapshot.get("c", {}).items():
                if name in families and METRICS[name].kind == "counter":
                    for *labels, value in series:
                        families[name].add_metric([*map(str, labels), inst["id"]], float(value))
            for name, series in snapshot.get("h", {}).items():
                if name in families and METRICS[name].kind == "histogram":
                    for *labels, values in series:
                        cumulative, running = [], 0.0
                        for bound, count in zip(bounds, [*values[:len(BUCKETS_S)], 0.0], strict=True):
                            running += count
                            cumulative.append((bound, running))
                        cumulative[-1] = ("+Inf", values[-1])
                        families[name].add_metric([*map(str, labels), inst["id"]], cumulative, values[-2])
        yield from families.values()


    @staticmethod
    def _cache_hits(brains: Iterable[dict[str, Any]]) -> Metric:
        """Per model, the share of prompt tokens read from the provider's cache, over the live Brains' counts
        (``pincer_model_tokens``, kept since each Brain started)."""
        tokens: dict[str, dict[str, float]] = {}
        for inst in brains:
            for model, kind, value in read_snapshot(inst.get("metrics")).get("c", {}).get("pincer_model_tokens", []):
                by_kind = tokens.setdefault(str(model), {})
                by_kind[kind] = by_kind.get(kind, 0.0) + float(value)
        ratio = GaugeMetricFamily("pincer_model_cache_hit_ratio", "Share of prompt tokens the provider read from "
                                  "its cache, by model, over the live Brains' counts", labels=["model"])
        for model, by_kind in sorted(tokens.items()):
            if by_kind.get("prompt"):
                ratio.add_metric([model], by_kind.get("cached", 0.0) / by_kind["prompt"])
        return ratio


async def metrics_text(bus: Bus) -> tuple[bytes, str]:
    """The exposition of the whole pool, and its content type."""
    found = await ops.status(bus, with_metrics=True)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PoolCollector(found))
    return generate_latest(registry), CONTENT_TYPE_LATEST


async def readiness(bus: Bus, *, max_backlog: int) -> tuple[bool, dict[str, Any]]:
    """Whether this pool can take a chat turn now, and what was checked."""
    try:
        await bus.redis.ping()
        found = await ops.status(bus)
    except Exception as exc:  # any Redis failure: not ready, with the reason
        return False, {"status": "not ready", "redis": f"error: {type(exc).__name__}"}
    brains, hands = len(found["instances"]["brain"]), len(found["instances"]["hands"])
    inbox = next(q for q in found["streams"] if q["stream"] == "brain:inbox")
    problems = [why for bad, why in ((not brains, "no Brain alive"), (not hands, "no Hands worker alive"),
                                     (inbox["undelivered"] >= max_backlog, "the Brain inbox is too far behind"))
                if bad]
    # A worker building one identity's search index serves every other call meanwhile: counted, not a problem.
    indexing = [h["indexing"] for h in found["instances"]["hands"] if h.get("indexing")]
    problems += [f"the {c['channel']} channel is {c['state']}" for c in found["channels"] if c["state"] != "connected"]
    scheduler = found["scheduler"]
    if scheduler["state"] == "stalled":  # no job named: /readyz answers without a token (`pincer status` names it)
        problems.append("the jobs' scheduler has stalled: " + (
            f"a job is {scheduler['overdue_s']:.0f}s overdue" if scheduler["overdue_job"]
            else f"no Brain has looked at the due jobs for {scheduler['last_tick_s_ago'] or '?'}s"))
    body = {"status": "ready" if not problems else "not ready", "brains": brains, "hands": hands,
            "hands_indexing": len(indexing), "inbox_backlog": inbox["undelivered"], "checked": round(time.time(), 3)}
    if problems:
        body["problems"] = problems
    if found["redis_memory"]["warnings"]:  # said before the bound is reached; still ready until it is
        body["warnings"] = found["redis_memory"]["warnings"]
    return not problems, body
