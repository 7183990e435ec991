"""A scripted OpenAI-compatible chat-completions server on loopback.

litellm talks to it over real HTTP (streaming SSE), so the Brain's whole model
path runs. The script is written in the user's message, one directive a line:

- ``CALL <tool> <json args>``: answer with that tool call (several lines: parallel calls);
  once tool results are in, answer ``RESULT <tool>: <content>`` quoting each one.
- ``LOOP <tool> <json args>``: call the tool again after every result (never answers).
- ``STATUS <code>``: answer with that HTTP error (so does any model named ``fail<code>``).
- ``SLEEP <seconds>``: wait that long before answering (a turn that is still running).
- ``DRIP <seconds>``: stream ``drip `` every that many seconds, for as long as the client reads (up to 1,000).
- ``BREAK <chunks>``: stream that many pieces of the echo, then reset the connection (no usage, no end).
- ``FLAKY <n>``: the first n requests of this conversation answer 503, the next ones as usual.
- ``HOLD <chunks>``: the first request of this conversation streams that many chunks of its answer (tool calls
  included), then holds the stream open until ``release()`` and closes it unfinished; the next ones as usual.
- ``WAIT <n>``: answer only once ``n`` requests have been open at once (``peak``), or at ``release()``; a client
  that goes away meanwhile is counted in ``abandoned`` (a cancelled call) and sent nothing.
- anything else: answer ``echo: <text>`` streamed in small pieces.

Usage is reported as a provider with a prompt cache would: 11 prompt tokens, of which 8 came from the
cache when the request continues a conversation (more than the instructions and one message).

Every request body is kept in ``requests`` for assertions, the moment it arrives (a provider that bills on
arrival reads the whole prompt then), and in ``answered`` once its whole response is sent. ``open`` counts
the requests being served now and ``peak`` the most at once: facts a test of concurrency waits on. Each
request has a thread of its own, so the server itself caps nothing below its listen backlog.

A whole answer is a chunked body on a connection kept alive, its end written a packet after ``[DONE]``, as
hosted providers send them (the benches then measure clients that reuse connections, as they would in use);
a cut one (BREAK, HOLD) is close-delimited, so a reset can end it.

It also answers Anthropic's Messages API (``POST .../v1/messages``, what litellm sends an ``anthropic/``
model), streamed in Anthropic's events: ``echo: <the last user text>``, with 8 of the prompt's tokens read
from the cache when the request continues a conversation. Those bodies are kept in ``requests`` too, in
Anthropic's form (``system``, ``messages``, ``tools``, with any ``cache_control`` marks as they arrived).
"""

from __future__ import annotations

import contextlib
import json
import select
import socket
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class _Server(ThreadingHTTPServer):
    request_queue_size = 256  # a Brain opens dozens of connections at once; the default backlog is 5


