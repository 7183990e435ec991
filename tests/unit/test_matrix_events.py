"""The Matrix channel's reading of sync events, without a homeserver: what is a message to the agent, what
answers a question, and what is never answered (its own words, notices, edits: no bot loops)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gateway.channels.config import MatrixSettings
from gateway.channels.matrix import ENCRYPTED_FILE, Matrix, _attachment, user_key
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
