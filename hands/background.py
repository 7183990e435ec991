"""Background processes: commands that outlive their call, owned by the worker that started them.

A process's record lives in Redis (``pincer:hands:process:<id>``: owner worker, status,
exit code, command, output tail) so any worker can say where it runs; only the owner
holds the process. Finished ones are kept ``hands.background.keep_s``, then pruned. A
worker that stops kills its processes and marks them so.
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
from hands.sandbox.running import Running

log = logging.getLogger("hands.background")


@dataclass
class BackgroundProcess:
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
        return {"process_id": self.id, "status": self.status, "command": self.command, "exit_code": result.exit_code,
                "signal": result.signal, "runtime_ms": result.duration_ms, "sandbox": result.tier}


class BackgroundProcesses:
    def __init__(self, redis: RedisStore, keys: Keys, *, worker_id: str, keep_s: float, max_per_session: int = 4,
                 max_per_worker: int = 16) -> None:
        self.redis, self.keys, self.worker_id, self.keep_s = redis, keys, worker_id, keep_s
        self.max_per_session, self.max_per_worker = max_per_session, max_per_worker
        self.processes: dict[str, BackgroundProcess] = {}

    def room_for(self, session_id: str) -> str | None:
        """Why no other process may start in the background for this session now, or None when one may."""
        running = [process for process in self.processes.values() if process.status == "running"]
        if len(running) >= self.max_per_worker:
            return f"this worker already runs {len(running)} background processes (hands.background.max_per_worker)"
        mine = sum(process.session_id == session_id for process in running)
        if mine >= self.max_per_session:
            return f"this session already runs {mine} background processes (hands.background.max_per_session)"
        return None

    async def adopt(self, running: Running, *, session_id: str, command: str, timeout_s: float) -> BackgroundProcess:
        """Keep a started command running after its call returns."""
        process = BackgroundProcess(id=f"proc-{uuid.uuid4().hex[:10]}", session_id=session_id, command=command[:500],
                                    running=running, timeout_s=timeout_s)
        self.processes[process.id] = process
        process.watcher = asyncio.create_task(self._watch(process))
        await self._record(process)
        return process

    def local(self, process_id: str, *, session_id: str | None = None) -> BackgroundProcess:
        process = self.processes.get(process_id)
        if process is None or (session_id is not None and process.session_id != session_id):  # another's: unseen
            raise ToolFailure(ErrorCode.FILE_NOT_FOUND, f"no background process {process_id!r} on this worker",
                              suggestions=["process list shows the background processes of this session"])
        return process

    async def owner(self, process_id: str) -> str | None:
        raw = await self.redis.hget(self.keys.hands_process(process_id), "worker")
        return raw.decode() if raw else None

    async def listing(self, session_id: str) -> list[dict[str, Any]]:
        ids = sorted(i.decode() for i in await self.redis.smembers(self.keys.session_processes(session_id)))
        processes = []
        for process_id in ids:
            record = await self.redis.hgetall(self.keys.hands_process(process_id))
            if record:
                processes.append({k.decode(): v.decode() for k, v in record.items() if k != b"tail"})
            else:
                await self.redis.srem(self.keys.session_processes(session_id), process_id)  # pruned
        return processes

    async def stop_all(self) -> None:
        for process in list(self.processes.values()):
            await process.running.stop()
            await self._record(process)
        for process in self.processes.values():
            if process.watcher:
                process.watcher.cancel()

    async def _watch(self, process: BackgroundProcess) -> None:
        """Enforce the process's timeout, record how it ended, prune it later."""
        try:
            await process.running.wait(max(0.0, process.timeout_s - (time.monotonic() - process.running.started)))
            await process.running.stop()
            process.finished_at = time.monotonic()
            await self._record(process)
            await asyncio.sleep(self.keep_s)
        finally:
            self.processes.pop(process.id, None)

    async def _record(self, process: BackgroundProcess) -> None:
        summary = process.summary()
        record: dict[EncodableT, EncodableT] = {
            "worker": self.worker_id,
            "session": process.session_id,
            "updated": now_ms(),
            **{k: json.dumps(v) if not isinstance(v, str) else v for k, v in summary.items()},
            "tail": process.running.out.since(max(0, process.running.out.total - 2000))[0],
        }
        key = self.keys.hands_process(process.id)
        with contextlib.suppress(Exception):  # a lost record must not lose the process itself
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.hset(key, mapping=record)
                pipe.sadd(self.keys.session_processes(process.session_id), process.id)
                # Running: until its timeout and the keep after it, so a worker killed -9 leaves none for good
                running_s = time.monotonic() - process.running.started
                left_s = max(0.0, process.timeout_s - running_s) if process.status == "running" else 0.0
                pipe.expire(key, int(left_s + self.keep_s) + 60)
                await pipe.execute()
