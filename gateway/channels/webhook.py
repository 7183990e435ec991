"""A channel's webhook: the platform pushes each update to a small web server of the channel's own, every
replica receives. Loaded only by a channel that is given a ``webhook_url``, so a polling or listening
channel never loads a web server."""

from __future__ import annotations

import asyncio
import contextlib
import time
from functools import partial

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from bus.loops import sleep_or_stop
from gateway.channels.errors import PlatformAway, PlatformRefused
from gateway.channels.intake import Intake
from gateway.channels.platform import Webhooked, patiently

MAX_BYTES = 1 << 20
CHECK_S = 15.0  # how often a webhook's health is asked of the platform (its progress)


async def serve_webhook(intake: Intake, hooked: Webhooked, stop: asyncio.Event) -> None:
    """Serve the webhook until ``stop``: each request checked for the secret, written to the inbox once
    (the platform retries until it gets a 2xx, so a repeat is dropped by its update id), then answered."""
    await patiently(hooked.set_webhook, what="set the webhook")
    host, _, port = hooked.webhook_listen.rpartition(":")
    app = Starlette(routes=[Route(hooked.webhook_path(), partial(_pushed, intake, hooked), methods=["POST"])])
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=int(port), log_config=None, access_log=False,
                                           lifespan="off"))
    server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign,assignment]  # our loop's
    serving = asyncio.create_task(server.serve())
    progress = intake.progress
    try:
        while not stop.is_set() and not serving.done():
            try:
                problem = await hooked.webhook_error()
                progress.polling, progress.last = True, time.time()
                if problem:
                    progress.failed(PlatformAway(f"{intake.name} could not deliver to the webhook: {problem}"))
            except (PlatformAway, PlatformRefused) as exc:
                progress.failed(exc)
            await sleep_or_stop(stop, CHECK_S)
    finally:
        progress.polling = False
        server.should_exit = True
        await serving


async def _pushed(intake: Intake, hooked: Webhooked, request: Request) -> Response:
    body = await request.body()
    if len(body) > MAX_BYTES:
        return JSONResponse({"error": "too large"}, status_code=413)
    refusal = hooked.refusal(request.headers, body)
    if refusal is not None:
        return JSONResponse({"error": refusal}, status_code=401)
    try:
        hook = await hooked.read_hook(request.headers, body)
    except (ValueError, TypeError, KeyError) as exc:
        return JSONResponse({"error": f"not an event: {exc}"}, status_code=400)
    if hook.answer is not None:
        return JSONResponse(hook.answer)
    if not await intake.take_event(hook.event_id, hook.update):  # not taken: the platform delivers it again
        return JSONResponse({"error": "busy"}, status_code=503)
    return JSONResponse({"ok": True})
