"""The model's Markdown as a chat platform's markup, escaped, and cut where the platform's length limit says.

Only a few forms are carried over (code blocks, inline code, bold, italics); everything else is
text, escaped, so the model's words can never open a tag, end one early or make a link: a
Markdown link is shown as its text and its address, both plain.
"""

from __future__ import annotations

import html
import re

FENCE = re.compile(r"```[^\n`]*\n?(.*?)```", re.S)
INLINE_CODE = re.compile(r"`([^`\n]+)`")
BOLD = re.compile(r"\*\*(?=\S)(.+?)(?<=\S)\*\*", re.S)
ITALIC = re.compile(r"(?<![\w*])[*_](?=\S)([^*_\n]+?)(?<=\S)[*_](?![\w*])")
LINK = re.compile(r"\[([^\]\n]{1,500})\]\(([^)\s]{1,2000})\)")


def telegram_html(text: str) -> str:
    """``text`` (the model's Markdown) as Telegram's HTML parse mode: every character escaped but the tags
    made here (``<pre>``, ``<code>``, ``<b>``, ``<i>``)."""
    out: list[str] = []
    last = 0
    for block in FENCE.finditer(text):
        out.append(_inline(text[last:block.start()]))
        out.append(f"<pre>{html.escape(block.group(1).rstrip(), quote=False)}</pre>")
        last = block.end()
    out.append(_inline(text[last:]))
    return "".join(out)


def _inline(text: str) -> str:
    parts = INLINE_CODE.split(text)  # odd places: code
    rendered = []
    for index, part in enumerate(parts):
        if index % 2:
            rendered.append(f"<code>{html.escape(part, quote=False)}</code>")
            continue
        part = LINK.sub(lambda m: f"{m.group(1)} ({m.group(2)})", part)
        part = html.escape(part, quote=False)
        part = BOLD.sub(r"<b>\1</b>", part)
        rendered.append(ITALIC.sub(r"<i>\1</i>", part))
    return "".join(rendered)


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


def fitted(text: str, limit: int) -> list[str]:
    """``text`` rendered as Telegram HTML in messages that each fit ``limit`` characters once rendered."""
    out: list[str] = []
    for piece in split_text(text, limit):
        html_piece = telegram_html(piece)
        if len(html_piece) <= limit:
            out.append(html_piece)
        else:  # escapes made it longer: cut the piece smaller
            out.extend(fitted(piece[: len(piece) // 2], limit) + fitted(piece[len(piece) // 2:], limit))
    return out
