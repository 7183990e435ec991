"""Eval case files: what loads, what is refused (saying the file, the case and the field), and how each
expectation reads an outcome."""

from __future__ import annotations

from pathlib import Path

import pytest

from brain.evals.cases import CaseError, Expect, load_cases
from brain.evals.checks import Outcome, failures, trajectory_matches


def write(tmp_path: Path, name: str, text: str) -> Path:
    (tmp_path / name).write_text(text)
    return tmp_path / name


def test_a_file_holds_one_case_or_a_list_and_a_directory_every_file_in_name_order(tmp_path: Path) -> None:
    write(tmp_path, "b.yaml", "- name: two\n  conversation: [{user: hi}]\n- name: three\n  session: r.jsonl\n")
    write(tmp_path, "a.yml", "name: one\nconversation:\n  - user: hello\nexpect: {answer_contains: hi}\n")
    write(tmp_path, "notes.txt", "not a case")
    cases = load_cases(tmp_path)
    assert [c.name for c in cases] == ["one", "two", "three"]
    assert cases[0].expect.answer_contains == ["hi"] and cases[0].sender == "eval"
    assert cases[2].session == tmp_path / "r.jsonl"  # relative to its file


@pytest.mark.parametrize(("text", "said"), [
    ("name: x\n", "give either `conversation`"),
    ("name: x\nconversation: [{user: a}]\nsession: s.jsonl\n", "not both or neither"),
    ("name: x\nconversation: [{usr: a}]\n", "conversation.0.user: Field required"),
    ("name: x\nconversation: [{user: a}]\nexpect: {trajectory_match: loose}\n", "expect.trajectory_match"),
    ("name: x\nconversation: [{user: a}]\nexpect: {answer_regex: '('}\n", "not a regular expression"),
    ("name: x\nconversation: [{user: a}]\nexpect: {min_cache_hit: 2}\n", "expect.min_cache_hit"),
    ("name: x\nconversation: [{user: a}]\nexpect: {max_tokns: 5}\n", "expect.max_tokns: Extra inputs"),
    ("name: [unclosed\n", "not YAML"),
    ("- just a string\n", "case 1: a case is a mapping"),
])
def test_a_bad_case_says_where_and_what(tmp_path: Path, text: str, said: str) -> None:
    path = write(tmp_path, "bad.yaml", text)
    with pytest.raises(CaseError) as caught:
        load_cases(path)
    assert str(path) in str(caught.value) and said in str(caught.value)


def test_names_are_unique_and_a_path_must_exist(tmp_path: Path) -> None:
    write(tmp_path, "a.yaml", "name: same\nconversation: [{user: a}]\n")
    write(tmp_path, "b.yaml", "name: same\nconversation: [{user: b}]\n")
    with pytest.raises(CaseError, match=r"already in .*a\.yaml"):
        load_cases(tmp_path)
    with pytest.raises(CaseError, match="no such file"):
        load_cases(tmp_path / "missing")
    with pytest.raises(CaseError, match="no case files"):
        load_cases((tmp_path / "empty").mkdir() or tmp_path / "empty")


@pytest.mark.parametrize(("mode", "actual", "ok"), [
    ("strict", ["a", "b"], True), ("strict", ["b", "a"], False),
    ("unordered", ["b", "a"], True), ("unordered", ["a", "b", "b"], False),
    ("subset", ["a"], True), ("subset", ["a", "c"], False), ("subset", ["a", "a"], False),
    ("superset", ["a", "b", "c"], True), ("superset", ["a"], False),
])
def test_trajectory_modes(mode: str, actual: list[str], ok: bool) -> None:
    assert trajectory_matches(["a", "b"], actual, mode) is ok  # type: ignore[arg-type]


def test_each_missed_expectation_is_named() -> None:
    outcome = Outcome(answer="The capital is Paris.", trajectory=["web_fetch"], prompt_tokens=1000,
                      cached_tokens=100, completion_tokens=50, cost_usd=0.02, latency_ms=1500)
    expect = Expect(trajectory=["web_search"], answer_contains=["Paris", "France"], answer_regex=r"^The",
                    max_tokens=1000, max_cost_usd=0.01, min_cache_hit=0.5, max_latency_ms=1000)
    said = failures(expect, outcome)
    assert said[:-1] == ["trajectory (strict): expected ['web_search'], got ['web_fetch']",
                         "answer does not contain 'France'", "tokens 1,050 > 1,000", "cost $0.020000 > $0.010000",
                         "cache hit 10% < 50%", "latency 1,500 ms > 1,000 ms"]
    assert said[-1] == "the answer was: The capital is Paris."
    assert failures(Expect(answer_contains=["Paris"], max_tokens=2000), outcome) == []
    assert failures(Expect(), Outcome(error="a turn failed: TIMEOUT")) == ["a turn failed: TIMEOUT"]
