"""One request to the Gateway's HTTP API for a client command (`pincer cron`, `pincer memory`), as the
caller's token: its JSON answer, or the Gateway's own words (or why it could not be reached) on stderr."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

import httpx

from bus.config import Config

NO_ANSWER = object()  # the request failed; what went wrong has been said


def ask_gateway(args: argparse.Namespace, config: Config, call: Callable[[httpx.Client], httpx.Response]) -> Any:
    """``call`` made on a client of the Gateway (``--url`` or the configured one); its JSON, or NO_ANSWER."""
    from gateway.cli.credentials import caller_token
    from gateway.config import GatewaySettings

    settings = config.section("gateway", GatewaySettings)
    base = (args.url or settings.url).rstrip("/")
    token = caller_token(args, config, settings)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with httpx.Client(base_url=base, headers=headers, timeout=30) as client:
            response = call(client)
    except httpx.HTTPError as exc:
        print(f"pincer: error: cannot reach the Gateway at {base} ({exc}); is `pincer up` running?", file=sys.stderr)
        return NO_ANSWER
    if response.status_code >= 400:
        try:
            said = response.json().get("error", {}).get("message") or response.text
        except ValueError:
            said = response.text
        print(f"pincer: error: {said}", file=sys.stderr)
        return NO_ANSWER
    return response.json()
