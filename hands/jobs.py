"""Background jobs: commands that outlive their call, owned by the worker that started them.

A job's record lives in Redis (``pincer:job:<id>``: owner worker, status, exit
code, command, output tail) so any worker can say where it runs; only the
owner holds the process. Finished jobs are kept ``hands.jobs.keep_s``, then
pruned. A worker that stops kills its jobs and marks them so.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from redis.typing import EncodableT

from bus.keys import Keys
from bus.protocol import ErrorCode, now_ms
from bus.store import RedisStore
from hands.errors import ToolFailure
from hands.sandbox.runner import Running

log = logging.getLogger("hands.jobs")


@dataclass
class Job:
    id: str
    session_id: str
    command: str
    running: Running
    timeout_s: float
    polled_out: int = 0
    polled_err: int = 0
    finished_at: float | None = None
    watcher: asyncio.Task[None] | None = field(default=None, repr=False)

    @property
    def status(self) -> str:
        if not self.running.done:
            return "running"
        if self.running.timed_out:
            return "timed_out"
        return "killed" if self.running.killed else "exited"

    def summary(self) -> dict[str, Any]:
        result = self.running.result()
        return {"job_id": self.id, "status": self.status, "command": self.command, "exit_code": result.exit_code,
                "signal": result.signal, "runtime_ms": result.duration_ms, "sandbox": result.tier}


class JobManager:
    def __init__(self, redis: RedisStore, keys: Keys, *, worker_id: str, keep_s: float, max_per_session: int = 4,
                 max_per_worker: int = 16) -> None:
        self.redis, self.keys, self.worker_id, self.keep_s = redis, keys, worker_id, keep_s
        self.max_per_session, self.max_per_worker = max_per_session, max_per_worker
        self.jobs: dict[str, Job] = {}

    def room_for(self, session_id: str) -> str | None:
        """Why no other job may start for this session now, or None when one may."""
        running = [job for job in self.jobs.values() if job.status == "running"]
        if len(running) >= self.max_per_worker:
            return f"this worker already runs {len(running)} background jobs (hands.jobs.max_per_worker)"
        mine = sum(job.session_id == session_id for job in running)
        if mine >= self.max_per_session:
            return f"this session already runs {mine} background jobs (hands.jobs.max_per_session)"
        return None

    async def adopt(self, running: Running, *, session_id: str, command: str, timeout_s: float) -> Job:
        """Keep a started command running after its call returns."""
        job = Job(id=f"job-{uuid.uuid4().hex[:10]}", session_id=session_id, command=command[:500],
                  running=running, timeout_s=timeout_s)
        self.jobs[job.id] = job
        job.watcher = asyncio.create_task(self._watch(job))
        await self._record(job)
        return job

    def local(self, job_id: str, *, session_id: str | None = None) -> Job:
        job = self.jobs.get(job_id)
        if job is None or (session_id is not None and job.session_id != session_id):  # another's: unseen
            raise ToolFailure(ErrorCode.FILE_NOT_FOUND, f"no job {job_id!r} on this worker",
                              suggestions=["process list shows the jobs of this session"])
        return job

    async def owner(self, job_id: str) -> str | None:
        raw = await self.redis.hget(self.keys.job(job_id), "worker")
        return raw.decode() if raw else None

    async def listing(self, session_id: str) -> list[dict[str, Any]]:
        ids = sorted(i.decode() for i in await self.redis.smembers(self.keys.session_jobs(session_id)))
        jobs = []
        for job_id in ids:
            record = await self.redis.hgetall(self.keys.job(job_id))
            if record:
                jobs.append({k.decode(): v.decode() for k, v in record.items() if k != b"tail"})
            else:
                await self.redis.srem(self.keys.session_jobs(session_id), job_id)  # pruned
        return jobs

    async def stop_all(self) -> None:
        for job in list(self.jobs.values()):
            await job.running.stop()
            await self._record(job)
        for job in self.jobs.values():
            if job.watcher:
                job.watcher.cancel()

    async def _watch(self, job: Job) -> None:
        """Enforce the job's timeout, record how it ended, prune it later."""
        try:
            await job.running.wait(max(0.0, job.timeout_s - (time.monotonic() - job.running.started)))
            await job.running.stop()
            job.finished_at = time.monotonic()
            await self._record(job)
            await asyncio.sleep(self.keep_s)
        finally:
            self.jobs.pop(job.id, None)

    async def _record(self, job: Job) -> None:
        summary = job.summary()
        record: dict[EncodableT, EncodableT] = {
            "worker": self.worker_id,
            "session": job.session_id,
            "updated": now_ms(),
            **{k: json.dumps(v) if not isinstance(v, str) else v for k, v in summary.items()},
            "tail": job.running.out.since(max(0, job.running.out.total - 2000))[0],
        }
        key = self.keys.job(job.id)
        with contextlib.suppress(Exception):  # a lost record must not lose the job itself
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.hset(key, mapping=record)
                pipe.sadd(self.keys.session_jobs(job.session_id), job.id)
                if job.status != "running":
                    pipe.expire(key, int(self.keep_s) + 60)
                await pipe.execute()
