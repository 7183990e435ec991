"""A turn's model calls: each under the spend governor (its cost bound held before it is made, what it may have
cost settled after, whatever happens to it), streamed to the person or not, in the flight record before anything
acts on it, and counted in the turn's usage and the Brain's metrics."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from brain.deps import TurnDeps
from brain.llm import LOCAL, Attempt, Completion, resolve_model, wire_tools
from brain.stream import Deltas
from brain.usage import TurnUsage
from bus import otel
from bus.protocol import ChatMessage, ToolSpec
from bus.redis_client import RedisAway
from memory.record_parts import Parts


class ModelCalls:
    def __init__(self, deps: TurnDeps, message: ChatMessage, used: TurnUsage, deltas: Deltas) -> None:
        self.deps, self.message, self.used, self.deltas = deps, message, used, deltas
        settings = deps.settings
        self.name = resolve_model(settings.model) or ""
        # The models a call may be answered by, as priced: the configured name, then each fallback.
        self.models = [LOCAL if settings.model == LOCAL else self.name, *settings.fallbacks]
        self.parts = Parts()  # the flight record's parts this turn has sent (each message hashed and sent once)

    async def call(self, shown: list[dict[str, Any]], tools: list[ToolSpec], *, quiet: bool = False,
                   max_output_tokens: int | None = None) -> Completion:
        """One model call (BudgetExceeded: its bound does not fit, and it is not made). ``quiet``: its text is
        not streamed to the person (a summary). Each request it sends is settled at what it may have cost: a
        cancel, the deadline or a broken stream still cost its prompt and what streamed at least."""
        deps, msg = self.deps, self.message
        spend = deps.spend
        hold = await spend.reserve(msg.agent_id, msg.sender, self.models, shown, tools, job=msg.job) if spend else None
        out = max_output_tokens or (deps.settings.budget.max_output_tokens if hold else None)
        bound = {"max_output_tokens": out} if out else {}
        attempts: list[Attempt] = []  # the client adds each request it sends, as it sends it
        started = time.monotonic()
        params = {"models": self.models, "max_output_tokens": out, "purpose": "summary" if quiet else "turn"}

        async def settle(answered: str | None) -> float:
            if not attempts:  # a client that tells nothing of its requests: one, of the first model, never free
                attempts.append(Attempt(model=answered or self.models[0]))
            for attempt in attempts:  # priced by the names the hold was priced by
                attempt.model = attempt.model if attempt.model in self.models else answered or self.models[0]
            # Not awaited: the cost is known here, and its writes precede the record and the reply in the batcher.
            return await spend.settle_call(hold, msg.agent_id, msg.sender, attempts, shown, tools, job=msg.job,  # type: ignore[union-attr]  # only called with a governor
                                           max_output_tokens=out, wait=False)

        try:
            with otel.span(f"chat {self.name}", kind="client", gen_ai__operation__name="chat",
                           gen_ai__request__model=self.name, gen_ai__conversation__id=msg.session_id) as opened:
                try:
                    completion = await deps.llm.complete(shown, tools, _silent if quiet else self.deltas,  # type: ignore[union-attr]  # checked: a model is configured
                                                         attempts=attempts, **bound)
                finally:
                    self.deltas.flush()  # the call's last words go before anything the turn sends next
                otel.set_attributes(opened, gen_ai__response__model=completion.model,
                                    gen_ai__usage__input_tokens=completion.usage.get("prompt_tokens"),
                                    gen_ai__usage__output_tokens=completion.usage.get("completion_tokens"))
        except BaseException as exc:
            cost = 0.0
            if spend is not None:  # no answer, yet the provider may have read the prompt and streamed some
                cost = await asyncio.shield(settle(None))
                self._spent(cost)
            failed = {"error": f"{type(exc).__name__}: {exc}"[:2000], "cost_usd": cost, "tries": len(attempts),
                      "total_ms": round((time.monotonic() - started) * 1000, 1)}
            with contextlib.suppress(RedisAway):  # the call's own failure is the one to tell
                await asyncio.shield(self._record(shown, tools, params, failed))
            raise
        cost = 0.0
        if spend is not None:
            answered = self.models[min(len(completion.tried), len(self.models) - 1)]
            if not attempts:
                attempts.append(Attempt(model=answered, usage=completion.usage, streamed=[completion.text]))
            cost = await settle(answered)
            self._spent(cost)
        # In the record before anything acts on it (the transcript keeps it too: a resumed turn never asks again).
        await self._record(shown, tools, params, _response(completion, attempts, started, cost))
        self.used.model_calls += 1
        self.used.add_tokens(completion.usage)
        deps.meter.count("pincer_model_calls", completion.model)
        for kind in ("prompt", "completion", "cached"):  # cached: of the prompt's, read from the provider's cache
            deps.meter.count("pincer_model_tokens", completion.model, kind,
                             value=completion.usage.get(f"{kind}_tokens") or 0)
        return completion

    def _spent(self, cost: float) -> None:
        """The call's cost, in the turn's usage and the session's spend (with the next write, not awaited)."""
        self.used.cost_usd += cost
        if cost > 0:
            self.deps.bus.batcher.send(self.deps.sessions.count_spend(self.message.session_id, round(cost * 1_000_000)))

    async def _record(self, shown: list[dict[str, Any]], tools: list[ToolSpec], params: dict[str, Any],
                      response: dict[str, Any]) -> None:
        if self.deps.recorder is None:
            return
        await self.deps.recorder.model_call(self.message.session_id, self.message.message_id, messages=shown,
                                            tools=wire_tools(tools), params=params, response=response,
                                            seen=self.parts)


def _response(completion: Completion, attempts: list[Attempt], started: float, cost: float) -> dict[str, Any]:
    """A model response as the flight record keeps it."""
    first = next((a.first_at for a in attempts if a.first_at), 0.0)
    return {"text": completion.text, "tool_calls": [call.to_openai() for call in completion.tool_calls],
            "finish_reason": completion.finish_reason, "model": completion.model, "usage": completion.usage,
            "tried": completion.tried, "cost_usd": cost,
            "first_token_ms": round((first - started) * 1000, 1) if first else None,
            "total_ms": round((time.monotonic() - started) * 1000, 1)}


async def _silent(_text: str) -> None:
    return None
