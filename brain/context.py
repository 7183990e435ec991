"""Fit a conversation to the model's context window.

Sizes are counted with the tokenizer (brain/tokens.py; loaded only once the bytes alone
no longer prove the conversation fits); the window keeps a
quarter free for the answer. Earlier turns that do not fit are summarised
first (brain/compaction.py); what is still too long is shaped here, in two steps:
1. every tool result longer than its own budget keeps its head and tail, with a
   note in the middle saying how much was cut;
2. while the whole is still too long, the oldest tool results are compacted to a
   one-line note, then the oldest earlier exchanges are left out (a system message after the pinned
   ones says how many). The system prompt and the current turn's latest results are kept.
The stored transcript is never changed: this shapes only what the model reads.
"""

from __future__ import annotations

from typing import Any

from brain.tokens import count, exceeds, message_tokens

CHARS_PER_TOKEN = 4
ANSWER_SHARE = 0.25  # of the window kept free for the model's reply


def limit_of(window_tokens: int) -> int:
    """What the conversation may take of the window: the rest is kept for the answer."""
    return int(window_tokens * (1 - ANSWER_SHARE))


def shaped(messages: list[dict[str, Any]], result_tokens: int) -> list[dict[str, Any]]:
    """The messages with every tool result cut to its own budget (head and tail kept)."""
    most = result_tokens * CHARS_PER_TOKEN
    return [_cut(message, most) if message["role"] == "tool" else message for message in messages]


def cut_middle(text: str, max_chars: int) -> str:
    """Head and tail of ``text`` within ``max_chars``, with a note on what was left out."""
    if len(text) <= max_chars:
        return text
    keep = max(max_chars - 200, 200)
    head, tail = text[: keep * 2 // 3], text[-(keep // 3):]
    cut = len(text) - len(head) - len(tail)
    return (f"{head}\n[… {cut:,} characters cut from the middle of this result to fit the context window; "
            f"ask for a narrower part if you need them …]\n{tail}")


def fit(messages: list[dict[str, Any]], *, window_tokens: int, result_tokens: int,
        keep_from: int, pinned: int = 1) -> list[dict[str, Any]]:
    """What the model is sent; ``keep_from`` is the index where the current turn starts, and the first
    ``pinned`` messages (the instructions, the compaction note) are always kept."""
    limit = limit_of(window_tokens)
    shaped_ = shaped(messages, result_tokens)
    if not exceeds(shaped_, limit):
        return shaped_
    total = count(shaped_)
    # Compact tool results oldest first, but never the latest batch (what the model must act on now).
    latest = max((i for i, m in enumerate(shaped_) if m["role"] == "assistant"), default=len(shaped_))
    for index, message in enumerate(shaped_[:latest]):
        if total <= limit:
            return shaped_
        if message["role"] == "tool" and len(message.get("content") or "") > 200:
            before = message_tokens(message)
            shaped_[index] = {**message, "content": f"[compacted: a {len(message['content']):,}-character result of "
                              f"{message.get('name', 'a tool')} shown earlier; call the tool again if you need it]"}
            total -= before - message_tokens(shaped_[index])
    # Still too long: leave out the oldest earlier exchanges (whole user-led groups, never the current turn).
    system, kept, rest = shaped_[0], shaped_[1:pinned], shaped_[pinned:]
    keep_from, dropped = keep_from - pinned, 0
    while total > limit and keep_from > 0:
        end = next((i for i in range(1, keep_from) if rest[i]["role"] == "user"), keep_from)
        total -= count(rest[:end])
        rest, keep_from, dropped = rest[end:], keep_from - end, dropped + end
    # Said in a message of its own after the pinned ones: the instructions stay byte for byte as cached.
    said = [{"role": "system", "content": f"({dropped} earlier message(s) of this conversation were left out to "
             "fit the context window.)"}] if dropped else []
    return [system, *kept, *said, *rest]


def _cut(message: dict[str, Any], max_chars: int) -> dict[str, Any]:
    if message["role"] != "tool" or len(message.get("content") or "") <= max_chars:
        return message
    return {**message, "content": cut_middle(message["content"], max_chars)}
