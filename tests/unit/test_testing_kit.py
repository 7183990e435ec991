"""The testing kit Pincer ships: a skill author's SkillUnderTest and a test's FunctionModel behave as the real
parts they stand for (the loader, the schema, the executor's answers; the LLM client's seam)."""

from __future__ import annotations

from pathlib import Path

import pytest

from brain.llm import Completion
from brain.testing import FunctionModel, tool_call
from hands.skills import SkillRefused
from hands.testing import SkillUnderTest
from tests.conftest import SHIPPED_SKILLS, make_skill


async def test_a_shipped_skill_answers_fails_and_is_refused_bad_arguments_as_the_model_would_read(
        tmp_path: Path) -> None:
    skill = SkillUnderTest(SHIPPED_SKILLS / "word_count", workspace=tmp_path / "ws")
    counted = await skill.call(text="to be or not to be", top=1)
    assert counted.success and counted.data == {"lines": 1, "words": 6, "characters": 18, "top_words": [["to", 2]]}
    (tmp_path / "ws" / "poem.txt").write_text("one two\nthree\n")
    assert (await skill.call(path="poem.txt")).data["words"] == 3  # through the real workspace
    both = await skill.call(text="x", path="poem.txt")
    assert not both.success and both.error is not None and "exactly one of text or path" in both.error.message
    wrong = await skill.call(top="many")
    assert not wrong.success and wrong.error is not None and wrong.error.code == "INVALID_ARGUMENTS"
    assert "top: 'many' is not of type 'integer'" in wrong.error.message
    escape = await skill.call(path="../../etc/passwd")
    assert not escape.success  # the workspace's rules hold in a test too


async def test_progress_and_notes_are_kept_for_the_test_to_read(tmp_path: Path) -> None:
    folder = make_skill(tmp_path / "skills", "remember", "name: remember\ndescription: keeps a note\n"
                        "parameters:\n  text: {type: string}\n",
                        "async def handle(args, ctx):\n"
                        "    await ctx.progress('writing')\n"
                        "    await ctx.memory.write(ctx.agent_id, 'kept', args['text'])\n"
                        "    return {'kept': True}\n")
    skill = SkillUnderTest(folder, workspace=tmp_path / "ws")
    assert (await skill.call(text="milk")).data == {"kept": True}
    assert skill.progress == ["writing"] and await skill.notes.read("main", "kept") == "milk"


def test_a_skill_the_loader_refuses_is_refused_with_its_reason(tmp_path: Path) -> None:
    folder = make_skill(tmp_path / "skills", "greedy", "name: greedy\ndescription: wants everything\n"
                        "parameters:\n  x: {type: string}\npermissions:\n  filesystem:\n    read: ['/etc/**']\n",
                        "def handle(args, ctx):\n    return 1\n")
    with pytest.raises(SkillRefused, match="more than the global policy allows"):
        SkillUnderTest(folder, workspace=tmp_path / "ws")
    notes_only = make_skill(tmp_path / "skills", "howto", "name: howto\ndescription: only words\n", None, "Be kind.")
    with pytest.raises(SkillRefused, match="instructions only"):
        SkillUnderTest(notes_only, workspace=tmp_path / "ws")


async def test_a_function_model_answers_from_the_conversation_and_streams_its_text() -> None:
    async def model(messages, tools):
        if messages[-1]["role"] == "tool":
            return Completion(text=f"it says {messages[-1]['content']}")
        return Completion(tool_calls=[tool_call("read_file", {"path": "a.txt"})])

    llm = FunctionModel(model)
    streamed: list[str] = []

    async def on_text(text: str) -> None:
        streamed.append(text)

    first = await llm.complete([{"role": "user", "content": "read a.txt"}], [], on_text)
    assert first.tool_calls[0].name == "read_file" and first.tool_calls[0].arguments == '{"path": "a.txt"}'
    second = await llm.complete([{"role": "tool", "content": "alpha"}], [], on_text)
    assert second.text == "it says alpha" and streamed == ["it says alpha"] and len(llm.seen) == 2
