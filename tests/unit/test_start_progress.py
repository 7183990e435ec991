"""`pincer up`'s first local-model start as a person sees it: its progress printed, and `pincer status`
saying what it is doing ("fetching the model: 0.4 of 1.1 GB") while the pool is not up yet."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from bus.config import Config
from bus.progress import Progress, Sink
from bus.redis_server import free_port
from gateway.cli.ops import show_status
from gateway.runtime import supervisor
from gateway.runtime.supervisor import Supervisor
from localmodel.weights import WeightsError


def test_status_says_what_the_first_start_does_while_it_fetches(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # Nothing listens there: the pool has not started, as during a first start.
    config = Config(raw={"runtime": {"data_dir": str(tmp_path)}, "redis": {"url": f"redis://127.0.0.1:{free_port()}"}})
    seen: dict[str, Any] = {}

    def prepare(data_dir: Path, model_path: str | None, say: Any, *, sink: Sink) -> Path:
        progress = Progress("fetching the model", 1_117_320_768, sink, unit="bytes")
        progress.update(412_300_000)
        seen["table"] = (asyncio.run(show_status(config, as_json=False)), capsys.readouterr().out)
        seen["json"] = (asyncio.run(show_status(config, as_json=True)), capsys.readouterr().out)
        progress.finish(failed=True)
        raise WeightsError("stopped here by the test")

    monkeypatch.setattr(supervisor, "prepare", prepare)
    code = asyncio.run(Supervisor(config, hands=1, env={}, argv=["up"], local_model=True).run())
    assert code == 1  # the test's stop, said as a start that failed
    status, table = seen["table"]
    assert status == 0 and "starting: fetching the model: 0.4 of 1.1 GB" in " ".join(table.split())
    assert "the pool starts once the local model is ready" in table
    status, raw = seen["json"]
    assert status == 0 and json.loads(raw)["local"]["preparing"] == "fetching the model: 0.4 of 1.1 GB"
    # Not a terminal: lines, each with the supervisor's prefix (the first before the status was asked for).
    assert table.startswith("   pincer | fetching the model: 412.3 MB of 1.1 GB (37%)")
    printed = capsys.readouterr().out
    assert "   pincer | fetching the model: failed, after 0 s" in printed
    assert "error: the local model is not ready: stopped here by the test" in printed
