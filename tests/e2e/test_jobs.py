"""Scheduled jobs end to end: `pincer cron` through a real Gateway as the token's identity, turns fired by
the scheduler inside real Brain processes (the scripted model over litellm), answers delivered to a
Telegram chat by the real channel process (python-telegram-bot against tests/fake_telegram.py), and a
chat token kept to its own jobs and chats."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Processes, wait_until
from tests.e2e.conftest import create_token, start_stack
from tests.e2e.test_telegram import start_channel
from tests.fake_telegram import TOKEN, FakeTelegram

pytestmark = pytest.mark.e2e

CHAT = 4242


@pytest.fixture
def jobs_env(processes: Processes, pincer_env: dict[str, str], ws: Path, telegram: FakeTelegram) -> dict[str, str]:
    processes.env = {**pincer_env, "PINCER_WORKSPACE": str(ws), "TG_TOKEN": TOKEN,
                     "PINCER_BRAIN__SCHEDULER__TICK_S": "0.2",
                     "PINCER_CHANNELS__TELEGRAM__ENABLED": "true",
                     "PINCER_CHANNELS__TELEGRAM__BOT_TOKEN": "${TG_TOKEN}",
                     "PINCER_CHANNELS__TELEGRAM__API_URL": telegram.api_url,
                     "PINCER_CHANNELS__TELEGRAM__ALLOW_FROM": f'["{CHAT}"]',
                     "PINCER_CHANNELS__TELEGRAM__POLL_TIMEOUT_S": "1",
                     "PINCER_CHANNELS__TELEGRAM__POLL_GRACE_S": "2"}
    start_stack(processes, hands=1)
    return processes.env


def cron(processes: Processes, *args: str, token: str | None = None) -> Any:
    env_token = {"PINCER_TOKEN": token} if token else {}
    done = processes.run("cron", *args, "--json", extra_env=env_token)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_job_made_with_pincer_cron_runs_on_time_is_recorded_and_delivered_to_a_chat(
        processes: Processes, jobs_env: dict[str, str], telegram: FakeTelegram) -> None:
    start_channel(processes, telegram)
    made = cron(processes, "add", "heartbeat", "--every", "2s", "--message", "how are things",
                "--deliver", f"telegram:{CHAT}")
    assert made["owner"] and made["schedule"] == "every 2s" and made["session_id"].endswith("/cron-heartbeat")
    def answers() -> list[Any] | None:
        found = [s for s in telegram.to(CHAT) if s.text == "echo: how are things"]
        return found if len(found) >= 2 else None

    wait_until(answers, timeout=60, what="two answers delivered to the chat")

    def outcomes() -> list[dict[str, Any]] | None:
        runs: list[dict[str, Any]] = cron(processes, "runs", "heartbeat")["runs"]
        return runs if len([r for r in runs if r["outcome"] == "ok"]) >= 2 else None

    runs = wait_until(outcomes, timeout=30, what="two outcomes recorded")
    ok = [r for r in runs if r["outcome"] == "ok"]
    assert all(r["status"] == "fired" and r["turn"] and r["answer"] == "echo: how are things" for r in ok)
    assert all(0 <= r["fired_at"] - r["due"] < 2 for r in ok)  # on time (the lag's figures are in bench/)

    status = processes.run("status", extra_env={"COLUMNS": "200"})
    assert status.returncode == 0 and "scheduler: running, 1 job(s) scheduled" in status.stdout, status.stdout
    paused = cron(processes, "pause", "heartbeat")
    assert paused["paused"] and paused["next_due"] is None
    listed = cron(processes, "list")["jobs"]
    assert [(j["name"], j["paused"]) for j in listed] == [("heartbeat", True)]
    by_hand = cron(processes, "run", "heartbeat")
    assert by_hand["reason"] == "run by hand"
    wait_until(lambda: any(r["turn"] == by_hand["turn"] and r["outcome"] == "ok"
                           for r in cron(processes, "runs", "heartbeat")["runs"]), timeout=30, what="the hand run")
    assert cron(processes, "rm", "heartbeat")["removed"].endswith("/heartbeat")
    assert cron(processes, "list")["jobs"] == []


def test_a_chat_token_keeps_to_its_own_jobs_and_chats(processes: Processes, jobs_env: dict[str, str]) -> None:
    alice = create_token(processes, "alice")
    refused = processes.run("cron", "add", "spam", "--every", "2s", "--message", "x", extra_env={"PINCER_TOKEN": alice})
    assert refused.returncode == 1 and "every 60s at most often" in refused.stderr
    foreign = processes.run("cron", "add", "post", "--every", "1h", "--message", "x", "--deliver",
                            f"telegram:{CHAT}", extra_env={"PINCER_TOKEN": alice})
    assert foreign.returncode == 1 and "only an operator may deliver to telegram:4242" in foreign.stderr
    bad = processes.run("cron", "add", "typo", "--cron", "every day", "--message", "x",
                        extra_env={"PINCER_TOKEN": alice})
    assert bad.returncode == 1 and "is not a cron expression" in bad.stderr
    mine = cron(processes, "add", "daily", "--cron", "0 8 * * 1-5", "--tz", "Europe/Berlin", "--message", "plan",
                token=alice)
    assert mine["owner"] == "alice" and mine["schedule"] == "cron '0 8 * * 1-5' (Europe/Berlin)"
    cron(processes, "add", "owners", "--every", "1h", "--message", "x")
    assert [j["name"] for j in cron(processes, "list", token=alice)["jobs"]] == ["daily"]  # not the owner's
    gone = processes.run("cron", "rm", "owners", extra_env={"PINCER_TOKEN": alice})
    assert gone.returncode == 1 and "no job named 'owners'" in gone.stderr
    nosy = processes.run("cron", "list", "--owner", "*", extra_env={"PINCER_TOKEN": alice})
    assert nosy.returncode == 1 and "only an operator token may list every identity's jobs" in nosy.stderr
    assert [j["id"] for j in cron(processes, "list", "--owner", "alice")["jobs"]] == ["alice/daily"]
    everyone = cron(processes, "list", "--owner", "*")["jobs"]
    assert len(everyone) == 2 and {j["name"]: j["owner"] for j in everyone}["daily"] == "alice"
    paused = cron(processes, "pause", "daily", "--owner", "alice")  # the operator's, on alice's job
    assert paused["id"] == "alice/daily" and paused["paused"] is True
    assert cron(processes, "show", "daily", token=alice)["paused"] is True
    revoked = processes.run("token", "revoke", "alice")  # her jobs run as her: they go with her token
    assert revoked.returncode == 0 and "its jobs removed: daily" in revoked.stderr
    assert [j["name"] for j in cron(processes, "list")["jobs"]] == ["owners"]
