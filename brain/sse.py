"""Server-sent events read from a byte stream's chunks, as the HTML standard's event stream interpretation
says (https://html.spec.whatwg.org/multipage/server-sent-events.html#event-stream-interpretation).

The direct road reads a provider's stream over aiohttp, which has no SSE client of its own. httpx-sse's
decoder is private to it and brings httpx (~5 MB) into the Brain; the other parsers on the registry wrap
a whole reconnecting client. Only what a completion's stream needs is kept: each event's data (``id`` and
``retry`` serve reconnection, which a completion never does; ``event`` names are not used by any provider's
chat stream this reads).
"""

from __future__ import annotations

import re

_LINE_END = re.compile(rb"\r\n|\r|\n")  # the standard's three: CRLF, a lone CR, a lone LF


class EventStream:
    """Feed it the stream's bytes as they come; it gives back the data of each event completed so far."""

    def __init__(self) -> None:
        self._partial = b""  # the start of a line whose end has not come yet
        self._data: list[str] = []  # the event being read: its data lines
        self._after_cr = False  # the last chunk ended with CR: an LF starting the next one ends no line
        self._first = True  # the stream's first line: a byte order mark before it is not part of it

    def feed(self, chunk: bytes) -> list[str]:
        if not chunk:
            return []
        if self._after_cr and chunk.startswith(b"\n"):
            chunk = chunk[1:]
        self._after_cr = chunk.endswith(b"\r")
        *lines, self._partial = _LINE_END.split(self._partial + chunk)
        events: list[str] = []
        for line in lines:
            text = line.decode("utf-8", errors="replace")
            if self._first:
                text, self._first = text.removeprefix("\ufeff"), False
            if (data := self._line(text)) is not None:
                events.append(data)
        return events

    def _line(self, line: str) -> str | None:
        """The data of the event this line ends (a blank line), else None."""
        if not line:
            data, self._data = self._data, []
            return "\n".join(data) if data else None  # an event with no data line is not dispatched
        if line.startswith(":"):
            return None  # a comment: servers send them to keep a quiet connection open
        field, colon, value = line.partition(":")
        if field == "data":
            self._data.append(value[1:] if colon and value.startswith(" ") else value)
        return None
