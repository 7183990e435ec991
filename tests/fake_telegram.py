"""A Telegram Bot API server on loopback, for the Telegram channel's tests: the real HTTP shape, no internet.

It speaks what the Bot API documents for the methods the channel uses (https://core.telegram.org/bots/api):
methods at ``/bot<token>/<method>`` taking query, form (urlencoded or multipart) or JSON parameters,
answers as ``{"ok": true, "result": ...}`` or ``{"ok": false, "error_code", "description"[, "parameters"]}``;
getUpdates as a long poll that confirms every update below ``offset`` and answers 409 to an older poll
when a second one arrives; editMessageText refusing an unchanged text; files at ``/file/bot<token>/<path>``.
HTML sent with ``parse_mode=HTML`` is checked the way Telegram checks it (known tags only, balanced).

The test side plays the people: ``say`` and ``press`` queue updates, ``sent`` reads what the bot sent.
``fail`` makes the next calls of a method answer an error (a 502, a 429 with ``retry_after``), and
``hang`` makes polls hang without answering (a dead connection).
"""

from __future__ import annotations

import asyncio
import html.parser
import itertools
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from bus.redis_server import free_port
from tests.loopback import ThreadedServer, request_params

TOKEN = "123456:TEST-token_for-the-fake"
BOT = {"id": 777000, "is_bot": True, "first_name": "Pincer", "username": "pincer_test_bot",
       "can_join_groups": True, "can_read_all_group_messages": False, "supports_inline_queries": False}
# The Bot API's methods this server answers, and the handler of each.
METHODS = {"getMe": "_get_me", "getUpdates": "_get_updates", "sendMessage": "_send_message",
           "editMessageText": "_edit_message_text", "sendChatAction": "_send_chat_action",
           "answerCallbackQuery": "_answer_callback_query", "getFile": "_get_file", "sendDocument": "_send_document",
           "setWebhook": "_set_webhook", "deleteWebhook": "_delete_webhook", "getWebhookInfo": "_get_webhook_info"}
TAGS = {"b", "strong", "i", "em", "u", "ins", "s", "strike", "del", "code", "pre", "a", "blockquote", "tg-spoiler",
        "span"}


