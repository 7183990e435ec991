"""Pincer's own eval corpus (evals/), replayed offline through `pincer eval` against a real Hands worker
on a real Redis, configured as the corpus was recorded (tests/eval_corpus.py): every case passes, and the
JUnit file says so."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import junitparser
import pytest

from bus.streams import Bus
from gateway.cli import main
from tests.eval_corpus import EVALS, ROOT, hands


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
