"""One case run: offline, its recording replayed through the current code (brain/replay.py: no provider is
asked, no tool runs, a request that differs from the recording fails the case with the diff); or live, its
messages sent to the configured model in a scratch session, tools run by the pool's Hands for the case's
sender. Either way the figures come from the flight record: offline the recording's (its cost repriced at
today's prices, so a price change shows), live the scratch session's own."""

from __future__ import annotations

import time
import uuid
from typing import Any

from brain.catalog import ToolCatalog
from brain.config import BrainSettings
from brain.deps import TurnDeps
from brain.evals.cases import Case
from brain.evals.checks import Outcome
from brain.llm import LLMClient
from brain.replay import Replayer, turns_of
from brain.spend import Governor, price_of
from brain.turn import Turn
from bus.metrics import Meter
from bus.protocol import ChatMessage, ChatReply
from bus.replies import ReplyInbox
from bus.streams import Bus
from memory.flight import FlightRecorder, RecordError, Step, read_lines
from memory.longterm import LongTermMemory
from memory.sessions import SessionStore
from memory.spend import MICRO

SCRATCH = "eval"  # the owner part of a live case's scratch session


def recording(case: Case) -> tuple[list[Step], dict[str, Any]]:
    """The case's recording, read and checked (RecordError: which line and what is wrong)."""
    assert case.session is not None
    try:
        return read_lines(case.session.read_text().splitlines())
    except OSError as exc:
        raise RecordError(f"{case.session}: cannot be read: {exc}") from None


def messages_of(steps: list[Step]) -> list[str]:
    return [str(start.data.get("text") or "") for start, _ in turns_of(steps)]


async def offline(replayer: Replayer, case: Case) -> Outcome:
    steps, parts = recording(case)
    report = await replayer.replay(steps, parts)
    outcome = figures(replayer.settings, steps)
    outcome.trajectory = [tool for turn in report.turns for tool in turn.tools]
    outcome.answer = report.turns[-1].answer if report.turns else None
    stopped = next((turn.error for turn in report.turns if turn.error), None)
    if report.diverged is not None:
        d = report.diverged
        outcome.error = f"left the recording at turn {d.turn}, model call {d.step}:\n{d.diff}"
    elif stopped is not None:
        outcome.error = f"a turn failed: {stopped}"
    return outcome


async def live(bus: Bus, settings: BrainSettings, case: Case, llm: LLMClient) -> Outcome:
    texts = [turn.user for turn in case.conversation] if case.conversation else messages_of(recording(case)[0])
    scratch = f"{SCRATCH}/{uuid.uuid4().hex[:12]}"
    inbox = ReplyInbox(bus, f"eval-{scratch.rpartition('/')[2]}")
    await inbox.start()
    sessions = SessionStore(bus.redis, bus.keys)
    recorder = FlightRecorder(bus.redis, bus.keys, keep_s=3600)
    deps = TurnDeps(bus=bus, inbox=inbox, sessions=sessions, memory=LongTermMemory(bus.redis, bus.keys),
                    catalog=ToolCatalog(bus, inbox, timeout_s=settings.tools_list_timeout_s), settings=settings,
                    llm=llm, spend=Governor(bus, settings, Meter()), recorder=recorder)
    events = f"{bus.keys.prefix}eval:{scratch}:events"
    outcome, slowest = Outcome(), 0.0
    try:
        for text in texts:
            started = time.perf_counter()
            message = ChatMessage(session_id=scratch, text=text, reply_to=events, sender=case.sender,
                                  agent_id=case.agent)
            reply = await Turn(deps, message).run()
            slowest = max(slowest, (time.perf_counter() - started) * 1000)
            if not isinstance(reply, ChatReply):
                outcome.error = f"a turn failed: {reply.code.value}: {reply.message}"
                break
            outcome.answer = reply.text
        steps = await recorder.steps(scratch)
    finally:
        await sessions.delete(scratch)
        await bus.redis.delete(events)
        await inbox.close()
    recorded = figures(settings, steps, reprice=False)
    recorded.answer, recorded.error, recorded.latency_ms = outcome.answer, outcome.error, slowest
    recorded.trajectory = [str(step.data.get("tool")) for step in steps if step.kind == "tool"]
    return recorded


def figures(settings: BrainSettings, steps: list[Step], *, reprice: bool = True) -> Outcome:
    """Model calls, tokens, cost and the slowest turn of a record. ``reprice``: each call's cost at the prices
    configured now (a model with no known price keeps its recorded cost)."""
    outcome = Outcome()
    for start, taken in turns_of(steps):
        ends = [step.at for step in taken if step.kind in ("model", "stop")]
        if ends:
            outcome.latency_ms = max(outcome.latency_ms, float(max(ends) - start.at))
        for step in taken:
            if step.kind != "model":
                continue
            response = step.data.get("response") or {}
            usage = response.get("usage") or {}
            prompt, cached = int(usage.get("prompt_tokens") or 0), int(usage.get("cached_tokens") or 0)
            completion = int(usage.get("completion_tokens") or 0)
            outcome.model_calls += 1
            outcome.prompt_tokens += prompt
            outcome.cached_tokens += cached
            outcome.completion_tokens += completion
            outcome.cost_usd += _cost(settings, step, prompt, completion, cached) if reprice else \
                float(response.get("cost_usd") or 0)
    return outcome


def _cost(settings: BrainSettings, step: Step, prompt: int, completion: int, cached: int) -> float:
    response = step.data.get("response") or {}
    models = list((step.data.get("request") or {}).get("models") or ())
    tried = len(response.get("tried") or ())
    price = price_of(settings, models[min(tried, len(models) - 1)]) if models else None
    if price is None or "error" in response:
        return float(response.get("cost_usd") or 0)
    return price.micro(prompt, completion, cached) / MICRO
