"""Pincer's own eval corpus (evals/), replayed offline through `pincer eval` against a real Hands worker
on a real Redis, configured as the corpus was recorded (tests/eval_corpus.py): every case passes, and the
JUnit file says so."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import junitparser
import pytest

from brain.config import BrainSettings
from brain.evals.cases import load_cases
from brain.evals.report import load_baseline, regressions, save
from brain.replay import Replayer
from bus.streams import Bus
from gateway.cli import main
from gateway.cli.evals import run_cases
from hands.registry import Category, ToolDefinition
from tests.eval_corpus import EVALS, ROOT, corpus_config, hands


async def test_the_corpus_passes_offline(bus: Bus, redis_url: str, prefix: str, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    for name in list(os.environ):
        if name.startswith("PINCER_"):
            monkeypatch.delenv(name)  # config.yaml as the corpus was recorded with, nothing of this shell's
    monkeypatch.setenv("PINCER_REDIS_URL", redis_url)
    monkeypatch.setenv("PINCER_REDIS__PREFIX", prefix)  # this test's keys, where its Hands worker listens
    (tmp_path / "ws").mkdir()
    async with hands(bus, tmp_path / "ws"):
        status = await asyncio.to_thread(main, ["--config", str(ROOT / "config.yaml"), "eval", str(EVALS),
                                                "--junit", str(tmp_path / "eval.xml")])
    out = capsys.readouterr().out
    assert status == 0, out
    suite = next(iter(junitparser.JUnitXml.fromfile(str(tmp_path / "eval.xml"))))
    assert suite.tests >= 6 and suite.failures == 0 and suite.skipped == 0, out
    assert "passed, 0 failed, 0 skipped" in out


async def test_a_changed_tool_schema_is_named_against_the_baseline(bus: Bus, tmp_path: Path) -> None:
    settings = corpus_config().section("brain", BrainSettings)
    cases = load_cases(EVALS)
    (tmp_path / "ws").mkdir()
    async with hands(bus, tmp_path / "ws") as worker:
        async with Replayer(bus, settings) as replayer:
            save(await run_cases(replayer, cases, None), tmp_path / "baseline.json")
        worker.registry.register(ToolDefinition(  # a skill installed since: every request's tool list changes
            name="weather", description="Today's weather for a city.", category=Category.SKILL,
            parameters={"type": "object", "properties": {"city": {"type": "string"}}}, handler=_nothing))
        async with Replayer(bus, settings) as replayer:
            now = await run_cases(replayer, cases, None)
    named = regressions(now, load_baseline(tmp_path / "baseline.json"))
    assert all(not r.passed and "left the recording at turn 1, model call 1" in r.failures[0] for r in now)
    assert any('+tool {"function":{"description":"Today\'s weather' in line for line in now[0].failures[0].splitlines())
    assert sum("passed in the baseline, fails now" in line for line in named) == len(cases)


async def _nothing(_args: dict[str, object], _ctx: object) -> None:
    return None
