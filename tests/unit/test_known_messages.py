"""The recorder's process-wide names of plain messages: the same name as naming them afresh, and bounded."""

from memory.record_parts import KnownMessages, canonical, digest


def test_a_message_named_from_memory_has_the_name_and_text_of_naming_it_afresh() -> None:
    known = KnownMessages()
    message = {"role": "user", "content": "hello"}
    first = known.named(message)
    again = known.named({"content": "hello", "role": "user"})  # a new object, keys in another order
    assert first == again == (digest(message), canonical(message))
    assert known.named({"role": "user", "content": "hello!"})[0] != first[0]


def test_messages_that_are_not_plain_strings_are_named_but_not_kept() -> None:
    known = KnownMessages(longest=10)
    for message in ({"role": "assistant", "tool_calls": [{"id": "c1"}]}, {"role": "tool", "content": "x" * 11},
                    {"role": "user", "content": None}, ["not", "a", "dict"]):
        assert known.named(message) == (digest(message), canonical(message))
    assert len(known._names) == 0


def test_at_most_size_messages_are_kept_the_oldest_dropped_first() -> None:
    known = KnownMessages(size=3)
    for n in range(5):
        known.named({"role": "user", "content": str(n)})
    assert sorted(dict(key)["content"] for key in known._names) == ["2", "3", "4"]
