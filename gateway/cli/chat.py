"""``pincer chat``: talk to a running Gateway, streaming text and showing tool calls as they happen."""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
from httpx_sse import ServerSentEvent, SSEError, connect_sse
from rich.console import Console
from rich.text import Text

from bus.config import Config
from bus.errors import PincerError
from bus.numbers import whole_number


class ChatFailed(PincerError):
    """The turn or the connection failed; the message says what to do."""


@dataclass
class ChatClient:
    base_url: str
    session_id: str
    out: Console
    err: Console
    token: str | None = None

    def url(self, suffix: str) -> str:
        """The session's URL: ``NAME`` is the caller's own, ``OWNER/NAME`` another's (operators)."""
        owner, _, name = self.session_id.rpartition("/")
        return f"{self.base_url}/v1/sessions/{name}{suffix}" + (f"?owner={owner}" if owner else "")

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def send(self, text: str) -> str:
        """Send one message; stream the reply to ``out``; return the final text."""
        url = self.url("/messages")
        try:
            with httpx.Client(timeout=httpx.Timeout(10.0, read=None)) as client, \
                    connect_sse(client, "POST", url, json={"text": text}, headers=self.headers) as source:
                if source.response.status_code != 200:
                    source.response.read()
                    raise ChatFailed(_http_error(source.response))
                return self._render(source.iter_sse())
        except KeyboardInterrupt:
            self.cancel()
            raise
        except httpx.ConnectError:
            raise ChatFailed(f"cannot reach the Gateway at {self.base_url}; is `pincer up` running?") from None
        except (httpx.HTTPError, SSEError) as exc:
            raise ChatFailed(f"lost the connection to the Gateway at {self.base_url}: {exc}") from None

    def cancel(self) -> None:
        """Ctrl-C during a turn: ask the Gateway to stop it (its tool calls stop too)."""
        try:
            httpx.post(self.url("/cancel"), headers=self.headers, timeout=5)
            self.err.print("\n(cancelled)", highlight=False)
        except httpx.HTTPError:
            self.err.print("\n(could not reach the Gateway to cancel)", highlight=False)

    def _render(self, events: Iterator[ServerSentEvent]) -> str:
        streamed = False
        for event in events:
            data = json.loads(event.data)
            if event.event == "delta":
                self.out.print(plain(data["text"]), end="", markup=False, highlight=False)
                streamed = True
            elif event.event == "tool":
                if streamed:
                    self.out.print()
                    streamed = False
                icon = "→" if data["status"] == "started" else "←"
                line = Text(f"  {icon} ") + Text(plain(data["tool"]), style="bold") + Text(" " + plain(data["summary"]))
                self.err.print(line, style="dim", highlight=False)
            elif event.event == "approval":
                if streamed:
                    self.out.print()
                    streamed = False
                self._approve(data)
            elif event.event == "question":
                if streamed:
                    self.out.print()
                    streamed = False
                self._answer(data)
            elif event.event == "reply":
                if streamed:
                    self.out.print()
                elif data["text"]:
                    self.out.print(plain(data["text"]), markup=False, highlight=False)
                return str(data["text"])
            elif event.event == "error":
                if streamed:
                    self.out.print()
                raise ChatFailed(plain(f"{data['code']}: {data['message']}"))
        raise ChatFailed("the Gateway closed the stream before the turn ended")


    def _approve(self, request: dict[str, Any]) -> None:
        """Ask the person at the terminal, then send their answer to the Gateway."""
        always = request.get("always_allowed", True)
        self.err.print(Text("Approve running this? ", style="bold yellow") + Text(f"({plain(request['tool'])})"),
                       highlight=False)
        self.err.print(plain(request["summary"]), markup=False, highlight=False)
        choices = "[y] yes once, [a] always, [n] no: " if always else \
            "[y] yes once, [n] no (it was not shown whole, so not always): "
        self.err.print(choices, end="", markup=False, highlight=False)
        try:
            answer = input().strip().lower()
        except EOFError:
            answer = "n"
        decision = {"y": "allow-once", "yes": "allow-once", "a": "allow-always", "always": "allow-always"}.get(
            answer, "deny")
        if decision == "allow-always" and not always:
            decision = "deny"  # asked for what was not offered: no
        response = httpx.post(f"{self.base_url}/v1/approvals/{request['approval_id']}",
                              json={"decision": decision}, headers=self.headers, timeout=10)
        if response.status_code != 200:
            self.err.print(f"  (not recorded: {_http_error(response)})", markup=False, highlight=False)

    def _answer(self, request: dict[str, Any]) -> None:
        """Put the agent's questions to the person at the terminal (a choice by its number or its words), then
        send the answers to the Gateway."""
        answers: list[str | None] = []
        for question in request["questions"]:
            choices = [plain(c) for c in question.get("choices") or ()]
            self.err.print(Text("? ", style="bold yellow") + Text(plain(question["text"])), highlight=False)
            for n, choice in enumerate(choices, 1):
                self.err.print(f"  {n}. {choice}", markup=False, highlight=False)
            answer = None
            while answer is None:
                self.err.print("> ", end="", markup=False, highlight=False)
                try:
                    said = input().strip()
                except EOFError:
                    return  # nobody at the terminal: the question times out, and the agent goes on
                if not choices:
                    answer = said or None
                elif 1 <= (number := whole_number(said) or 0) <= len(choices):
                    answer = question["choices"][number - 1]
                else:
                    answer = next((c for c in question["choices"] if c.lower() == said.lower()), None)
                if answer is None:
                    self.err.print("  (type an answer)" if not choices else
                                   f"  (one of 1-{len(choices)})", markup=False, highlight=False)
            answers.append(answer)
        response = httpx.post(f"{self.base_url}/v1/questions/{request['question_id']}",
                              json={"answers": answers}, headers=self.headers, timeout=10)
        if response.status_code != 200:
            self.err.print(f"  (not recorded: {_http_error(response)})", markup=False, highlight=False)