class _HTMLCheck(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.open: list[str] = []
        self.text: list[str] = []
        self.error = ""

    def handle_starttag(self, tag: str, attrs: Any) -> None:
        if tag not in TAGS:
            self.error = f"Bad Request: can't parse entities: Unsupported start tag \"{tag}\""
        self.open.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if not self.open or self.open.pop() != tag:
            self.error = f"Bad Request: can't parse entities: Can't find end tag corresponding to start tag \"{tag}\""

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def parsed_text(text: str, parse_mode: str | None) -> tuple[str, str]:
    """What a person sees of ``text``, and Telegram's refusal ("" if none)."""
    if parse_mode != "HTML":
        return text, ""
    check = _HTMLCheck()
    check.feed(text)
    check.close()
    if check.open and not check.error:
        check.error = f"Bad Request: can't parse entities: Can't find end tag for \"{check.open[-1]}\""
    return "".join(check.text), check.error


@dataclass
class Sent:
    chat: int
    message_id: int
    text: str  # as a person sees it (tags parsed)
    markup: str  # as sent
    buttons: list[list[dict[str, Any]]] = field(default_factory=list)
    edits: int = 0
    document: tuple[str, bytes] | None = None


class FakeTelegram:
    def __init__(self) -> None:
        self.port = free_port()
        self.api_url = f"http://127.0.0.1:{self.port}"
        self.updates: list[dict[str, Any]] = []
        self.confirmed = 0  # every update below this was confirmed by an offset
        self.sent: list[Sent] = []
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.answers: list[dict[str, Any]] = []  # answerCallbackQuery
        self.files: dict[str, bytes] = {}
        self.failing: dict[str, list[tuple[int, dict[str, Any]]]] = {}
        self.hang_until = 0.0
        self.webhook: tuple[str, str] | None = None  # (url, secret token) while one is set
        self.pushes: list[tuple[int, int]] = []  # (update id, HTTP status) of each webhook delivery
        self.push_twice = False  # deliver each update a second time after it was taken (Telegram may)
        self._pusher: asyncio.Task[None] | None = None
        self.polls_at_once = 0
        self.most_polls_at_once = 0
        self._ids = itertools.count(1)
        self._message_ids = itertools.count(100)
        self._lock = threading.Lock()
        self._news: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._current_poll: asyncio.Future[None] | None = None
        self._server = ThreadedServer(self._app(), self.port, "the fake Bot API server", lifespan="off")

    # --- lifecycle ---

    def start(self) -> FakeTelegram:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop()

    # --- the people's side ---

    def say(self, user: int, text: str = "", *, chat: int | None = None, group: bool = False, username: str = "",
            reply_to_bot: int | None = None, document: tuple[str, bytes] | None = None,
            photo: bytes | None = None) -> int:
        """A person writes to the bot (in a private chat, or a group ``chat``); the update's id."""
        chat_id = chat if chat is not None else user
        message: dict[str, Any] = {
            "message_id": next(self._message_ids), "date": int(time.time()),
            "chat": {"id": chat_id, "type": "group", "title": "a group"} if group else
                    {"id": chat_id, "type": "private", "first_name": "P"},
            "from": {"id": user, "is_bot": False, "first_name": "P", **({"username": username} if username else {})},
        }
        if document is not None or photo is not None:
            message["caption"] = text
        else:
            message["text"] = text
        if document is not None:
            file_id = self._file(document[1])
            message["document"] = {"file_id": file_id, "file_unique_id": file_id, "file_name": document[0],
                                   "mime_type": "application/octet-stream", "file_size": len(document[1])}
        if photo is not None:
            file_id = self._file(photo)
            message["photo"] = [{"file_id": file_id, "file_unique_id": file_id, "width": 90, "height": 90,
                                 "file_size": len(photo)}]
        if reply_to_bot is not None:
            message["reply_to_message"] = {"message_id": reply_to_bot, "date": int(time.time()),
                                           "chat": message["chat"], "from": BOT, "text": "…"}
        return self._add({"message": message})

    def press(self, user: int, sent: Sent, data: str, *, username: str = "") -> int:
        """A person presses a button of one of the bot's messages."""
        chat = {"id": sent.chat, "type": "private" if sent.chat > 0 else "group", "first_name": "P"}
        person = {"id": user, "is_bot": False, "first_name": "P", **({"username": username} if username else {})}
        query = {"id": f"cq{next(self._ids)}", "chat_instance": "ci", "from": person,
                 "message": {"message_id": sent.message_id, "date": int(time.time()), "chat": chat, "from": BOT,
                             "text": sent.text},
                 "data": data}
        return self._add({"callback_query": query})

    def to(self, chat: int) -> list[Sent]:
        with self._lock:
            return [s for s in self.sent if s.chat == chat]

    def fail(self, method: str, status: int, times: int = 1, *, retry_after: int | None = None) -> None:
        """The next ``times`` calls of ``method`` answer ``status`` (429: with ``retry_after``)."""
        body: dict[str, Any] = {"ok": False, "error_code": status,
                                "description": f"Too Many Requests: retry after {retry_after}"
                                if status == 429 else "Bad Gateway" if status == 502 else f"error {status}"}
        if retry_after is not None:
            body["parameters"] = {"retry_after": retry_after}
        with self._lock:
            self.failing.setdefault(method, []).extend([(status, body)] * times)

    def hang(self, seconds: float) -> None:
        """Polls arriving in the next ``seconds`` never answer (their connection just hangs)."""
        self.hang_until = time.monotonic() + seconds

    def calls_of(self, method: str) -> list[dict[str, Any]]:
        with self._lock:
            return [params for name, params in self.calls if name == method]

    def _file(self, data: bytes) -> str:
        file_id = f"file{next(self._ids)}"
        self.files[file_id] = data
        return file_id

    def _add(self, update: dict[str, Any]) -> int:
        with self._lock:
            update_id = 5000 + next(self._ids)
            self.updates.append({"update_id": update_id, **update})
        if self._loop is not None and self._news is not None:
            self._loop.call_soon_threadsafe(self._news.set)
        return update_id

    # --- the Bot API ---

    def _app(self) -> Starlette:
        return Starlette(routes=[Route("/bot{token}/{method}", self._method, methods=["GET", "POST"]),
                                 Route("/file/bot{token}/{path:path}", self._download, methods=["GET"])])

    async def _method(self, request: Request) -> Response:
        if self._loop is None:
            self._loop, self._news = asyncio.get_running_loop(), asyncio.Event()
        if request.path_params["token"] != TOKEN:
            return _error(401, "Unauthorized")
        method = request.path_params["method"]
        params = await request_params(request)
        with self._lock:
            self.calls.append((method, params))
            failing = self.failing.get(method)
            injected = failing.pop(0) if failing else None
        if injected is not None:
            return JSONResponse(injected[1], status_code=injected[0])
        handler = getattr(self, METHODS[method], None) if method in METHODS else None
        if handler is None:
            return _error(404, "Not Found: method not found")
        if method == "getUpdates":
            params["_request"] = request  # a hung poll ends when its client gives up
        return await handler(params)  # type: ignore[no-any-return]

    async def _get_me(self, _params: dict[str, Any]) -> Response:
        return _ok(BOT)

    async def _set_webhook(self, params: dict[str, Any]) -> Response:
        url = str(params.get("url", ""))
        if not url.startswith(("http://", "https://")):
            return _error(400, "Bad Request: bad webhook: An HTTPS URL must be provided for webhook")
        self.webhook = (url, str(params.get("secret_token", "")))
        if self._pusher is None or self._pusher.done():
            self._pusher = asyncio.get_running_loop().create_task(self._push())
        return _ok(True)

    async def _delete_webhook(self, _params: dict[str, Any]) -> Response:
        self.webhook = None
        return _ok(True)

    async def _get_webhook_info(self, _params: dict[str, Any]) -> Response:
        url = self.webhook[0] if self.webhook else ""
        with self._lock:
            pending = sum(1 for u in self.updates if u["update_id"] >= self.confirmed)
        return _ok({"url": url, "has_custom_certificate": False, "pending_update_count": pending})

    async def _push(self) -> None:
        """Deliver each update to the webhook in order, again until it is answered 2xx (as Telegram does)."""
        import httpx

        async with httpx.AsyncClient(timeout=10) as client:
            while self.webhook is not None:
                with self._lock:
                    ready = [u for u in self.updates if u["update_id"] >= self.confirmed][:1]
                if not ready:
                    await asyncio.sleep(0.05)
                    continue
                url, secret = self.webhook
                update = ready[0]
                try:
                    answer = await client.post(url, json=update, headers={"X-Telegram-Bot-Api-Secret-Token": secret})
                    status = answer.status_code
                except httpx.HTTPError:
                    status = 0
                self.pushes.append((update["update_id"], status))
                if 200 <= status < 300:
                    if self.push_twice:
                        await client.post(url, json=update, headers={"X-Telegram-Bot-Api-Secret-Token": secret})
                    with self._lock:
                        self.confirmed = update["update_id"] + 1
                else:
                    await asyncio.sleep(0.2)

    async def _get_updates(self, params: dict[str, Any]) -> Response:
        if self.webhook is not None:
            return _error(409, "Conflict: can't use getUpdates method while webhook is active; use deleteWebhook "
                               "to delete the webhook first")
        if self._current_poll is not None and not self._current_poll.done():
            self._current_poll.set_result(None)  # the older poll is told: 409
        me: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._current_poll = me
        self.polls_at_once += 1
        self.most_polls_at_once = max(self.most_polls_at_once, self.polls_at_once)
        try:
            if time.monotonic() < self.hang_until:  # no answer: until the client gives up on the connection
                while not await params["_request"].is_disconnected():
                    await asyncio.sleep(0.1)
                return _error(504, "Gateway Timeout")
            offset = int(params.get("offset") or 0)
            if offset:
                with self._lock:
                    self.confirmed = max(self.confirmed, offset)
                    self.updates = [u for u in self.updates if u["update_id"] >= offset]
            deadline = time.monotonic() + float(params.get("timeout") or 0)
            while True:
                with self._lock:
                    ready = [u for u in self.updates if u["update_id"] >= self.confirmed][:100]
                if ready or time.monotonic() >= deadline:
                    return _ok(ready)
                assert self._news is not None
                self._news.clear()
                waiting = asyncio.ensure_future(self._news.wait())
                await asyncio.wait({waiting, me}, timeout=max(0.0, deadline - time.monotonic()),
                                   return_when=asyncio.FIRST_COMPLETED)
                waiting.cancel()
                if me.done():
                    return _error(409, "Conflict: terminated by other getUpdates request; make sure that only "
                                       "one bot instance is running")
        finally:
            self.polls_at_once -= 1

    async def _send_message(self, params: dict[str, Any]) -> Response:
        text, refused = parsed_text(str(params.get("text", "")), params.get("parse_mode"))
        if refused:
            return _error(400, refused)
        if not text.strip():
            return _error(400, "Bad Request: message text is empty")
        if len(text) > 4096:
            return _error(400, "Bad Request: message is too long")
        sent = Sent(chat=int(params["chat_id"]), message_id=next(self._message_ids), text=text,
                    markup=str(params["text"]), buttons=_buttons(params))
        with self._lock:
            self.sent.append(sent)
        return _ok(self._message(sent))

    async def _edit_message_text(self, params: dict[str, Any]) -> Response:
        text, refused = parsed_text(str(params.get("text", "")), params.get("parse_mode"))
        if refused:
            return _error(400, refused)
        if len(text) > 4096:
            return _error(400, "Bad Request: MESSAGE_TOO_LONG")
        with self._lock:
            found = next((s for s in self.sent if s.chat == int(params["chat_id"])
                          and s.message_id == int(params["message_id"])), None)
            if found is None:
                return _error(400, "Bad Request: message to edit not found")
            buttons = _buttons(params)
            if found.markup == params["text"] and found.buttons == buttons:
                return _error(400, "Bad Request: message is not modified: specified new message content and "
                                   "reply markup are exactly the same as a current content and reply markup")
            found.text, found.markup, found.buttons = text, str(params["text"]), buttons
            found.edits += 1
        return _ok(self._message(found))

    async def _send_chat_action(self, _params: dict[str, Any]) -> Response:
        return _ok(True)

    async def _answer_callback_query(self, params: dict[str, Any]) -> Response:
        with self._lock:
            self.answers.append(params)
        return _ok(True)

    async def _get_file(self, params: dict[str, Any]) -> Response:
        file_id = str(params.get("file_id"))
        if file_id not in self.files:
            return _error(400, "Bad Request: invalid file_id")
        return _ok({"file_id": file_id, "file_unique_id": file_id, "file_size": len(self.files[file_id]),
                    "file_path": f"documents/{file_id}"})

    async def _download(self, request: Request) -> Response:
        file_id = request.path_params["path"].rpartition("/")[2]
        if request.path_params["token"] != TOKEN or file_id not in self.files:
            return Response(status_code=404)
        return Response(self.files[file_id], media_type="application/octet-stream")

    async def _send_document(self, params: dict[str, Any]) -> Response:
        document = params.get("document")
        if not isinstance(document, tuple):
            return _error(400, "Bad Request: there is no document in the request")
        sent = Sent(chat=int(params["chat_id"]), message_id=next(self._message_ids), text="", markup="",
                    document=document)
        with self._lock:
            self.sent.append(sent)
        return _ok({**self._message(sent), "document": {"file_id": "d", "file_unique_id": "d",
                                                        "file_name": document[0]}})

    def _message(self, sent: Sent) -> dict[str, Any]:
        chat = {"id": sent.chat, "type": "private" if sent.chat > 0 else "group", "first_name": "P"}
        return {"message_id": sent.message_id, "date": int(time.time()), "chat": chat, "from": BOT,
                "text": sent.text}


def _buttons(params: dict[str, Any]) -> list[list[dict[str, Any]]]:
    markup = params.get("reply_markup")
    if not markup:
        return []
    parsed = json.loads(markup) if isinstance(markup, str) else markup
    return list(parsed.get("inline_keyboard", []))


def _ok(result: Any) -> JSONResponse:
    return JSONResponse({"ok": True, "result": result})


def _error(status: int, description: str) -> JSONResponse:
    return JSONResponse({"ok": False, "error_code": status, "description": description}, status_code=status)
