"""Server-sent events as the HTML standard reads them, whatever way the bytes are cut into chunks."""

from __future__ import annotations

import pytest

from brain.sse import EventStream


def read(*chunks: bytes) -> list[str]:
    stream = EventStream()
    return [data for chunk in chunks for data in stream.feed(chunk)]


def every_cut(raw: bytes) -> list[list[str]]:
    """What the stream gives when its bytes come in three chunks, cut at each two places in turn."""
    return [read(raw[:one], raw[one:two], raw[two:]) for one in range(len(raw) + 1) for two in range(one, len(raw) + 1)]


@pytest.mark.parametrize("end", [b"\n", b"\r\n", b"\r"])
def test_each_line_ending_the_standard_allows_ends_lines_and_events(end: bytes) -> None:
    raw = b"data: one" + end + end + b"data: two" + end + end
    assert read(raw) == ["one", "two"]
    assert all(got == ["one", "two"] for got in every_cut(raw))


def test_a_cr_and_lf_that_come_apart_end_one_line_not_two() -> None:
    # Read as two line ends, "data: a\r" + "\n" would end the event after its first line: "a" then "b" apart.
    assert read(b"data: a\r", b"\ndata: b\r", b"\n\r\n") == ["a\nb"]
    assert read(b"data: a\r", b"\n", b"\n") == ["a"]  # the second LF is a blank line of its own


def test_data_lines_join_with_newlines_and_one_leading_space_is_dropped() -> None:
    assert read(b"data:first\ndata:  second\ndata\n\n") == ["first\n second\n"]


def test_comments_other_fields_and_events_without_data_give_nothing() -> None:
    raw = b": keep-alive\n\nevent: ping\nid: 7\nretry: 100\n\nbogus: x\ndata: real\n\n"
    assert read(raw) == ["real"]


def test_an_empty_data_line_is_an_event_with_empty_data() -> None:
    assert read(b"data:\n\n") == [""]


def test_a_byte_order_mark_at_the_start_is_skipped_and_utf8_is_never_split() -> None:
    raw = "\ufeffdata: caf\u00e9 \u2603\n\n".encode()
    assert all(got == ["caf\u00e9 \u2603"] for got in every_cut(raw))
    assert read(b"data: \xff\n\n") == ["\ufffd"]  # not UTF-8: replaced, not an exception


def test_an_event_not_ended_by_a_blank_line_is_not_given() -> None:
    assert read(b"data: done\n\ndata: half") == ["done"]
    assert read(b"data: done\n\ndata: whole line but no blank one\n") == ["done"]
