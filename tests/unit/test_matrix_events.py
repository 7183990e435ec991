"""The Matrix channel's reading of sync events, without a homeserver: what is a message to the agent, what
answers a question, and what is never answered (its own words, notices, edits: no bot loops)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import nio
import pytest

from gateway.channels.config import MatrixSettings
from gateway.channels.errors import PlatformRefused
from gateway.channels.matrix import ENCRYPTED_FILE, Matrix, _attachment, user_key, without_mention
from tests.fakes import fake_bus

BOT = "@pincer:example.org"
ROOM = "!room:example.org"


@pytest.fixture
async def matrix(tmp_path: Path) -> AsyncIterator[Matrix]:
    bus = fake_bus()
    platform = Matrix(MatrixSettings.model_validate({"homeserver": "http://127.0.0.1:9", "user_id": BOT,
                                                     "access_token": "t"}), bus, store_dir=tmp_path)
    platform.bot_id = BOT
    yield platform
    await platform.close()
    await bus.close()


def message(body: str, *, sender: str = "@alice:example.org", **content: Any) -> dict[str, Any]:
    return {"type": "m.room.message", "sender": sender, "event_id": "$e1",
            "content": {"msgtype": "m.text", "body": body, **content}}


async def test_a_message_and_what_is_never_answered(matrix: Matrix) -> None:
    said = await matrix._update(ROOM, message("hello"))
    assert said is not None and said.text == "hello" and said.user == "alice@example.org" and said.mentioned
    assert said.username == "alice:example.org" and said.chat == ROOM and not said.group
    for never in (message("mine", sender=BOT), message("a bot's notice", msgtype="m.notice"),
                  message("* fixed", **{"m.relates_to": {"rel_type": "m.replace", "event_id": "$e0"}}),
                  {"type": "m.room.member", "sender": "@alice:example.org", "event_id": "$m", "content": {}}):
        assert await matrix._update(ROOM, never) is None


async def test_a_reply_loses_its_quoted_fallback_and_answers_a_question_by_word_or_reaction(matrix: Matrix) -> None:
    await matrix.questions.ask("$ask", {"allow once": "ap:1:o", "✅": "ap:1:o", "deny": "ap:1:d"})
    reply = message("> <@pincer:example.org> Allow exec?\n\nDeny", **{"m.relates_to": {"m.in_reply_to": {
        "event_id": "$ask"}}})
    pressed = await matrix._update(ROOM, reply)
    assert pressed is not None and (pressed.press, pressed.data) == (ROOM, "ap:1:d")
    reaction = {"type": "m.reaction", "sender": "@bob:example.org", "event_id": "$r",
                "content": {"m.relates_to": {"rel_type": "m.annotation", "event_id": "$ask", "key": "✅"}}}
    tapped = await matrix._update(ROOM, reaction)
    assert tapped is not None and tapped.data == "ap:1:o" and tapped.user == "bob@example.org"
    other = await matrix._update(ROOM, {**reaction, "content": {"m.relates_to": {
        "rel_type": "m.annotation", "event_id": "$ask", "key": "👍"}}})
    assert other is None  # a reaction that is not a choice is nothing
    chat = message("> <@x:y> something\n\nmaybe", **{"m.relates_to": {"m.in_reply_to": {"event_id": "$ask"}}})
    words = await matrix._update(ROOM, chat)
    assert words is not None and words.press is None and words.text == "maybe"


def test_user_ids_become_identity_names_that_fit() -> None:
    assert user_key("@alice:example.org") == "alice@example.org"
    odd = user_key("@we/ird=name:example.org")
    assert odd.startswith("h") and len(odd) == 25 and odd != user_key("@we/ird=other:example.org")


def test_an_encrypted_attachment_is_referred_to_with_its_keys() -> None:
    sealed = {"url": "mxc://example.org/abc", "key": {"k": "K"}, "iv": "IV", "hashes": {"sha256": "H"}, "v": "v2"}
    assert _attachment({"url": "mxc://example.org/plain"}) == "mxc://example.org/plain"
    assert json.loads(_attachment({"file": sealed}).removeprefix(ENCRYPTED_FILE)) == sealed
    assert _attachment({"url": "https://elsewhere.example/x"}) == "" and _attachment({"file": "nonsense"}) == ""


def test_a_mention_by_name_or_id_is_left_out_of_the_words() -> None:
    for said, words in [("pincer: what now?", "what now?"), ("@pincer:example.org: hi there", "hi there"),
                        ("Pincer, go on", "go on"), ("hey @pincer:example.org how are you", "hey how are you"),
                        ("thanks pincer for that", "thanks pincer for that"), ("no mention", "no mention")]:
        assert without_mention(said, BOT) == words, said


class Homeserver:
    """room_send as a homeserver answers it: one event per transaction id (a retried step gets the event it
    made), and the errors it was told to give first."""

    def __init__(self, *errors: tuple[str, str]) -> None:
        self.errors = list(errors)  # (event type, errcode) to answer the next such send with, once each
        self.events: dict[str, tuple[str, dict[str, Any]]] = {}  # transaction -> (type, content)
        self.asked: list[str] = []

    async def room_send(self, room_id: str, kind: str, content: dict[str, Any], tx_id: str | None = None,
                        ignore_unverified_devices: bool = False) -> Any:
        self.asked.append(kind)
        for n, (when, code) in enumerate(self.errors):
            if when == kind:
                del self.errors[n]
                return nio.RoomSendError(code, code, retry_after_ms=20)
        tx_id = tx_id or f"random-{len(self.asked)}"
        self.events.setdefault(tx_id, (kind, content))
        return nio.RoomSendResponse(f"$event-{list(self.events).index(tx_id)}", room_id)


BUTTONS = [[("Allow once", "ap:7:o"), ("Always", "ap:7:a"), ("Deny", "ap:7:d")]]


async def test_a_question_waits_out_a_limited_reaction_and_never_asks_again(matrix: Matrix) -> None:
    server = Homeserver(("m.reaction", "M_LIMIT_EXCEEDED"), ("m.reaction", "M_LIMIT_EXCEEDED"))
    matrix.client.room_send = server.room_send  # type: ignore[method-assign]
    asked = await matrix.send(ROOM, "Allow exec?", buttons=BUTTONS)
    kinds = [kind for kind, _ in server.events.values()]
    assert kinds == ["m.room.message", "m.reaction", "m.reaction", "m.reaction"]  # each step once
    assert {c["m.relates_to"]["key"] for k, c in server.events.values() if k == "m.reaction"} == {"✅", "🔁", "❌"}
    assert asked == "$event-0" and server.asked.count("m.room.message") == 1


async def test_a_send_retried_whole_goes_on_from_the_step_that_failed(matrix: Matrix) -> None:
    first = Homeserver()
    calls = 0

    async def second_reaction_refused(room_id: str, kind: str, content: dict[str, Any], tx_id: str | None = None,
                                      ignore_unverified_devices: bool = False) -> Any:
        nonlocal calls
        calls += 1
        if calls == 3:  # the question, the first reaction, then the second is refused
            return nio.RoomSendError("no", "M_FORBIDDEN")
        return await first.room_send(room_id, kind, content, tx_id)

    matrix.client.room_send = second_reaction_refused  # type: ignore[method-assign]
    with pytest.raises(PlatformRefused):
        await matrix.send(ROOM, "Allow exec?", buttons=BUTTONS)
    again = await matrix.send(ROOM, "Allow exec?", buttons=BUTTONS)  # the kit sends it again, whole
    assert again == "$event-0" and [k for k, _ in first.events.values()].count("m.room.message") == 1
    assert len([k for k, _ in first.events.values() if k == "m.reaction"]) == 3  # none twice
    assert first.asked.count("m.reaction") == 3  # the first reaction was not sent again


@pytest.mark.parametrize("odd", [
    {"m.relates_to": "x"}, {"m.relates_to": {"m.in_reply_to": "x"}}, {"m.mentions": []},
    {"m.mentions": {"user_ids": "@pincer:example.org"}}, {"m.relates_to": ["x"]},
])
async def test_fields_of_the_wrong_kind_read_as_absent(matrix: Matrix, odd: dict[str, Any]) -> None:
    said = await matrix._update(ROOM, message("hello", **odd))  # any room member (or their server) writes these
    assert said is not None and said.text == "hello"


@pytest.mark.parametrize(("content", "name", "size"), [
    ({"info": "x"}, "notes.txt", 0), ({"info": {"size": "big"}}, "notes.txt", 0),
    ({"info": {"size": -1, "mimetype": "t" * 300}}, "notes.txt", 0), ({"filename": "n" * 300}, "n" * 255, 0),
    ({"info": {"size": 12, "mimetype": "text/plain"}}, "notes.txt", 12),
])
async def test_a_files_description_is_cut_to_fit_or_read_as_unknown(matrix: Matrix, content: dict[str, Any],
                                                                    name: str, size: int) -> None:
    event = message("notes.txt", msgtype="m.file", url="mxc://example.org/abc", **content)
    said = await matrix._update(ROOM, event)
    assert said is not None and [(f.name, f.size) for f in said.files] == [(name, size)] and said.text == ""


async def test_a_file_that_cannot_be_fetched_leaves_its_words(matrix: Matrix) -> None:
    said = await matrix._update(ROOM, message("notes.txt", msgtype="m.file", url="mxc://example.org/" + "a" * 600))
    assert said is not None and said.files == [] and said.text == "notes.txt"
