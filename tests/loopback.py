"""A Starlette app served by uvicorn on a loopback port, in a thread of its own: the fake platforms'
servers (tests/fake_telegram.py, tests/fake_slack.py)."""

from __future__ import annotations

import threading
import time
from typing import Any

import uvicorn
from starlette.requests import Request


class ThreadedServer:
    def __init__(self, app: Any, port: int, what: str, **config: Any) -> None:
        self.what = what
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", **config))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self) -> None:
        """Serving, once uvicorn says it is (within 10 s)."""
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.what} did not start")
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


async def request_params(request: Request) -> dict[str, Any]:
    """A platform API call's parameters: query, JSON, or a form (a file field as (filename, bytes))."""
    params: dict[str, Any] = dict(request.query_params)
    kind = request.headers.get("content-type", "")
    if kind.startswith("application/json"):
        params.update(await request.json())
    elif kind.startswith(("application/x-www-form-urlencoded", "multipart/form-data")):
        form = await request.form()
        for key, value in form.multi_items():
            params[key] = (value.filename, await value.read()) if hasattr(value, "read") else value
    return params
