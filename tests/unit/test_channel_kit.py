"""The channel kit's platform-neutral parts: markup that the model's text cannot break, splitting at the
platform's limit, who may talk (allow_from, pairing), settings read from the environment, the streamed reply."""

from __future__ import annotations

import asyncio
import contextlib
import html.parser
import importlib
import inspect
from collections.abc import AsyncIterator
from typing import Any

import pytest
from pydantic import ValidationError

from bus.protocol import ChatTool
from bus.streams import Bus
from gateway.channels.access import Access, pair, paired
from gateway.channels.config import KNOWN, ChannelSettings, TelegramSettings
from gateway.channels.intake import abandoned_after
from gateway.channels.markup import fitted, split_text, telegram_html
from gateway.channels.platform import RETRY_DELAYS, backoff
from gateway.channels.reply import Buttons, Delivery, StreamedReply
from tests.fakes import fake_bus as in_memory_bus


@pytest.fixture
async def fake_bus() -> AsyncIterator[Bus]:
    bus = in_memory_bus()
    yield bus
    await bus.close()


class _Tags(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.stack: list[str] = []
        self.balanced = True

    def handle_starttag(self, tag: str, attrs: Any) -> None:
        self.tags.append(tag)
        self.stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        self.balanced = self.balanced and bool(self.stack) and self.stack.pop() == tag


def tags_of(rendered: str) -> _Tags:
    parser = _Tags()
    parser.feed(rendered)
    parser.close()
    return parser


@pytest.mark.parametrize("hostile", [
    "<a href='http://evil'>click</a>", "</b></pre><script>x</script>", "**bold <i>** mixed</i>",
    "[totally safe](javascript:alert(1))", "```\n</pre><b>\n```", "`<code>` & &amp; &lt;", "*_*_*_", "<<<>>>",
    "**a _b** c_", "_a **b_ c**", "**a *b** c*", "*a **b* c**",  # an italic across a bold's edge
])
def test_the_models_text_never_opens_closes_or_links_a_tag(hostile: str) -> None:
    parser = tags_of(telegram_html(hostile))
    assert parser.balanced and not parser.stack
    assert set(parser.tags) <= {"b", "i", "code", "pre"} and "a" not in parser.tags


def test_an_italic_may_hold_a_whole_bold_span_but_never_end_inside_one() -> None:
    assert telegram_html("_see **this** now_") == "<i>see <b>this</b> now</i>"
    assert telegram_html("**a _b_ c** and _d_") == "<b>a <i>b</i> c</b> and <i>d</i>"
    assert telegram_html("**a _b** c_") == "<b>a _b</b> c_"
    assert telegram_html("**x** <0> _y_") == "<b>x</b> &lt;0&gt; <i>y</i>"  # the mark a bold span leaves is not text's


def test_markdown_forms_become_telegram_tags_and_links_become_plain_text() -> None:
    rendered = telegram_html("**Done**: see `out.txt` and [the docs](https://example.com/x)\n```py\nx < 1\n```")
    assert rendered == ("<b>Done</b>: see <code>out.txt</code> and the docs (https://example.com/x)\n"
                        "<pre>x &lt; 1</pre>")


def test_long_text_is_split_at_lines_and_a_cut_code_block_is_closed_and_reopened() -> None:
    text = "intro\n```\n" + "\n".join(f"line {n} <x>" for n in range(600)) + "\n```\nend"
    pieces = fitted(text, 4096)
    assert len(pieces) > 1 and all(len(p) <= 4096 for p in pieces)
    for piece in pieces:
        parser = tags_of(piece)
        assert parser.balanced and not parser.stack
    joined = "".join(split_text(text, 4096))
    for n in (0, 299, 599):
        assert f"line {n} <x>" in joined
    assert split_text("", 10) == [""] and split_text("short", 4096) == ["short"]
    assert all(len(p) <= 100 for p in split_text("x" * 1000, 100))  # no break anywhere: cut hard


async def test_allow_from_lets_in_ids_and_usernames_and_a_stranger_is_paired_once(fake_bus: Bus) -> None:
    access = Access(fake_bus, "telegram", allow_from=["111", "@Bob_B"], agent="main", pairing_ttl_s=600)
    alice = await access.identity("111")
    assert alice is not None and alice.name == "telegram:111" and alice.agents == ("main",) and not alice.operator
    assert await access.identity("222", "bob_b") is not None  # usernames match whatever their case
    assert await access.identity("999", "mallory") is None
    code, new = await access.code_for("999", "mallory")
    assert new and len(code) == 8 and not set(code) & set("01IO")
    assert await access.code_for("999", "mallory") == (code, False)  # told once, not on every message
    assert await pair(fake_bus, "telegram", "WRONGONE", by="cli") is None
    who = await pair(fake_bus, "telegram", code.lower(), by="cli")
    assert who is not None and who["user"] == "999"
    assert await access.identity("999") is not None and "999" in await paired(fake_bus, "telegram")
    assert await pair(fake_bus, "telegram", code, by="cli") is None  # spent


def test_the_token_is_read_from_the_environment_and_bad_settings_say_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TG_TEST_TOKEN", "1:abc")
    settings = TelegramSettings.model_validate({"bot_token": "${TG_TEST_TOKEN}", "api_url": "http://127.0.0.1:9/"})
    assert settings.bot_token.get_secret_value() == "1:abc" and settings.api_url == "http://127.0.0.1:9"
    with pytest.raises(ValidationError, match="TG_MISSING is not set in the environment"):
        TelegramSettings.model_validate({"bot_token": "${TG_MISSING}"})
    with pytest.raises(ValidationError, match=r"user ids \(digits\) or @usernames"):
        TelegramSettings.model_validate({"allow_from": ["alice smith"]})
    with pytest.raises(ValidationError, match="must be an http"):
        TelegramSettings.model_validate({"api_url": "ftp://x"})


class FakeSurface:
    limit = 50
    edits = True

    def __init__(self) -> None:
        self.messages: dict[str, str] = {}
        self.edited = 0

    def render(self, text: str) -> list[str]:
        return fitted(text, self.limit)

    async def send(self, chat: str, rendered: str, *, buttons: Buttons = ()) -> str:
        message = str(len(self.messages) + 1)
        self.messages[message] = rendered
        return message

    async def edit(self, chat: str, message: str, rendered: str, *, buttons: Buttons = ()) -> None:
        self.messages[message] = rendered
        self.edited += 1

    async def typing(self, chat: str) -> None:
        return None


async def test_a_streamed_reply_edits_one_message_and_splits_only_the_final_answer(fake_bus: Bus) -> None:
    surface = FakeSurface()
    delivery = Delivery(fake_bus, "telegram", "5001")
    reply = StreamedReply(surface, "111", delivery, edit_interval_s=0.01)
    reply.tool(ChatTool(session_id="s", message_id="m", call_id="c1", tool="read_file", status="started",
                        summary="a.txt"))
    for word in ("one ", "two ", "three"):
        reply.delta(word)
        await asyncio.sleep(0.02)  # past the edit interval: each change may be shown
    assert list(surface.messages) == ["1"] and (await delivery.read())["shown"] == "1"
    reply.tool(ChatTool(session_id="s", message_id="m", call_id="c1", tool="read_file", status="finished"))
    await reply.finish("word " * 30)
    assert surface.messages["1"].startswith("⚙ read_file a.txt ✓") and len(surface.messages) >= 3
    assert all(len(m) <= 50 for m in surface.messages.values())
    again = StreamedReply(surface, "111", delivery, edit_interval_s=0.01, shown="1")  # after a restart
    await again.finish("the answer")
    assert surface.messages["1"] == "the answer" and len(surface.messages) >= 3  # edited, not sent anew


async def test_a_surface_without_edits_gets_the_answer_once_whole(fake_bus: Bus) -> None:
    class MailLike(FakeSurface):
        edits = False
        limit = 10_000

    surface = MailLike()
    delivery = Delivery(fake_bus, "email", "9:1")
    reply = StreamedReply(surface, "thread", delivery, edit_interval_s=0.01)
    reply.tool(ChatTool(session_id="s", message_id="m", call_id="c1", tool="read_file", status="started"))
    for word in ("one ", "two "):
        reply.delta(word)
        await asyncio.sleep(0.02)  # past the edit interval: an editing surface would have been sent a draft
    assert surface.messages == {}
    reply.tool(ChatTool(session_id="s", message_id="m", call_id="c1", tool="read_file", status="finished"))
    await reply.finish("one two")
    assert surface.messages == {"1": "⚙ read_file ✓\n\none two"} and surface.edited == 0


async def test_a_poll_that_swallows_its_cancellation_is_abandoned_not_awaited_forever() -> None:
    stopped = asyncio.Event()

    async def stubborn() -> tuple[str, list[Any]]:  # a library that catches CancelledError and goes on waiting
        while not stopped.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(3600)
        return "", []

    with pytest.raises(TimeoutError, match=r"poll did not finish in 0\.05s"):
        await abandoned_after(0.05, stubborn(), what="poll")
    assert await abandoned_after(1.0, asyncio.sleep(0, result="done"), what="quick") == "done"
    stopped.set()
    for task in asyncio.all_tasks() - {asyncio.current_task()}:  # the abandoned poll, woken to see it may end
        task.cancel()
        await asyncio.wait({task}, timeout=1.0)
        assert task.done()


def test_backoff_is_what_the_platform_said_else_the_next_step_capped_and_jitter_only_shortens() -> None:
    assert backoff(0, 7.5) == 7.5 and backoff(3, 0.25) == 0.25  # the platform's own word wins
    assert [backoff(n) for n in range(len(RETRY_DELAYS) + 3)] == [*RETRY_DELAYS, *[RETRY_DELAYS[-1]] * 3]
    assert backoff(2, 0) == RETRY_DELAYS[2]  # "again now" is not a reason to spin
    waits = {backoff(4, jitter=True) for _ in range(50)}
    assert all(RETRY_DELAYS[4] / 2 <= w <= RETRY_DELAYS[4] for w in waits) and len(waits) > 1


def test_every_platform_is_registered_once_by_its_settings_with_a_module_that_opens_it() -> None:
    assert sorted(KNOWN) == sorted(ChannelSettings.model_fields)
    for name in KNOWN:
        settings = ChannelSettings().of(name)
        assert name == settings.NAME and settings.HINT and settings.MODULE.startswith("gateway.channels.")
        opens = importlib.import_module(settings.MODULE).platform
        assert list(inspect.signature(opens).parameters) == ["settings", "bus", "data_dir", "instance_id"]
