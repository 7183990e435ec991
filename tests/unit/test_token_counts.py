"""Counting a message's tokens: remembered by a digest of the message, never by its text (a Brain counts
thousands of tool results, each up to tens of KB)."""

from __future__ import annotations

import pytest

from brain import tokens
from bus.identity import Keeping


def test_a_count_is_remembered_by_digest_and_a_changed_message_is_counted_again() -> None:
    long = {"role": "tool", "content": "lorem ipsum " * 3_000}
    first = tokens.message_tokens(long)
    assert first == tokens.tokens(long["content"]) + tokens.MESSAGE_OVERHEAD
    assert tokens.message_tokens(dict(long)) == first  # the same message, from the cache
    assert all(isinstance(key, bytes) and len(key) == 16 for key in tokens._counts)  # no text kept alive
    assert tokens.message_tokens({**long, "content": long["content"] + " more words"}) > first
    called = {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "read_file"}}]}
    assert tokens.message_tokens(called) > tokens.message_tokens({"role": "assistant", "content": ""})


@pytest.mark.parametrize("text", ["hello", "lorem ipsum " * 500, "日本語のテキスト" * 300, "emoji 🦀🦀 " * 200,
                                  "a lone surrogate \ud800 here", "<|endoftext|> said twice <|endoftext|>", "",
                                  "\n\n\t  " * 100])
def test_the_bytes_bound_is_never_below_the_count_so_exceeds_answers_as_the_count_does(text: str) -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": text},
                {"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "read_file",
                                                                                   "arguments": '{"path": "ü"}'}}]}]
    exact = tokens.count(messages)
    assert tokens.most_tokens(messages) >= exact
    for limit in (0, exact - 1, exact, exact + 1, tokens.most_tokens(messages)):
        assert tokens.exceeds(messages, limit) == (exact > limit)


def test_once_counted_a_kept_conversation_is_known_to_fit_without_counting_again(monkeypatch) -> None:
    talk = [Keeping(role="user" if i % 2 == 0 else "assistant", content=f"message number {i} with a few words")
            for i in range(40)]
    exact, most = tokens.count(talk), sum(len(m["content"]) + tokens.MESSAGE_OVERHEAD for m in talk)
    assert exact < most  # the bytes alone could not tell that it fits between the two
    assert tokens.most_tokens(talk) == exact  # each message's kept count is the tightest bound known

    def counted(_messages: object) -> int:
        raise AssertionError("counted again")

    monkeypatch.setattr(tokens, "count", counted)
    assert not tokens.exceeds(talk, exact)
    assert not tokens.exceeds(talk, (exact + most) // 2)
    with pytest.raises(AssertionError, match="counted again"):  # over its known size: only a count can tell
        tokens.exceeds(talk, exact - 1)
    plain = [dict(m) for m in talk]  # plain copies keep nothing: their bound is their bytes
    assert sum(tokens._most_tokens(m) for m in plain) == most
