"""The order of a response's calls, and what of a long conversation the model is sent."""

from __future__ import annotations

import json

import pytest

from brain.context import fit
from brain.llm import ToolCall
from brain.plan import plan
from brain.prompt import context_prompt, system_prompt
from brain.tokens import count as estimate_tokens
from bus.protocol import SkillInfo, ToolSpec


def spec(name: str, category: str = "skill", after: list[str] | None = None) -> ToolSpec:
    metadata = {"category": category, **({"after": after} if after else {})}
    return ToolSpec(name=name, description=name, parameters={"type": "object"}, metadata=metadata)


def calls(*names: str) -> list[ToolCall]:
    return [ToolCall(id=f"c{i}", name=name, arguments="{}") for i, name in enumerate(names)]


SPECS = {s.name: s for s in [
    spec("web_search", "network"), spec("web_fetch", "network", ["web_search"]), spec("read_file", "file"),
    spec("summarise", "skill", ["category:network"]),
]}


def test_independent_calls_run_in_parallel() -> None:
    order = plan(calls("read_file", "web_search", "read_file"), SPECS)
    assert order.waits == [set(), set(), set()] and not order.sequential and not order.refused


def test_a_fetch_with_a_search_runs_after_it_whatever_their_order() -> None:
    order = plan(calls("web_fetch", "read_file", "web_search", "web_fetch"), SPECS)
    assert order.waits == [{2}, set(), set(), {2}]  # fetches wait for the search, not for each other
    assert order.sequential


def test_a_category_dependency_waits_for_every_call_of_it() -> None:
    order = plan(calls("summarise", "web_fetch", "web_search", "read_file"), SPECS)
    assert order.waits[0] == {1, 2} and order.waits[1] == {2}


def test_a_fetch_alone_waits_for_nothing() -> None:
    assert plan(calls("web_fetch"), SPECS).waits == [set()]


def test_a_cycle_is_refused_and_the_other_calls_still_run() -> None:
    specs = {**SPECS, "a": spec("a", after=["b"]), "b": spec("b", after=["a"])}
    order = plan(calls("a", "read_file", "b"), specs)
    why = order.refused[0]
    assert set(order.refused) == {0, 2} and "cycle" in why and ("a → b" in why or "b → a" in why)
    assert 1 not in order.refused and order.waits[1] == set()


def test_unknown_tools_have_no_order() -> None:
    assert plan(calls("invented", "web_fetch"), SPECS).waits == [set(), set()]


def conversation(results: list[str], current: int) -> list[dict]:
    """A system prompt, then exchanges each with one tool result; the last ``current`` are this turn's."""
    messages = [{"role": "system", "content": "be helpful"}]
    for i, result in enumerate(results):
        messages += [{"role": "user", "content": f"question {i}"},
                     {"role": "assistant", "content": None, "tool_calls": [
                         {"id": f"c{i}", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}]},
                     {"role": "tool", "tool_call_id": f"c{i}", "name": "read_file", "content": result}]
    return messages


def test_a_large_result_keeps_head_and_tail_with_a_note() -> None:
    text = "HEAD" + "x" * 100_000 + "TAIL"
    shown = fit(conversation([text], 1), window_tokens=1_000_000, result_tokens=1_000, keep_from=1)
    content = shown[-1]["content"]
    assert content.startswith("HEAD") and content.endswith("TAIL") and len(content) < 4_500
    assert "characters cut from the middle" in content


def test_small_conversations_are_sent_as_they_are() -> None:
    messages = conversation(["short"], 1)
    assert fit(messages, window_tokens=32_000, result_tokens=1_000, keep_from=1) == messages


def words(tag: str, n: int) -> str:
    """About ``n`` tokens of text (each numbered word is a token or two)."""
    return " ".join(f"{tag}{i}" for i in range(n // 2))


def test_older_results_are_compacted_first_and_the_latest_kept() -> None:
    results = [words("a", 800), words("b", 800), words("c", 800)]
    messages = conversation(results, 1)
    shown = fit(messages, window_tokens=3_000, result_tokens=1_000, keep_from=7)
    tools = [m["content"] for m in shown if m["role"] == "tool"]
    assert tools[0].startswith("[compacted") and tools[-1] == results[2]
    assert estimate_tokens(shown) <= 3_000 * 0.75
    assert messages[3]["content"] == results[0]  # the caller's list (the transcript) is untouched


def test_earlier_exchanges_are_left_out_when_compacting_is_not_enough() -> None:
    messages = conversation([words("x", 30)] * 40, 1)
    messages[-3]["content"] = "the question now"
    keep_from = len(messages) - 3
    shown = fit(messages, window_tokens=1_000, result_tokens=1_000, keep_from=keep_from)
    assert shown[0] == messages[0]  # the instructions as they are (a provider's cache reads them)
    assert shown[1]["role"] == "system" and "left out to fit" in shown[1]["content"]
    assert shown[2]["role"] == "user"  # whole exchanges go, a tool result never loses its call
    assert shown[-3:] == messages[-3:]  # the current turn is kept
    assert estimate_tokens(shown) <= 750


def test_the_prompt_lists_skills_and_the_newest_memory_notes_after_them() -> None:
    notes = [{"key": f"note{i}", "preview": f"about {i}", "updated": i, "chars": 10} for i in range(40)]
    prompt = system_prompt("Be brief.", [SkillInfo(name="tidy", description="tidies notes", location="/x")])
    assert prompt.startswith("Be brief.") and "- tidy: tidies notes" in prompt and "memory" not in prompt
    context = context_prompt(notes, client="Answer in French.")
    assert context.startswith("The client application adds these instructions:\nAnswer in French.")
    assert "- note39: about 39" in context and "note0:" not in context and "10 older notes" in context


@pytest.mark.parametrize("notes", [None, []])
def test_no_memory_no_memory_section(notes) -> None:
    assert context_prompt(notes) == ""


def test_results_json_survives_cutting() -> None:
    text = json.dumps({"rows": list(range(20_000))})
    shown = fit(conversation([text], 1), window_tokens=1_000_000, result_tokens=500, keep_from=1)
    assert shown[-1]["content"].startswith('{"rows": [0, 1')
