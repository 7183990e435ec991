"""One Brain holds as many model calls open at once as ``brain.max_turns`` says, and no more.

A real Brain (and Hands) on a real Redis calls the scripted OpenAI-compatible server over HTTP, through
the openai SDK and through litellm. Each turn's model call asks the server to hold it (``WAIT n``) until
n requests are open at once: the turns can only finish if the Brain really has them all in flight, so the
tests wait on that fact (with a deadline), never on a clock. A cancelled turn still closes its held call.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from brain.config import BrainSettings
from brain.llm import warm_up
from brain.worker import default_llm
from bus.keys import BRAIN_GROUP
from bus.protocol import ChatCancel, ChatError, ChatReply, ErrorCode, Message
from bus.streams import Bus
from tests.conftest import async_wait_until
from tests.scripted_llm import ScriptedLLM

ROADS = [pytest.param(True, id="openai-sdk"), pytest.param(False, id="litellm")]


@pytest.fixture
def scripted_brain(pool, chat, scripted_llm: ScriptedLLM):
    """A Brain (and Hands) whose model is the scripted server, through the openai SDK or litellm."""
    async def start(*, direct: bool = True, **settings: Any) -> None:
        if not direct:
            await asyncio.to_thread(warm_up)  # litellm's import takes seconds: not inside the turns' wait
        values = {"model": "openai/scripted", "api_base": scripted_llm.api_base, "api_key": "sk-scripted",
                  "openai_direct": direct, "llm_retries": 0, "llm_timeout_s": 60, **settings}
        await pool(default_llm(BrainSettings(**values)), **values)
        assert isinstance((await chat("hello", session_id="warm"))[-1], ChatReply)  # the tool list, cached

    return start


async def turns(chat, texts: dict[str, str]) -> dict[str, Message]:
    """Each session's text sent at once; each session's final event."""
    finals = await asyncio.gather(*(chat(text, session_id=session) for session, text in texts.items()))
    return {session: events[-1] for session, events in zip(texts, finals, strict=True)}


@pytest.mark.parametrize("direct", ROADS)
async def test_one_brain_holds_hundreds_of_model_calls_open_at_once(
        scripted_brain, chat, scripted_llm: ScriptedLLM, direct: bool) -> None:
    await scripted_brain(direct=direct)  # brain.max_turns as shipped
    n = 200
    answers = asyncio.create_task(turns(chat, {f"s{i}": f"WAIT {n}" for i in range(n)}))
    await async_wait_until(lambda: scripted_llm.peak >= n, timeout=60, what=f"{n} model calls open at once")
    finals = await asyncio.wait_for(answers, 60)
    assert all(isinstance(f, ChatReply) and f.text == f"waited for {n}" for f in finals.values())
    assert scripted_llm.peak == n and scripted_llm.abandoned == 0


async def test_the_brains_own_setting_is_the_bound(bus: Bus, scripted_brain, chat,
                                                   scripted_llm: ScriptedLLM) -> None:
    bound, sent = 20, 30
    await scripted_brain(max_turns=bound)
    answers = asyncio.create_task(turns(chat, {f"s{i}": f"WAIT {sent}" for i in range(sent)}))
    await async_wait_until(lambda: scripted_llm.open == bound, what=f"{bound} model calls open")

    async def read_by_the_brain() -> int:
        return int((await bus.redis.xpending(bus.keys.brain_inbox, BRAIN_GROUP))["pending"])

    # Every message is on the stream, and the Brain, its slots full, has read only as many as it runs.
    await async_wait_until(lambda: _length(bus, sent), what=f"{sent} messages on the stream")
    assert await read_by_the_brain() == bound and scripted_llm.open == bound
    scripted_llm.release()
    finals = await asyncio.wait_for(answers, 60)
    assert all(isinstance(f, ChatReply) for f in finals.values())
    assert scripted_llm.peak == bound


async def test_cancelling_one_of_many_held_turns_closes_its_model_call(
        bus: Bus, scripted_brain, chat, scripted_llm: ScriptedLLM) -> None:
    held = 50
    await scripted_brain()
    answers = asyncio.create_task(turns(chat, {f"s{i}": f"WAIT {held + 1}" for i in range(held)}))
    await async_wait_until(lambda: scripted_llm.open == held, what=f"{held} model calls held open")
    await bus.publish(bus.keys.brain_inbox, ChatCancel(session_id="s7", by="tester"))
    # The cancelled turn's connection is closed (the server sees its client go); the others stay open.
    await async_wait_until(lambda: scripted_llm.abandoned == 1, what="the cancelled call's client gone")
    assert scripted_llm.open == held - 1
    scripted_llm.release()
    finals = await asyncio.wait_for(answers, 60)
    cancelled = finals.pop("s7")
    assert isinstance(cancelled, ChatError) and cancelled.code is ErrorCode.CANCELLED
    assert "cancelled by tester" in cancelled.message
    assert all(isinstance(f, ChatReply) and f.text == f"waited for {held + 1}" for f in finals.values())


async def _length(bus: Bus, n: int) -> bool:
    return int(await bus.redis.xlen(bus.keys.brain_inbox)) >= n


def test_litellms_connection_pool_is_no_lower_bound_than_the_setting_allows() -> None:
    # On litellm's road its aiohttp pool (limit, and limit per host) caps calls in flight: brain.max_turns'
    # ceiling stays within it, so the setting is the bound. A litellm release that lowers it fails here.
    from annotated_types import Le
    from litellm import constants

    ceiling = next(m.le for m in BrainSettings.model_fields["max_turns"].metadata if isinstance(m, Le))
    for limit in (constants.AIOHTTP_CONNECTOR_LIMIT, constants.AIOHTTP_CONNECTOR_LIMIT_PER_HOST):
        assert limit == 0 or limit >= ceiling  # 0: aiohttp's "no limit"
