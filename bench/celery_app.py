"""The peer: the same no-op and sleep tasks in Celery, Redis as broker and result backend."""

from __future__ import annotations

import os
import time

from celery import Celery

URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
app = Celery("bench", broker=URL, backend=URL)
app.conf.update(task_default_queue="bench", worker_prefetch_multiplier=32, result_expires=600,
                broker_connection_retry_on_startup=True, task_acks_late=True)


@app.task(name="bench.noop")
def noop() -> str:
    return "ok"


@app.task(name="bench.nap")
def nap(seconds: float) -> str:
    time.sleep(seconds)
    return "rested"