# What a model or a tool wrote must not drive the terminal: escape sequences (colours, cursor moves,
# a concealed line, a changed title) and other control characters go; newlines and tabs stay.
_ESCAPES = re.compile(r"\x1b(\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)?|[@-Z\\-_])|\x9b[0-?]*[ -/]*[@-~]")
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def plain(text: str) -> str:
    return _CONTROLS.sub("", _ESCAPES.sub("", text))


def _http_error(response: httpx.Response) -> str:
    try:
        error = response.json()["error"]
        text = f"{error['code']}: {error['message']}"
    except (ValueError, KeyError, TypeError):
        text = f"the Gateway answered HTTP {response.status_code}"
    if response.status_code == 401:
        text += " (give `pincer chat --token`, or set PINCER_TOKEN)"
    return text


def run_chat(base_url: str, session_id: str, message: str | None, *, token: str | None = None) -> int:
    out, err = Console(soft_wrap=True), Console(stderr=True, soft_wrap=True)
    client = ChatClient(base_url.rstrip("/"), session_id, out, err, token)
    if message is not None:
        try:
            client.send(message)
            return 0
        except KeyboardInterrupt:
            return 130
        except ChatFailed as exc:
            err.print(f"pincer: error: {exc}", markup=False, highlight=False)
            return 1
    err.print(f"Chatting in session [bold]{session_id}[/bold] via {base_url}. Ctrl-D to leave.", highlight=False)
    while True:
        try:
            text = input("you> " if sys.stdin.isatty() else "")
        except (EOFError, KeyboardInterrupt):
            err.print()
            return 0
        if not text.strip():
            continue
        try:
            client.send(text)
        except ChatFailed as exc:
            err.print(f"error: {exc}", style="red", markup=False, highlight=False)
        except KeyboardInterrupt:
            pass  # the turn was cancelled; keep chatting


def command(args: argparse.Namespace, config: Config) -> int:
    from gateway.cli.credentials import caller_token
    from gateway.config import GatewaySettings

    settings = config.section("gateway", GatewaySettings)
    return run_chat(args.url or settings.url, args.session, args.message, token=caller_token(args, config, settings))


# --- arguments: each command's, declared beside it (gateway/cli/__init__.py reads ARGUMENTS) ---


def _chat_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-m", "--message", help="send one message, print the reply and exit")
    parser.add_argument("--session", default="main",
                      help="session name (default: main, your own); an operator reaches another's as OWNER/NAME")
    parser.add_argument("--url", help="Gateway URL (default: from gateway.host/port)")
    parser.add_argument("--token-file", metavar="FILE", help="read the Gateway token from FILE ('-': standard "
                      "input; default: $PINCER_TOKEN, gateway.token, or the one `pincer up` made in the data dir). "
                      "Never on the command line: any local user can read those")


ARGUMENTS = {"chat": _chat_arguments}
