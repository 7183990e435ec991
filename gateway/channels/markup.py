"""The model's Markdown as a chat platform's markup, escaped, and cut where the platform's length limit says.

Only a few forms are carried over (code blocks, inline code, bold, italics); everything else is
text, escaped, so the model's words can never open a tag, end one early or make a link: a
Markdown link is shown as its text and its address, both plain.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable

FENCE = re.compile(r"```[^\n`]*\n?(.*?)```", re.S)
INLINE_CODE = re.compile(r"`([^`\n]+)`")
BOLD = re.compile(r"\*\*(?=\S)(.+?)(?<=\S)\*\*", re.S)
ITALIC = re.compile(r"(?<![\w*])[*_](?=\S)([^*_\n]+?)(?<=\S)[*_](?![\w*])")
LINK = re.compile(r"\[([^\]\n]{1,500})\]\(([^)\s]{1,2000})\)")


def telegram_html(text: str) -> str:
    """``text`` (the model's Markdown) as Telegram's HTML parse mode: every character escaped but the tags
    made here (``<pre>``, ``<code>``, ``<b>``, ``<i>``)."""
    return _fenced(text, lambda code: f"<pre>{html.escape(code, quote=False)}</pre>", _inline)


def _fenced(text: str, block: Callable[[str], str], inline: Callable[[str], str]) -> str:
    """``text`` with its fenced code blocks rendered by ``block`` and everything between by ``inline``."""
    out: list[str] = []
    last = 0
    for found in FENCE.finditer(text):
        out.append(inline(text[last:found.start()]))
        out.append(block(found.group(1).rstrip()))
        last = found.end()
    out.append(inline(text[last:]))
    return "".join(out)


def _inline(text: str) -> str:
    def italics(part: str) -> str:
        return ITALIC.sub(r"<i>\1</i>", part)

    def plain(part: str) -> str:
        # Each bold span is one unit to the italics around it (a mark "<N>", which escaped text cannot hold):
        # an italic may hold a whole bold span, never end inside one ("**a _b** c_" would overlap the tags,
        # and Telegram refuses the whole message for that).
        spans: list[str] = []

        def mark(found: re.Match[str]) -> str:
            spans.append(f"<b>{italics(found.group(1))}</b>")
            return f"<{len(spans) - 1}>"

        marked = italics(BOLD.sub(mark, html.escape(part, quote=False)))
        return re.sub(r"<(\d+)>", lambda found: spans[int(found.group(1))], marked)

    return _coded(text, lambda code: f"<code>{html.escape(code, quote=False)}</code>", plain)


def _coded(text: str, code: Callable[[str], str], plain: Callable[[str], str]) -> str:
    """``text`` with its inline code rendered by ``code`` and the rest (links made plain text) by ``plain``."""
    parts = INLINE_CODE.split(text)  # odd places: code
    return "".join(code(part) if index % 2 else plain(plain_links(part)) for index, part in enumerate(parts))


def slack_mrkdwn(text: str) -> str:
    """``text`` (the model's Markdown) as Slack's mrkdwn: ``&``, ``<`` and ``>`` escaped everywhere (so no
    link, mention or @channel can be made), ``**bold**`` as ``*bold*``, code kept, links as plain text."""
    return _fenced(text, lambda code: f"```{_slack_escape(code)}```", _slack_inline)


def _slack_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _slack_inline(text: str) -> str:
    return _coded(text, lambda code: f"`{_slack_escape(code)}`", lambda part: BOLD.sub(r"*\1*", _slack_escape(part)))


def plain_links(text: str) -> str:
    """Markdown links as their text and their address, both plain."""
    return LINK.sub(lambda m: f"{m.group(1)} ({m.group(2)})", text)


def split_text(text: str, limit: int) -> list[str]:
    """``text`` in pieces of at most ``limit`` characters, cut at a paragraph, else a line, else a space; a
    code block cut in two is closed at the end of one piece and opened again in the next."""
    pieces: list[str] = []
    rest = text
    budget = max(limit - 8, 16)  # room for a fence closed and opened again
    while len(rest) > budget:
        cut = rest.rfind("\n\n", 0, budget)
        if cut < budget // 2:
            cut = rest.rfind("\n", 0, budget)
        if cut < budget // 2:
            cut = rest.rfind(" ", 0, budget)
        if cut < budget // 2:
            cut = budget
        piece, rest = rest[:cut], rest[cut:].lstrip("\n")
        if piece.count("```") % 2:  # inside a code block: close it here, open it again there
            piece, rest = piece + "\n```", "```\n" + rest
        pieces.append(piece)
    if rest or not pieces:
        pieces.append(rest)
    return pieces


def fitted(text: str, limit: int, render: Callable[[str], str] = telegram_html) -> list[str]:
    """``text`` rendered (Telegram's HTML by default) in messages that each fit ``limit`` characters once
    rendered."""
    out: list[str] = []
    for piece in split_text(text, limit):
        rendered = render(piece)
        if len(rendered) <= limit:
            out.append(rendered)
        else:  # escapes made it longer: cut the piece smaller
            half = len(piece) // 2
            out.extend(fitted(piece[:half], limit, render) + fitted(piece[half:], limit, render))
    return out
