"""word_count: lines, words and characters of a text or a workspace file."""

from __future__ import annotations

import os
import re
from collections import Counter
from typing import Any

from bus.protocol import ErrorCode
from hands.errors import ToolFailure

WORD = re.compile(r"[\w'-]+")


def handle(args: dict[str, Any], ctx: Any) -> dict[str, Any]:
    if ("text" in args) == ("path" in args):
        raise ToolFailure(ErrorCode.INVALID_ARGUMENTS, "give exactly one of text or path")
    if "path" in args:
        with ctx.workspace.open_file(args["path"], os.O_RDONLY) as fd, os.fdopen(os.dup(fd), "rb") as handle_:
            text = handle_.read(ctx.settings.max_file_bytes).decode("utf-8", errors="replace")
    else:
        text = args["text"]
    words = WORD.findall(text)
    result: dict[str, Any] = {"lines": len(text.splitlines()), "words": len(words), "characters": len(text)}
    if args.get("top"):
        result["top_words"] = Counter(w.lower() for w in words).most_common(args["top"])
    return result
