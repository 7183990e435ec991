"""A Brain loads the tokenizer (~40 MB) only for a conversation near its window: a plain turn never does, and
the first turn that needs it counts, fits and answers as before."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import Processes
from tests.e2e.conftest import send, start_stack

pytestmark = pytest.mark.e2e


def maps_tiktoken(pid: int) -> bool:
    """Whether the process has tiktoken's compiled core mapped: what importing tiktoken leaves, seen from outside."""
    return "_tiktoken" in Path(f"/proc/{pid}/maps").read_text()


def test_the_tokenizer_is_loaded_only_once_a_conversation_nears_the_window(
        processes: Processes, pincer_env: dict[str, str]) -> None:
    # The direct road (litellm's import loads tiktoken itself), and a window small enough to near in one message.
    processes.env = {**pincer_env, "PINCER_BRAIN__OPENAI_DIRECT": "true",
                     "PINCER_BRAIN__CONTEXT_WINDOW_TOKENS": "8000"}
    start_stack(processes, hands=1)
    brain = next(proc for name, proc, _ in processes.started if name == "brain")
    for n in range(3):
        answered = send(processes.env, f"hello {n}", session="lean")
        assert answered.status_code == 200, answered.text
    assert answered.json()["text"]
    assert not maps_tiktoken(brain.pid)

    # ~7,200 bytes: more than the 6,000 tokens the window leaves, in bytes; ~1,200 tokens when counted.
    long = send(processes.env, "lorem ipsum dolor " * 400, session="lean")
    assert long.status_code == 200, long.text
    assert long.json()["text"]
    assert maps_tiktoken(brain.pid)
