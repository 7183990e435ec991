"""`pincer up`'s first local-model start as a person sees it: its progress printed, and `pincer status`
saying what it is doing ("fetching the model: 0.4 of 1.1 GB") while the pool is not up yet."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from bus.config import Config
from bus.progress import Progress, Sink
from bus.redis_server import free_port
from gateway.cli.ops import show_status
from gateway.runtime import daemon, supervisor
from gateway.runtime.supervisor import Supervisor
from localmodel.weights import WeightsError
from tests.conftest import wait_until

ROOT = str(Path(__file__).resolve().parents[2])


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
    code = Supervisor(config, hands=1, env={}, argv=["up"], local_model=True).run()
    assert code == 1  # the test's stop, said as a start that failed
    status, table = seen["table"]
    assert status == 0 and "starting: fetching the model: 0.4 of 1.1 GB" in " ".join(table.split())
    assert "the pool starts once the local model is ready" in table
    status, raw = seen["json"]
    assert status == 0 and json.loads(raw)["local"]["preparing"] == "fetching the model: 0.4 of 1.1 GB"
    # Not a terminal: lines, each with the supervisor's prefix (the first before the status was asked for).
    assert table.startswith("   pincer | fetching the model: 412.3 MB of 1.1 GB (37%)")
    printed = capsys.readouterr().out
    assert "   pincer | fetching the model: failed at 412.3 MB of 1.1 GB, after 0 s" in printed
    assert "error: the local model is not ready: stopped here by the test" in printed


def test_a_detached_start_says_what_the_first_start_does_while_it_waits(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """`pincer up -d` waits for the state file to say ready; meanwhile it says each new short form it finds
    there. The supervisor is a stand-in that moves on only when the test has seen each line."""
    steps = ["fetching the model: 0.1 of 1.1 GB", "fetching the model: 0.2 of 1.1 GB",
             "installing llama-cpp-python: building (compiling) (1 min)"]
    stand_in = tmp_path / "up.py"
    stand_in.write_text(f"""
import pathlib, time
from gateway.runtime.daemon import DaemonState, StateFile, this_process
data = pathlib.Path({str(tmp_path)!r})
state = DaemonState(supervisor=this_process(), argv=["up"], gateway_url="http://127.0.0.1:9", log_dir=str(data))
def step(n, **fields):
    for name, value in fields.items():
        setattr(state, name, value)
    StateFile(data).write(state)
    deadline = time.monotonic() + 60
    while not (data / f"seen-{{n}}").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
for n, text in enumerate({steps!r}):
    step(n, preparing=text)
step(len({steps!r}), preparing="", ready=True)
""")
    real_popen = daemon.subprocess.Popen

    def popen(argv: list[str], **kwargs: Any) -> Any:  # the stand-in instead of `python -m gateway up`
        return real_popen([sys.executable, str(stand_in)], **{**kwargs, "env": {**os.environ, "PYTHONPATH": ROOT}})

    monkeypatch.setattr(daemon.subprocess, "Popen", popen)
    printed: list[str] = []
    with ThreadPoolExecutor(1) as pool:
        started = pool.submit(daemon.detach, ["up"], data_dir=tmp_path, log_dir=tmp_path / "logs", env={},
                              timeout_s=60)
        try:
            for n, text in enumerate(steps):
                wait_until(lambda text=text: printed.append(capsys.readouterr().out) or text in "".join(printed),
                           timeout=30, what=f"{text!r} said")
                (tmp_path / f"seen-{n}").touch()
            assert started.result(timeout=60) == 0  # the stand-in said ready, and waits
        finally:  # however the test went, the stand-in runs to its end and exits
            for n in range(len(steps) + 1):
                (tmp_path / f"seen-{n}").touch()
    printed.append(capsys.readouterr().out)
    lines = "".join(printed).splitlines()
    assert lines[:3] == [f"pincer: starting: {text}" for text in steps]  # each once, in order
    assert lines[3].startswith("pincer is running in the background")
