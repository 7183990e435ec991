"""`pincer backup` under load, `pincer restore` into a fresh data dir and another Redis: the pool goes on there."""

from __future__ import annotations

import json
import tarfile
import threading
import time
from pathlib import Path

import httpx
import pytest
import redis

from bus.redis_server import EmbeddedRedis, free_port
from tests.conftest import Processes, gateway_client, wait_until
from tests.e2e.conftest import create_token, start_stack
from tests.scripted_llm import ScriptedLLM

pytestmark = pytest.mark.e2e


def test_a_backup_taken_under_load_restores_into_a_fresh_place_and_the_pool_goes_on(
        processes: Processes, pincer_env: dict[str, str], scripted_llm: ScriptedLLM, tmp_path: Path) -> None:
    data, workspace = Path(pincer_env["PINCER_DATA_DIR"]), Path(pincer_env["PINCER_WORKSPACE"])
    data.mkdir(parents=True, exist_ok=True)
    (data / "secrets.env").write_text("OPENAI_API_KEY=sk-never-in-the-archive\n")
    (data / "secrets.env").chmod(0o600)
    (data / "config.yaml").write_text("# the operator's own\n")
    (workspace / "plan.md").write_text("step one\n")
    pincer_env.update({"PINCER_GATEWAY__LIMITS__BURST": "1000", "PINCER_GATEWAY__LIMITS__MESSAGES_PER_MINUTE": "6000"})
    start_stack(processes, hands=1)
    alice = create_token(processes, "alice")
    hook = processes.run("hooks", "add", "ci", "--template", "built: {payload}")
    assert hook.returncode == 0, hook.stderr
    with gateway_client(processes.env, alice) as client:
        assert client.post("/v1/sessions/kept/messages", json={"text": "remember the blue door"}).status_code == 200
        made = client.post("/v1/cron", json={"name": "daily", "cron": "0 8 1 1 *", "message": "what changed?"})
        assert made.status_code == 201, made.text
        next_due = made.json()["next_due"]

    stop = threading.Event()
    answered: list[int] = []

    def load() -> None:  # turns in flight while the snapshot is taken
        with gateway_client(processes.env, alice) as client:
            while not stop.is_set():
                answered.append(client.post("/v1/sessions/busy/messages", json={"text": "hi"}).status_code)

    worker = threading.Thread(target=load)
    worker.start()
    try:
        wait_until(lambda: len(answered) >= 2, timeout=30, what="turns running")
        taken = processes.run("backup", "--dir", str(tmp_path / "backups"), "--json", timeout=120)
        wait_until(lambda: len(answered) >= 4, timeout=30, what="turns still running after the backup")
    finally:
        stop.set()
        worker.join(30)
    assert taken.returncode == 0, taken.stderr
    assert "copying Redis's keys" in taken.stderr and "archiving files" in taken.stderr  # progress, said
    assert set(answered) == {200}
    found = json.loads(taken.stdout)
    archive = Path(found["archive"])
    assert archive.stat().st_mode & 0o777 == 0o600
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
    assert {"manifest.json", "redis.keys", "data/config.yaml", "workspace/plan.md"} <= names
    assert not any("secrets.env" in n or "gateway.token" in n for n in names)
    assert found["manifest"]["secrets"] is False and "signed webhooks' secrets" in found["manifest"]["left_out"]
    verified = processes.run("restore", str(archive), "--verify-only")
    assert verified.returncode == 0 and "verified" in verified.stdout

    processes.stop_all()
    other = EmbeddedRedis(tmp_path / "other-redis")
    url = other.start()
    try:
        fresh_data, fresh_ws = tmp_path / "fresh-data", tmp_path / "fresh-ws"
        processes.env = {**pincer_env, "PINCER_REDIS_URL": url, "PINCER_DATA_DIR": str(fresh_data),
                         "PINCER_WORKSPACE": str(fresh_ws), "PINCER_GATEWAY_PORT": str(free_port())}
        restored = processes.run("restore", str(archive), timeout=120)
        assert restored.returncode == 0, restored.stderr
        assert "rotate each signed webhook" in restored.stderr and "restoring keys" in restored.stderr
        assert (fresh_ws / "plan.md").read_text() == "step one\n"
        assert (fresh_data / "config.yaml").read_text() == "# the operator's own\n"
        assert not (fresh_data / "secrets.env").exists()
        again = processes.run("restore", str(archive))
        assert again.returncode == 1 and "exists" in again.stderr  # never over what is there

        start_stack(processes, hands=1)
        with gateway_client(processes.env, alice) as client:  # the token still works
            assert "kept" in client.get("/v1/sessions").json()["sessions"]
            reply = client.post("/v1/sessions/kept/messages", json={"text": "which door?"})
            assert reply.status_code == 200, reply.text
            jobs = client.get("/v1/cron").json()["jobs"]
        sent = [m.get("content") for m in scripted_llm.requests[-1]["messages"]]
        assert "remember the blue door" in sent and "which door?" in sent  # the session went on
        assert [(j["name"], j["next_due"]) for j in jobs] == [("daily", next_due)]
        assert next_due > time.time()  # fires at its next instant, not missed
        secret = hook.stdout.strip()
        body = b'{"ok": 1}'
        from gateway.server.hooks import signed_headers

        refused = httpx.post(f"http://127.0.0.1:{processes.env['PINCER_GATEWAY_PORT']}/v1/hooks/ci", content=body,
                             headers=signed_headers(secret, body), timeout=30)
        assert refused.status_code == 401  # the hook's secret did not travel
        stored = redis.Redis.from_url(url).hget(f"{pincer_env['PINCER_REDIS__PREFIX']}hooks", "ci")
        assert stored is not None and secret.encode() not in stored
    finally:
        processes.stop_all()
        other.stop()