class ScriptedLLM:
    def __init__(self, port: int = 0) -> None:
        self.requests: list[dict[str, Any]] = []
        self.flaky: dict[str, int] = {}  # FLAKY conversations: requests refused so far, by the user's text
        self.answered: list[dict[str, Any]] = []  # the request bodies whose whole response was sent
        self.chunks_sent = 0  # streamed chunks written, over every request (a fact a test can wait on)
        self.holding = 0  # HOLD streams held open so far (a fact a test can wait on)
        self.held: set[str] = set()  # HOLD conversations whose first request was held
        self.open = 0  # requests being served now: read, not yet answered in full
        self.peak = 0  # the most requests open at once
        self.abandoned = 0  # WAIT requests whose client went away before the answer
        self._counting = threading.Condition()
        self._release = threading.Event()
        self._server = _Server(("127.0.0.1", port), self._handler_class())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def api_base(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def start(self) -> ScriptedLLM:
        self._thread.start()
        return self

    def release(self) -> None:
        """End the HOLD streams held open (unfinished) and answer the WAIT ones, and every later one at once."""
        self._release.set()
        with self._counting:
            self._counting.notify_all()

    def _opened(self) -> None:
        with self._counting:
            self.open += 1
            self.peak = max(self.peak, self.open)

    def _closed(self) -> None:
        with self._counting:
            self.open -= 1

    def _wait_for(self, n: int, client: socket.socket) -> bool:
        """Wait until ``n`` requests were open at once (or ``release``); False if the client went away first."""
        with self._counting:
            while self.peak < n and not self._release.is_set():
                self._counting.wait(0.1)  # and a look at the client: a cancel is seen within 0.1 s
                if _gone(client):
                    self.abandoned += 1
                    return False
        return True

    def stop(self) -> None:
        self.release()
        self._server.shutdown()
        self._server.server_close()

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        script = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_args: Any) -> None:
                pass

            def setup(self) -> None:
                super().setup()
                # Each write sent at once, as providers' servers do: with Nagle's algorithm a kept-alive
                # connection's next small write would wait for the client's delayed ACK (~40 ms).
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def handle(self) -> None:
                with contextlib.suppress(ConnectionResetError):  # a client dropped a kept-alive connection
                    super().handle()

            def do_POST(self) -> None:  # http.server's naming
                script._opened()
                try:
                    self._post()
                finally:
                    script._closed()

            def _post(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))))
                script.requests.append(body)
                if self.path.rstrip("/").endswith("/messages"):
                    self._events(_anthropic_events(body))
                    return
                status, reply = decide(body["messages"], body.get("model", ""))
                reply["cached"] = 8 if len(body["messages"]) > 2 else 0
                if reply.get("flaky"):
                    key = json.dumps(body["messages"])
                    refused = script.flaky[key] = script.flaky.get(key, 0) + 1
                    status = 503 if refused <= reply["flaky"] else status
                if reply.get("hold") is not None:
                    key = json.dumps(body["messages"])
                    if key in script.held:
                        del reply["hold"]
                    script.held.add(key)
                time.sleep(reply.pop("sleep", 0))
                if reply.get("wait") and not script._wait_for(reply.pop("wait"), self.connection):
                    return
                if status != 200:
                    payload = json.dumps({"error": {"message": f"scripted failure {status}", "type": "scripted"}})
                    self._send(status, "application/json", payload.encode())
                    return
                if body.get("stream"):
                    if self._stream(body.get("model", "scripted"), reply):
                        script.answered.append(body)
                else:
                    self._send(
                        200, "application/json", json.dumps(_full(body.get("model", "scripted"), reply)).encode()
                    )
                    script.answered.append(body)

            def _send(self, status: int, kind: str, data: bytes) -> None:
                self.send_response(status)
                self.send_header("content-type", kind)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _events(self, events: list[tuple[str, dict[str, Any]]]) -> None:
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("connection", "close")
                self.end_headers()
                self.close_connection = True
                for name, data in events:
                    self.wfile.write(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())
                self.wfile.flush()

            def _stream(self, model: str, reply: dict[str, Any]) -> bool:
                """Whether the whole response was sent. A whole answer is a chunked body on a connection kept
                alive, as providers send it; a cut one is close-delimited, so a reset can end it."""
                chunks = _chunks(model, reply)
                cut = reply.get("break", reply.get("hold"))
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                if cut is None:
                    self.send_header("transfer-encoding", "chunked")
                else:
                    self.send_header("connection", "close")
                    self.close_connection = True
                    chunks = chunks[: 1 + cut]  # the role's chunk, then the pieces: then nothing
                self.end_headers()
                try:
                    for chunk in chunks:
                        self._write(f"data: {json.dumps(chunk)}\n\n".encode(), chunked=cut is None)
                        script.chunks_sent += 1
                        time.sleep(reply.get("drip", 0))
                    if reply.get("hold") is not None:
                        script.holding += 1
                        script._release.wait()
                    if cut is not None:  # closed with a reset: the provider failed mid-stream
                        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                        return False
                    self._write(b"data: [DONE]\n\n", chunked=True)
                    self._write(b"", chunked=True)  # the body's end: a packet after [DONE], as it often comes
                except (BrokenPipeError, ConnectionResetError):
                    return False  # the client went away mid-stream (a cancel): what was sent is sent
                return True

            def _write(self, data: bytes, *, chunked: bool) -> None:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data) if chunked else data)
                self.wfile.flush()

        return Handler


def decide(messages: list[dict[str, Any]], model: str = "") -> tuple[int, dict[str, Any]]:
    """The scripted answer to a conversation: ``(status, {"text": ..., "calls": [...]})``.

    A model named ``fail<status>`` (e.g. ``fail429``) always answers that HTTP status.
    """
    if model.startswith("fail") and model[4:].isdigit():
        return int(model[4:]), {}
    user = next(m for m in reversed(messages) if m["role"] == "user")
    lines = [line.strip() for line in (user.get("content") or "").splitlines() if line.strip()]
    last = messages[-1]
    for line in lines:
        if line.startswith("STATUS "):
            return int(line.split()[1]), {}
    sleep = next((float(line.split()[1]) for line in lines if line.startswith("SLEEP ")), 0.0)
    if sleep and last["role"] == "user":
        return 200, {"text": f"slept {sleep:g}s", "calls": [], "sleep": sleep}
    drip = next((float(line.split()[1]) for line in lines if line.startswith("DRIP ")), 0.0)
    if drip and last["role"] == "user":
        return 200, {"text": "drip " * 1000, "calls": [], "drip": drip, "piece": 5}
    broken = next((int(line.split()[1]) for line in lines if line.startswith("BREAK ")), None)
    if broken is not None:
        return 200, {"text": f"echo: {user.get('content')}", "calls": [], "break": broken}
    wait = next((int(line.split()[1]) for line in lines if line.startswith("WAIT ")), 0)
    if wait and last["role"] == "user":
        return 200, {"text": f"waited for {wait}", "calls": [], "wait": wait}
    flaky = next((int(line.split()[1]) for line in lines if line.startswith("FLAKY ")), 0)
    if flaky:
        return 200, {"text": f"echo: {user.get('content')}", "calls": [], "flaky": flaky}
    hold = next((int(line.split()[1]) for line in lines if line.startswith("HOLD ")), None)
    if hold is not None and last["role"] == "user":
        calls = [_parse_call(line[5:]) for line in lines if line.startswith("CALL ")]
        return 200, {"text": "" if calls else f"echo: {user.get('content')}", "calls": calls, "hold": hold}
    loops = [_parse_call(line[5:]) for line in lines if line.startswith("LOOP ")]
    if loops:
        return 200, {"text": "", "calls": loops}
    if last["role"] == "tool":
        results: list[str] = []
        for message in reversed(messages):
            if message["role"] != "tool":
                break
            results.insert(0, f"RESULT {message.get('name', '?')}: {message.get('content')}")
        return 200, {"text": "\n".join(results), "calls": []}
    calls = [_parse_call(line[5:]) for line in lines if line.startswith("CALL ")]
    if calls:
        return 200, {"text": "", "calls": calls}
    return 200, {"text": f"echo: {user.get('content')}", "calls": []}


