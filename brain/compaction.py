"""Compaction: earlier turns that no longer fit the model's window become a note the session keeps.

When a turn's conversation will not fit (counted with the tokenizer), the
earlier turns (and the previous note, if any) are summarised by the model into
a note of at most ``brain.compaction.summary_share`` of the window. The note is
a transcript entry marking how many entries it covers; later turns read the
note and what came after it. The guarantees:

- **Bounded.** A summary over its share (or a summary call that failed) is
  replaced by a deterministic cut of the same text, and the note says which.
  The note is made from the previous note and the turns since, never from
  itself again, so it cannot grow turn by turn.
- **Progress.** A note covers whole earlier turns, never the current one, and
  only more entries than the last note did; a note no smaller than what it
  replaces is not kept. At most one per turn: what still does not fit has its
  oldest exchanges left out (brain/context.py).
- **Nothing lost.** The summarised entries stay in the transcript, and memory
  search finds them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from brain.context import cut_middle, limit_of
from brain.llm import LLMError
from brain.spend import BudgetExceeded
from brain.tokens import count, tokens
from memory.sessions import TranscriptEntry

# Asks the model (not streamed, priced like any call): the messages and the most it may write -> its text.
Ask = Callable[[list[dict[str, Any]], int], Awaitable[str]]

HEAD = "[Summary of the earlier conversation, made to fit the context window"
PROMPT = ("Summarise the conversation below for your own later use: you will continue it without seeing it. "
          "Keep every fact, name, number, date, decision, promise and open question, and what the person asked "
          "for; drop greetings and repetition. Write plain notes of at most {words} words.")
RESULT_CHARS = 600  # of each tool result, in what is summarised


@dataclass
class Live:
    """What of a session's history a turn reads: the last note's text, and the entries after what it covers."""

    note: str | None
    entries: list[TranscriptEntry]
    boundary: int  # the entries before this index are in the note
    compacted_now: bool  # the current turn made the note (it is resumed): no second one


def live(before: list[TranscriptEntry], turn: list[TranscriptEntry]) -> Live:
    boundary, note, now = 0, None, False
    for index, entry in enumerate([*before, *turn]):
        until = entry.marks.summary_until
        if until is not None and until >= boundary:
            boundary, note, now = until, entry.content, index >= len(before)
    return Live(note=note, entries=[e for e in before[boundary:] if not is_note(e)], boundary=boundary,
                compacted_now=now)


def is_note(entry: TranscriptEntry) -> bool:
    return entry.marks.summary_until is not None


def with_note(system: dict[str, Any], note: str | None) -> dict[str, Any]:
    """The system message with the note after the instructions."""
    if not note:
        return system
    return {**system, "content": f"{system.get('content') or ''}\n\n{note}\n(The whole conversation is in this "
                                 "session's transcript; memory_search finds what the summary left out.)"}


def source_text(note: str | None, entries: list[TranscriptEntry], max_tokens: int) -> str:
    """What is summarised: the previous note and the entries since, as lines, cut to ``max_tokens``."""
    lines = [note] if note else []
    for entry in entries:
        if entry.role == "user":
            lines.append(f"Person: {entry.content or ''}")
        elif entry.role == "assistant":
            calls = ", ".join(c["function"]["name"] for c in entry.tool_calls or ())
            lines.append(f"You: {entry.content or ''}{f' (called {calls})' if calls else ''}".rstrip())
        else:
            lines.append(f"Result of {entry.name or 'a tool'}: {cut_middle(entry.content or '', RESULT_CHARS)}")
    return truncate("\n".join(lines), max_tokens)


def truncate(text: str, max_tokens: int) -> str:
    """``text`` within ``max_tokens``, its head and tail kept (the deterministic summary)."""
    chars = max_tokens * 4
    while tokens(text) > max_tokens and chars > 100:
        text, chars = cut_middle(text, chars), chars * 3 // 4
    return text


def prompt(max_tokens: int) -> str:
    return PROMPT.format(words=max(50, max_tokens * 3 // 4))


def note_text(summary: str, method: str) -> str:
    return f"{HEAD} ({method})]\n{summary}"


async def summarise(ask: Ask, note: str | None, entries: list[TranscriptEntry], *, window: int,
                    share: float) -> tuple[str, str]:
    """The new note's text from the previous note and the entries since, and how it was made: by the model, or
    (a summary over the budget, empty, or a failed call) cut deterministically, saying why."""
    budget = max(64, int(window * share))
    source = source_text(note, entries, int(limit_of(window) * 0.6))
    try:
        summary = (await ask([{"role": "system", "content": prompt(budget)},
                              {"role": "user", "content": source}], budget)).strip()
        size = tokens(summary)
        method = "summarised by the model" if summary and size <= budget else \
            f"truncated: the model's summary took {size:,} tokens, over the {budget:,} allowed"
    except (LLMError, BudgetExceeded) as exc:
        summary, method = "", f"truncated: the summary call failed ({exc})"[:300]
    return (summary if method.startswith("summarised") else truncate(source, budget)), method


def smaller(summary: str, entries: list[TranscriptEntry], note: str | None) -> bool:
    """Whether the summary takes less than what it replaces (else it is not kept)."""
    replaced = count([e.to_llm() for e in entries]) + (tokens(note) if note else 0)
    return tokens(summary) < replaced
