"""bus.identity: values made once per object (ByIdentity, by identity, never by an equal object or a reused id;
Keeping, kept on the object itself), and a transcript's messages that keep what is derived from them."""

from __future__ import annotations

import copy
import json

from brain import tokens
from bus.identity import ByIdentity, Keeping, kept
from memory.record_parts import Parts
from memory.sessions import TranscriptEntry


def test_made_once_per_object_and_again_for_an_equal_but_other_one() -> None:
    made: list[list[int]] = []
    lengths = ByIdentity(lambda key: made.append(key) or len(key))
    first = [1, 2, 3]
    assert lengths(first) == 3 and lengths(first) == 3 and made == [first]
    assert lengths([1, 2, 3]) == 3 and len(made) == 2  # equal, not the same object: made again


def test_the_key_is_kept_alive_so_its_id_is_never_another_objects() -> None:
    lengths = ByIdentity(len)
    assert lengths([1, 2]) == 2  # the list is held by the cache: its id cannot be handed to the next one
    assert lengths([1, 2, 3, 4]) == 4


def test_past_its_size_all_are_dropped() -> None:
    boxes = [[n] for n in range(3)]
    twice = ByIdentity(lambda key: key * 2, size=2)
    for box in boxes:
        twice(box)
    assert len(twice) == 1  # the third found two kept, dropped them, and is kept alone


def test_a_keeping_dict_keeps_what_is_made_from_it_and_a_plain_one_makes_it_again() -> None:
    made: list[str] = []

    def size(value: dict[str, str]) -> int:
        made.append("once")
        return len(value["content"])

    message, plain = Keeping(role="user", content="four"), {"role": "user", "content": "four"}
    assert kept(message, "size", lambda: size(message)) == 4 and kept(message, "size", lambda: size(message)) == 4
    assert made == ["once"]
    assert kept(plain, "size", lambda: size(plain)) == 4 and kept(plain, "size", lambda: size(plain)) == 4
    assert len(made) == 3
    assert message == plain and json.dumps(message) == json.dumps(plain)  # to everyone else, a dict
    for copied in (copy.copy(message), copy.deepcopy(message)):
        assert type(copied) is dict and copied == plain  # a copy may be changed: it keeps nothing


def test_a_transcript_message_is_made_once_counted_and_named_once_and_made_again_when_changed(monkeypatch) -> None:
    entry = TranscriptEntry(role="tool", content="result", tool_call_id="c1", name="read_file")
    message = entry.to_llm()
    assert entry.to_llm() is message and message == {"role": "tool", "content": "result", "tool_call_id": "c1",
                                                     "name": "read_file"}
    counted: list[object] = []
    real = tokens._message_tokens
    monkeypatch.setattr(tokens, "_message_tokens", lambda m: counted.append(m) or real(m))
    first = tokens.message_tokens(message)
    assert tokens.message_tokens(message) == first and tokens.count([message, message]) == 2 * first
    assert counted == [message]  # counted once, however many turns send it
    assert Parts().digest(message) == Parts().digest(message) == Parts().digest(dict(message))
    entry.content = "result\n\nyou called this twice"  # a loop warning, added before the message is sent
    again = entry.to_llm()
    assert again is not message and again["content"].endswith("twice")
    assert tokens.message_tokens(again) > first