def _gone(client: socket.socket) -> bool:
    """Whether the client closed its connection (it sends nothing more after its request: readable is EOF)."""
    readable, _, _ = select.select([client], [], [], 0)
    if not readable:
        return False
    try:
        return client.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


def _parse_call(rest: str) -> dict[str, str]:
    name, _, args = rest.strip().partition(" ")
    return {"name": name, "arguments": args.strip() or "{}"}


def _chunk(model: str, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"id": "chatcmpl-scripted", "object": "chat.completion.chunk", "created": int(time.time()),
            "model": model, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def _chunks(model: str, reply: dict[str, Any]) -> list[dict[str, Any]]:
    chunks = [_chunk(model, {"role": "assistant", "content": ""})]
    text, piece = reply.get("text", ""), reply.get("piece", 7)
    chunks += [_chunk(model, {"content": text[i : i + piece]}) for i in range(0, len(text), piece)]
    for index, call in enumerate(reply.get("calls", [])):
        call_id = f"call_{index}_{int(time.time() * 1000) % 100000}"
        chunks.append(_chunk(model, {"tool_calls": [{"index": index, "id": call_id, "type": "function",
                                                     "function": {"name": call["name"], "arguments": ""}}]}))
        args = call["arguments"]
        # Arguments arrive in pieces, as real providers send them.
        chunks += [_chunk(model, {"tool_calls": [{"index": index, "function": {"arguments": args[i : i + 5]}}]})
                   for i in range(0, len(args), 5)]
    chunks.append(_chunk(model, {}, "tool_calls" if reply.get("calls") else "stop"))
    usage = {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18,
             "prompt_tokens_details": {"cached_tokens": reply.get("cached", 0)}}
    chunks.append({"id": "chatcmpl-scripted", "object": "chat.completion.chunk", "created": int(time.time()),
                   "model": model, "choices": [], "usage": usage})
    return chunks


def _anthropic_events(body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """An Anthropic Messages API stream answering ``echo: <the last user text>``."""
    user = next(m for m in reversed(body["messages"]) if m["role"] == "user")
    content = user["content"]
    said = content if isinstance(content, str) else "".join(b.get("text", "") for b in content)
    cached = 8 if len(body["messages"]) > 1 else 0
    usage = {"input_tokens": 11 - cached, "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0,
             "output_tokens": 1}
    text = f"echo: {said}"
    return [
        ("message_start", {"type": "message_start", "message": {
            "id": "msg_scripted", "type": "message", "role": "assistant", "content": [], "model": body["model"],
            "stop_reason": None, "stop_sequence": None, "usage": usage}}),
        ("content_block_start", {"type": "content_block_start", "index": 0,
                                 "content_block": {"type": "text", "text": ""}}),
        *[("content_block_delta", {"type": "content_block_delta", "index": 0,
                                   "delta": {"type": "text_delta", "text": text[i : i + 7]}})
          for i in range(0, len(text), 7)],
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                           "usage": {"output_tokens": 7}}),
        ("message_stop", {"type": "message_stop"}),
    ]


def _full(model: str, reply: dict[str, Any]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.get("text") or None}
    if reply.get("calls"):
        message["tool_calls"] = [{"id": f"call_{i}", "type": "function", "function": c}
                                 for i, c in enumerate(reply["calls"])]
    return {
        "id": "chatcmpl-scripted",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if reply.get("calls") else "stop"}],
        "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
    }


if __name__ == "__main__":  # its own process (benchmarks): print where it listens, serve until killed
    server = ScriptedLLM().start()
    print(server.api_base, flush=True)
    threading.Event().wait()
