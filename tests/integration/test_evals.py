"""Evals against a real Brain's recordings and a real Hands worker on a real Redis: offline a case is its
recording replayed (no provider asked), live its messages go to the model; the comparison names what an
injected prompt or price change did, and the JUnit file reads in a JUnit reader that is not ours."""

from __future__ import annotations

from pathlib import Path

import junitparser
import yaml

from brain.config import BrainSettings
from brain.evals.cases import Case, load_cases
from brain.evals.report import Result, junit, load_baseline, regressions, save
from brain.replay import Replayer
from bus.protocol import ChatReply
from bus.streams import Bus
from gateway.cli.evals import run_cases
from memory.flight import FlightRecorder
from tests.integration.brain_fakes import FakeLLM
from tests.integration.test_replay import two_reads_then_answer

CASES = [
    {"name": "reads twice", "session": "reads.jsonl",
     "expect": {"trajectory": ["read_file", "read_file"], "answer_contains": "plain answer",
                "max_tokens": 1000, "min_cache_hit": 0.2, "max_cost_usd": 0.01}},
    {"name": "reads in any order", "session": "reads.jsonl",
     "expect": {"trajectory": ["read_file"], "trajectory_match": "superset",
                "answer_regex": "^plain answer to thanks$"}},
    {"name": "wants a write", "session": "reads.jsonl",
     "expect": {"trajectory": ["write_file"], "trajectory_match": "subset"}},
    {"name": "asks live", "conversation": [{"user": "read a.txt twice"}], "sender": "owner",
     "expect": {"trajectory": ["read_file", "read_file"], "answer_contains": "alpha"}},
]
PRICED = {"fake": {"input_per_mtok": 1.0, "output_per_mtok": 2.0, "cached_input_per_mtok": 0.1}}


async def run(bus: Bus, settings: BrainSettings, cases: list[Case], model: FakeLLM | None = None) -> list[Result]:
    async with Replayer(bus, settings) as replayer:
        return await run_cases(replayer, cases, model)


async def written(bus: Bus, pool, chat, tmp_path: Path, llm: FakeLLM) -> Path:
    await pool(llm, model="fake")  # the name the recording's calls are priced by
    for text in ("read a.txt twice", "thanks"):
        assert isinstance((await chat(text, sender="owner"))[-1], ChatReply)
    recorder = FlightRecorder(bus.redis, bus.keys, keep_s=60)
    (tmp_path / "cases").mkdir()
    (tmp_path / "cases" / "reads.jsonl").write_text("\n".join(await recorder.export("s1")) + "\n")
    (tmp_path / "cases" / "reads.yaml").write_text(yaml.safe_dump(CASES))
    return tmp_path / "cases"


async def test_offline_cases_replay_their_recording_and_check_what_they_expect(
        bus: Bus, pool, chat, tmp_path: Path) -> None:
    llm = FakeLLM(two_reads_then_answer)
    cases = load_cases(await written(bus, pool, chat, tmp_path, llm))
    asked = len(llm.seen)
    settings = BrainSettings(model="fake", prices=PRICED)
    results = await run(bus, settings, cases)
    assert len(llm.seen) == asked  # offline: not one provider request
    reads, superset, write, live = results
    assert reads.passed and reads.mode == "offline", reads.failures
    assert reads.outcome.trajectory == ["read_file", "read_file"] and reads.outcome.model_calls == 4
    # repriced at today's prices: 220 prompt tokens (120 of them cached at a tenth), 11 out, and the plain turn's
    assert reads.outcome.cached_tokens == 120 and 0 < reads.outcome.cost_usd < 0.01
    assert superset.passed, superset.failures
    assert not write.passed and "trajectory (subset): expected ['write_file']" in write.failures[0]
    assert live.skipped and "--live" in live.skipped and live.mode == "skipped"


async def test_the_comparison_names_an_injected_prompt_and_price_regression(
        bus: Bus, pool, chat, tmp_path: Path) -> None:
    llm = FakeLLM(two_reads_then_answer)
    cases = load_cases(await written(bus, pool, chat, tmp_path, llm))[:2]
    good = BrainSettings(model="fake", prices=PRICED)
    save(await run(bus, good, cases), tmp_path / "baseline.json")
    baseline = load_baseline(tmp_path / "baseline.json")

    same = await run(bus, good, cases)
    assert regressions(same, baseline) == []

    dearer = BrainSettings(model="fake", prices={"fake": {**PRICED["fake"], "output_per_mtok": 20.0}})
    priced = regressions(await run(bus, dearer, cases), baseline)
    assert any(line.startswith("reads twice: cost_usd $") for line in priced), priced
    assert not any("fails now" in line for line in priced)

    verse = BrainSettings(model="fake", prices=PRICED, instructions="You are Pincer, and you answer in verse.")
    changed = await run(bus, verse, cases)
    assert not changed[0].passed and "left the recording at turn 1, model call 1" in changed[0].failures[0]
    assert "+    You are Pincer, and you answer in verse." in changed[0].failures[0]
    named = regressions(changed, baseline)
    assert "reads twice: passed in the baseline, fails now: left the recording at turn 1, model call 1:" in named
    assert "reads twice: the answer changed" in named


async def test_a_live_case_asks_the_model_runs_the_tools_and_is_figured_from_its_record(
        bus: Bus, pool, chat, tmp_path: Path) -> None:
    llm = FakeLLM(two_reads_then_answer)
    cases = load_cases(await written(bus, pool, chat, tmp_path, llm))
    asked = len(llm.seen)
    settings = BrainSettings(model="fake", prices=PRICED, tools_list_timeout_s=1.0)
    [live] = await run(bus, settings, cases[3:], llm)
    assert live.mode == "live" and live.passed, live.failures
    assert len(llm.seen) == asked + 3  # read, read, answer
    assert live.outcome.model_calls == 3 and live.outcome.cached_tokens == 120 and live.outcome.cost_usd > 0
    assert (live.outcome.answer or "").startswith("a.txt says {") and live.outcome.latency_ms > 0
    assert await bus.redis.keys(f"{bus.keys.prefix}session:{{eval/*") == []  # the scratch session is gone
    # a recording's messages go live too, and a saved file reads back as a baseline
    [again] = await run(bus, settings, cases[:1], llm)
    assert again.mode == "live" and again.outcome.trajectory == ["read_file", "read_file"], again.failures


async def test_the_junit_file_reads_in_a_junit_reader(bus: Bus, pool, chat, tmp_path: Path) -> None:
    llm = FakeLLM(two_reads_then_answer)
    cases = load_cases(await written(bus, pool, chat, tmp_path, llm))
    results = await run(bus, BrainSettings(model="fake"), cases)
    junit(results, tmp_path / "eval.xml")
    suite = next(iter(junitparser.JUnitXml.fromfile(str(tmp_path / "eval.xml"))))
    assert (suite.tests, suite.failures, suite.skipped) == (4, 1, 1)
    verdicts = {case.name: [type(r).__name__ for r in case.result] for case in suite}
    assert verdicts == {"reads twice": [], "reads in any order": [], "wants a write": ["Failure"],
                        "asks live": ["Skipped"]}
    failure = next(case for case in suite if case.name == "wants a write").result[0]
    assert "expected ['write_file']" in (failure.message or "") and "the answer was" in (failure.text or "")
