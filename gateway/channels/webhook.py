"""A channel's webhook: the platform pushes each update to a small web server of the channel's own, every
replica receives. Loaded only by a channel that is given a ``webhook_url``, so a polling or listening
channel never loads a web server."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from functools import partial

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from bus.loops import sleep_or_stop
from bus.protocol import ChannelUpdate
from gateway.channels.errors import PlatformAway, PlatformRefused
from gateway.channels.platform import Webhooked, patiently
from gateway.channels.report import Progress

MAX_BYTES = 1 << 20
CHECK_S = 15.0  # how often a webhook's health is asked of the platform (its progress)

# An event pushed to us, written to the inbox once: whether it may be acknowledged (``Intake.take_event``).
TakeEvent = Callable[[str, ChannelUpdate | None], Awaitable[bool]]


async def serve_webhook(hooked: Webhooked, take: TakeEvent, progress: Progress, stop: asyncio.Event) -> None:
    """Serve the webhook until ``stop``: each request checked for the secret, written to the inbox once
    (the platform retries until it gets a 2xx, so a repeat is dropped by its update id), then answered."""
    await patiently(hooked.set_webhook, what="set the webhook")
    host, _, port = hooked.webhook_listen.rpartition(":")
    app = Starlette(routes=[Route(hooked.webhook_path(), partial(_pushed, hooked, take), methods=["POST"])])
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=int(port), log_config=None, access_log=False,
                                           lifespan="off"))
    server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign,assignment]  # our loop's
    serving = asyncio.create_task(server.serve())
    try:
        while not stop.is_set() and not serving.done():
            try:
                problem = await hooked.webhook_error()
                progress.polling, progress.last = True, time.time()
                if problem:
                    progress.failed(PlatformAway(f"{hooked.name} could not deliver to the webhook: {problem}"))
            except (PlatformAway, PlatformRefused) as exc:
                progress.failed(exc)
            await sleep_or_stop(stop, CHECK_S)
    finally:
        progress.polling = False
        server.should_exit = True
        await serving


async def _pushed(hooked: Webhooked, take: TakeEvent, request: Request) -> Response:
    body = await request.body()
    if len(body) > MAX_BYTES:
        return JSONResponse({"error": "too large"}, status_code=413)
    refusal = hooked.refusal(request.headers, body)
    if refusal is not None:
        return JSONResponse({"error": refusal}, status_code=401)
    try:
        hook = await hooked.read_hook(request.headers, body)
    except (ValueError, TypeError, KeyError, RecursionError) as exc:  # RecursionError: JSON nested too deep
        return JSONResponse({"error": f"not an event: {type(exc).__name__}: {str(exc)[:200]}"}, status_code=400)
    if hook.answer is not None:
        return JSONResponse(hook.answer)
    if not await take(hook.event_id, hook.update):  # not taken: the platform delivers it again
        return JSONResponse({"error": "busy"}, status_code=503)
    return JSONResponse({"ok": True})
