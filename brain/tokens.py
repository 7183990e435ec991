"""Counting tokens: tiktoken's cl100k, from the copy litellm ships (tiktoken would otherwise fetch it from the
internet; litellm's own counter falls back to the same encoding for models it has no tokenizer for, and
fetches others from a model hub, which a pool may not reach). One home for the spend governor's bound and
the context window's fit.

A message's count is kept by its text, so a long conversation is counted once and then only its new
messages (the fit runs before every model call).

The encoding holds ~40 MB once loaded, so the window's checks ask ``exceeds`` first: a cl100k token is at
least one byte of UTF-8, so a conversation whose bytes fit the limit fits it in tokens, and the encoding is
loaded only for one that is nearly full (or for a budget's bound, brain/spend.py). Same answers, same fit.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from collections import OrderedDict
from functools import cache
from pathlib import Path
from typing import Any

from bus.identity import kept, known

MESSAGE_OVERHEAD = 8  # tokens a provider adds around each message
_CACHED = 20_000  # messages' counts kept, by digest (about 2 MB)
COUNTED = "tokens"  # what a message keeps its exact count as
BOUNDED = "most tokens"  # ... and its bound from bytes, before it is counted
_counts: OrderedDict[bytes, int] = OrderedDict()


@cache
def encoding() -> Any:
    spec = importlib.util.find_spec("litellm")
    if spec is not None and spec.submodule_search_locations:
        bundled = Path(next(iter(spec.submodule_search_locations))) / "litellm_core_utils" / "tokenizers"
        os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(bundled))
    import tiktoken

    return tiktoken.get_encoding("cl100k_base")


def tokens(text: str) -> int:
    return len(encoding().encode(text, disallowed_special=()))


def message_tokens(message: dict[str, Any]) -> int:
    """One chat message's tokens, with the provider's overhead around it (kept on a transcript's message)."""
    return kept(message, COUNTED, lambda: _message_tokens(message))


def _message_tokens(message: dict[str, Any]) -> int:
    calls = message.get("tool_calls")
    content, called = message.get("content") or "", json.dumps(calls) if calls else ""
    # Keyed by a digest, not the text: 20,000 tool results of up to 32 KB each would keep hundreds of MB alive.
    key = hashlib.blake2b(f"{message.get('role', '')}\0{content}\0{called}".encode(errors="replace"),
                          digest_size=16).digest()
    found = _counts.get(key)
    if found is None:
        found = _counts[key] = tokens(content) + tokens(called) + MESSAGE_OVERHEAD
        if len(_counts) > _CACHED:
            _counts.popitem(last=False)
    else:
        _counts.move_to_end(key)
    return found


def count(messages: list[dict[str, Any]]) -> int:
    total = 0
    for message in messages:  # a loop, not sum(): a long conversation is summed before every model call
        found = known(message).get(COUNTED)
        total += found if found is not None else message_tokens(message)
    return total


def most_tokens(messages: list[dict[str, Any]]) -> int:
    """At least ``count(messages)``, without the encoding: each message's count where it is known, else its
    bytes (every token is at least one byte of the UTF-8)."""
    total = 0
    for message in messages:
        kept_ = known(message)
        total += kept_.get(COUNTED) or kept_.get(BOUNDED) or _most_tokens(message)
    return total


def _most_tokens(message: dict[str, Any]) -> int:
    def bound() -> int:
        calls = message.get("tool_calls")
        content = message.get("content") or ""
        return _bytes(content) + (len(json.dumps(calls)) if calls else 0) + MESSAGE_OVERHEAD  # dumps is ASCII

    return kept(message, BOUNDED, bound)


def exceeds(messages: list[dict[str, Any]], limit: int) -> bool:
    """``count(messages) > limit``, the encoding loaded only when the bytes cannot tell; once the messages are
    counted, one pass over what is known answers whether they fit."""
    return most_tokens(messages) > limit and count(messages) > limit


def _bytes(text: str) -> int:
    # surrogatepass: a lone surrogate (which a client may send) counts its three bytes, as the encoder sees it.
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
