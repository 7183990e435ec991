"""The Slack channel end to end: a real `pincer channel slack` process (slack_sdk's Socket Mode client and
Web API client inside), real Brain and Hands processes, litellm against the scripted model, and a local
server speaking Slack's Web API and Socket Mode envelopes (tests/fake_slack.py)."""

from __future__ import annotations

import contextlib
import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bus.redis_server import EmbeddedRedis, free_port
from tests.conftest import Processes, gateway_client, identity_tree, wait_until
from tests.e2e.conftest import channel_rows, channel_state, start_stack
from tests.fake_slack import APP_TOKEN, BOT_TOKEN, BOT_USER, FakeSlack, Posted
from tests.netcut import NetCut
from tests.scripted_llm import ScriptedLLM

pytestmark = pytest.mark.e2e

ALICE, BOB, STRANGER = "UALICE001", "UBOB00001", "UMALLORY1"


def alices(ws: Path) -> Path:
    """Alice's own workspace: her turns see only it."""
    return identity_tree(ws, f"slack:{ALICE}")
DM = f"D{ALICE}"


@pytest.fixture
def slack() -> Iterator[FakeSlack]:
    fake = FakeSlack().start()
    yield fake
    fake.stop()


def slack_settings(slack: FakeSlack) -> dict[str, str]:
    return {"SLACK_BOT": BOT_TOKEN,
            "PINCER_CHANNELS__SLACK__ENABLED": "true",
            "PINCER_CHANNELS__SLACK__BOT_TOKEN": "${SLACK_BOT}",
            "PINCER_CHANNELS__SLACK__APP_TOKEN": APP_TOKEN,
            "PINCER_CHANNELS__SLACK__API_URL": slack.api_url,
            "PINCER_CHANNELS__SLACK__ALLOW_FROM": f'["{ALICE}", "{BOB}"]',
            "PINCER_CHANNELS__SLACK__EDIT_INTERVAL_S": "0.2",
            "PINCER_CHANNELS__SLACK__STALL_S": "20"}


@pytest.fixture
def slack_env(processes: Processes, pincer_env: dict[str, str], ws: Path, slack: FakeSlack) -> dict[str, str]:
    """Brain, Hands (exec asks a person) and a Gateway; the channel's settings, the bot token from ${SLACK_BOT}."""
    (ws / "notes.txt").write_text("the secret word is pincer-42\n")
    mine = alices(ws)
    mine.mkdir(parents=True, exist_ok=True)
    (mine / "notes.txt").write_text("the secret word is pincer-42\n")
    processes.env = {**pincer_env, "PINCER_WORKSPACE": str(ws), "PINCER_HANDS__EXEC__MODE": "ask",
                     "PINCER_HANDS__SANDBOX__ALLOW_DEGRADED": "true",
                     "PINCER_REDIS__CLAIM_IDLE_S": "2", "PINCER_REDIS__REAP_INTERVAL_S": "0.5",
                     **slack_settings(slack)}
    start_stack(processes, hands=1)
    return processes.env


def start_channel(processes: Processes, slack: FakeSlack, name: str = "slack") -> None:
    opened = slack.connections_opened
    processes.start("channel", "slack", name=name)
    wait_until(lambda: slack.connections_opened > opened and "slack: connected" in processes.logs(), timeout=60,
               what="the channel connected by Socket Mode")


def answer(slack: FakeSlack, channel: str, contains: str, *also: str, timeout: float = 60) -> Posted:
    """The bot's message in ``channel`` that shows ``contains`` and each of ``also`` (streamed edits included),
    once it does: a test reading more of it than it waited for would race the reply's last edit."""
    texts = (contains, *also)
    return wait_until(lambda: next((p for p in slack.in_channel(channel) if all(t in p.text for t in texts)), None),
                      timeout=timeout, what=f"a message in {channel} with {texts!r}")


def test_a_plain_turn_and_a_tool_turn_stream_into_one_message_each(
        processes: Processes, slack_env: dict[str, str], slack: FakeSlack) -> None:
    start_channel(processes, slack)
    slack.say(ALICE, "hello &lt;!channel&gt; **there**")  # Slack escapes what people type
    shown = answer(slack, DM, "echo: hello", "there*")
    assert shown.text == "echo: hello &lt;!channel&gt; *there*"  # the model's words cannot ping a channel
    slack.say(ALICE, 'CALL read_file {"path": "notes.txt"}')
    tool = answer(slack, DM, "RESULT read_file", "pincer-42")
    assert "⚙ read_file" in tool.text and "✓" in tool.text
    assert len(slack.in_channel(DM)) == 2 and tool.edits >= 1  # one message per turn, edited as it went
    assert slack.unacked() == 0  # every envelope acknowledged once the bus had it


def test_a_stranger_gets_a_code_once_and_no_model_call_until_paired(
        processes: Processes, slack_env: dict[str, str], slack: FakeSlack, scripted_llm: ScriptedLLM) -> None:
    start_channel(processes, slack)
    asked = len(scripted_llm.requests)
    slack.say(STRANGER, "let me in")
    told = answer(slack, f"D{STRANGER}", "I don't know you yet")
    code = told.text.split("code: ")[1].split()[0]
    slack.say(STRANGER, "please?")
    slack.say(ALICE, "a known person")
    answer(slack, DM, "echo: a known person")
    assert len(slack.in_channel(f"D{STRANGER}")) == 1 and len(scripted_llm.requests) == asked + 1
    paired = processes.run("channels", "pair", code, "--channel", "slack")
    assert paired.returncode == 0 and f"as slack:{STRANGER}" in paired.stdout, paired.stderr
    slack.say(STRANGER, "thanks")
    answer(slack, f"D{STRANGER}", "echo: thanks")


def test_an_approval_is_pressed_by_its_own_person_only(
        processes: Processes, slack_env: dict[str, str], slack: FakeSlack, ws: Path) -> None:
    start_channel(processes, slack)
    slack.say(ALICE, 'CALL exec {"command": "echo approved > out.txt; cat out.txt"}')
    ask = answer(slack, DM, "Allow exec?")
    assert [b["text"]["text"] for b in ask.buttons] == ["Allow once", "Always", "Deny"]
    once = ask.buttons[0]["value"]
    slack.press(BOB, ask, once)  # Bob may talk to the agent, but this is Alice's turn
    wait_until(lambda: slack.ephemeral, timeout=30, what="Bob's press answered to him alone")
    assert slack.ephemeral[0]["user"] == BOB and "not yours" in slack.ephemeral[0]["text"]
    assert not (alices(ws) / "out.txt").exists()
    slack.press(ALICE, ask, once)
    done = answer(slack, DM, "RESULT exec")
    assert "approved" in done.text and (alices(ws) / "out.txt").read_text() == "approved\n"
    wait_until(lambda: len(slack.ephemeral) == 2 and ask.text.startswith("Allowed once."), timeout=30,
               what="the press answered and the question edited")  # both run beside the turn, in no order
    assert slack.ephemeral[1] == {**slack.ephemeral[1], "user": ALICE, "text": "Allowed once."}
    assert not ask.buttons  # the question shows its answer


def test_ask_user_in_a_thread_is_answered_by_its_own_person_only(
        processes: Processes, slack_env: dict[str, str], slack: FakeSlack, scripted_llm: ScriptedLLM) -> None:
    start_channel(processes, slack)
    ask_text = ('CALL ask_user {"questions": [{"text": "Which colour?", "choices": ["red", "blue"]}, '
                '{"text": "Why that one?"}]}')
    top = slack.say(ALICE, f"<@{BOT_USER}> {ask_text}", channel="C0GENERAL")
    ask = answer(slack, "C0GENERAL", "❓ Which colour?")
    assert ask.thread_ts == top and [b["text"]["text"] for b in ask.buttons] == ["red", "blue"]
    answer(slack, "C0GENERAL", "❓ Why that one?")
    blue = ask.buttons[1]["value"]
    slack.press(BOB, ask, blue)  # Bob is in the channel, but this is Alice's question
    wait_until(lambda: slack.ephemeral, timeout=30, what="Bob's press answered to him alone")
    assert slack.ephemeral[0]["user"] == BOB and "not yours" in slack.ephemeral[0]["text"]
    slack.say(BOB, "calm, says Bob", channel="C0GENERAL", thread_ts=top)  # his own turn, not her answer
    answer(slack, "C0GENERAL", "echo: calm, says Bob")
    slack.press(ALICE, ask, blue)
    wait_until(lambda: len(slack.ephemeral) == 2, timeout=30, what="Alice's press answered")
    slack.say(ALICE, "it is calm", channel="C0GENERAL", thread_ts=top)  # in the thread, no mention needed
    answer(slack, "C0GENERAL", "Noted")
    answer(slack, "C0GENERAL", "RESULT ask_user", "blue", "it is calm")
    results = [m["content"] for b in scripted_llm.requests for m in b["messages"] if m.get("role") == "tool"]
    assert [json.loads(r)["answers"] for r in results] == [["blue", "it is calm"]]


def test_in_a_channel_a_mention_opens_a_thread_that_is_its_own_session(
        processes: Processes, slack_env: dict[str, str], slack: FakeSlack, scripted_llm: ScriptedLLM) -> None:
    start_channel(processes, slack)
    slack.say(ALICE, "talking among ourselves", channel="C0GENERAL")
    top = slack.say(ALICE, f"<@{BOT_USER}> remember kiwi", channel="C0GENERAL")
    first = answer(slack, "C0GENERAL", "echo: remember kiwi")
    assert first.thread_ts == top  # answered in a thread under the message
    slack.say(BOB, "and what was the fruit?", channel="C0GENERAL", thread_ts=top)  # no mention: the bot is in it
    answer(slack, "C0GENERAL", "echo: and what was the fruit?")
    assert not any("ourselves" in p.text for p in slack.in_channel("C0GENERAL"))
    other = slack.say(ALICE, f"<@{BOT_USER}> a new thread", channel="C0GENERAL")
    answer(slack, "C0GENERAL", "echo: a new thread")
    assert not any("kiwi" in json.dumps(m) for m in scripted_llm.requests[-1]["messages"])  # its own session
    assert other != top


def test_files_land_in_the_workspace_and_go_back_out(
        processes: Processes, slack_env: dict[str, str], slack: FakeSlack, ws: Path) -> None:
    start_channel(processes, slack)
    slack.say(ALICE, 'CALL read_file {"path": "inbox/slack/data.txt"}',
              file=("../../data.txt", b"hello from a file"))
    answer(slack, DM, "RESULT read_file", "hello from a file")
    slack.say(ALICE, "here you are\n[attach: notes.txt]")
    wait_until(lambda: slack.uploads, timeout=60, what="the file uploaded")
    assert slack.uploads == [(DM, "", "notes.txt", b"the secret word is pincer-42\n")]


def test_killed_mid_turn_and_cut_off_every_message_is_answered_once(
        processes: Processes, slack_env: dict[str, str], slack: FakeSlack, scripted_llm: ScriptedLLM) -> None:
    start_channel(processes, slack, name="slack-1")
    slack.say(ALICE, "SLEEP 4\nslow one")
    wait_until(lambda: any("slow one" in json.dumps(r["messages"]) for r in scripted_llm.requests), timeout=60,
               what="the turn at the model")
    first = next(proc for name, proc, _ in processes.started if name == "slack-1")
    processes.stop(first, sig=signal.SIGKILL)
    start_channel(processes, slack, name="slack-2")
    answer(slack, DM, "slept 4s", timeout=120)
    slack.cut(3)  # the network goes: connections dropped, new ones refused for a while
    during = [slack.say(ALICE, f"during {n}") for n in range(3)]  # Slack holds them until a connection is back
    slack.fail("chat.postMessage", status=429, error="ratelimited", retry_after=1)
    for n in range(3):
        answer(slack, DM, f"echo: during {n}", timeout=120)
    slack.disconnect()  # Slack's refresh: a new connection, nothing lost across it
    slack.say(ALICE, "after the refresh")
    answer(slack, DM, "echo: after the refresh", timeout=60)
    texts = [p.text for p in slack.in_channel(DM)]
    for text in ("slept 4s", "echo: during 0", "echo: during 1", "echo: during 2", "echo: after the refresh"):
        assert sum(text in t for t in texts) == 1, (text, texts)
    assert sum("slow one" in json.dumps(r["messages"][-1]) for r in scripted_llm.requests) == 1
    assert len(during) == 3 and slack.connections_opened >= 3

    def counted() -> list[dict[str, Any]] | None:
        rows = channel_rows(processes)
        return rows if rows and rows[0]["in"] >= 4 and rows[0]["state"] == "connected" else None

    rows = wait_until(counted, timeout=30, what="the channel connected, its messages counted")
    assert rows[0]["channel"] == "slack" and rows[0]["bot"] == "pincer"
    with gateway_client(slack_env) as client:
        assert 'pincer_channel_connected{channel="slack"} 1.0' in client.get("/metrics").text


def test_a_silent_network_past_stall_s_is_reported_then_a_fresh_connection_answers_each_once(
        processes: Processes, slack_env: dict[str, str], slack: FakeSlack) -> None:
    relay = NetCut(slack.port).start()  # the socket's road: it can go silent, as a cut network does
    try:
        slack.socket_port, slack.redeliver_s = relay.port, 8  # Slack retries an envelope three times
        processes.env = {**processes.env, "PINCER_CHANNELS__SLACK__STALL_S": "8"}  # past the SDK's 5 s pings
        start_channel(processes, slack)
        slack.say(ALICE, "before")
        answer(slack, DM, "echo: before")
        opened = slack.connections_opened

        assert channel_state(processes) == "connected"
        relay.cut(18)  # nothing closes: the connection only goes quiet (the SDK would wait 20 s to notice)
        wait_until(lambda: channel_state(processes) != "connected", timeout=8 + 6,
                   what="the silence reported within stall_s")
        with gateway_client(processes.env) as client:
            ready, metrics = client.get("/readyz"), client.get("/metrics").text
        assert ready.status_code == 503 and "the slack channel is" in ready.text, ready.text
        assert 'pincer_channel_connected{channel="slack"} 0.0' in metrics
        for n in range(4):
            slack.say(ALICE, f"during {n}")
        for n in range(4):
            answer(slack, DM, f"echo: during {n}", timeout=18 + 60)
        wait_until(lambda: channel_state(processes) == "connected", timeout=30, what="connected again")
        assert slack.connections_opened > opened  # the kit's own fresh connection
        texts = [p.text for p in slack.in_channel(DM) if p.text.startswith("echo: during")]
        # Each once and in the order said: the fresh connection reads the DM back before it takes Slack's
        # retries (which come on Slack's own schedule, in any order), and those are repeats by then.
        assert texts == [f"echo: during {n}" for n in range(4)], texts
        assert any(method == "conversations.history" for method, _ in slack.calls)
    finally:
        relay.stop()


def test_a_redis_restart_leaves_events_with_slack_and_loses_none(
        processes: Processes, pincer_env: dict[str, str], ws: Path, slack: FakeSlack, tmp_path: Path) -> None:
    server = EmbeddedRedis(tmp_path / "own-redis")
    url = server.start()
    try:
        processes.env = {**pincer_env, "PINCER_REDIS_URL": url, "PINCER_WORKSPACE": str(ws),
                         "PINCER_REDIS__CLAIM_IDLE_S": "1", "PINCER_REDIS__REAP_INTERVAL_S": "0.3",
                         **slack_settings(slack)}
        start_stack(processes, hands=1)
        start_channel(processes, slack)
        slack.say(ALICE, "before")
        answer(slack, DM, "echo: before")
        server.stop()
        for n in range(3):
            slack.say(ALICE, f"during {n}")
        wait_until(lambda: "left with the platform" in processes.logs(), timeout=30,
                   what="an event not acknowledged while Redis is away")
        assert slack.unacked() >= 1
        server.start()
        for n in range(3):
            answer(slack, DM, f"echo: during {n}", timeout=120)
        texts = [p.text for p in slack.in_channel(DM)]
        assert all(sum(f"echo: during {n}" in t for t in texts) == 1 for n in range(3)), texts
    finally:
        processes.stop_all()
        server.stop()


def test_events_api_over_http_checks_signatures_and_answers_a_retry_once(
        processes: Processes, slack_env: dict[str, str], slack: FakeSlack, ws: Path) -> None:
    port = free_port()
    url, secret = f"http://127.0.0.1:{port}/slack/events", "signing-secret-for-tests"
    processes.env = {**slack_env, "PINCER_CHANNELS__SLACK__EVENTS_URL": url,
                     "PINCER_CHANNELS__SLACK__EVENTS_LISTEN": f"127.0.0.1:{port}",
                     "PINCER_CHANNELS__SLACK__SIGNING_SECRET": secret, "PINCER_CHANNELS__SLACK__APP_TOKEN": ""}
    processes.start("channel", "slack", name="slack-http")
    challenge = json.dumps({"type": "url_verification", "challenge": "abc123", "token": "legacy"}).encode()

    def handshake() -> httpx.Response | None:
        with contextlib.suppress(httpx.HTTPError):
            return httpx.post(url, content=challenge, headers={"Content-Type": "application/json",
                                                                **slack.signed(challenge, secret)}, timeout=5)
        return None

    shook = wait_until(handshake, timeout=60, what="the events endpoint answering Slack's handshake")
    assert shook.status_code == 200 and shook.json() == {"challenge": "abc123"}
    assert slack.connections_opened == 0  # no Socket Mode beside the Events API
    for headers in ({}, slack.signed(challenge, "a-wrong-secret"),
                    slack.signed(challenge, secret, timestamp=str(int(time.time()) - 600))):  # forged, or replayed
        refused = httpx.post(url, content=challenge, headers={"Content-Type": "application/json", **headers}, timeout=5)
        assert refused.status_code == 401, refused.text
    slack.push_to(url, secret)
    slack.fail("chat.postMessage", status=500, error="internal_error")
    slack.say(ALICE, "by the events api")
    answer(slack, DM, "echo: by the events api")
    slack.say(ALICE, 'CALL exec {"command": "echo approved > out.txt; cat out.txt"}')
    ask = answer(slack, DM, "Allow exec?")
    slack.press(ALICE, ask, ask.buttons[0]["value"])  # interactivity: a form with a payload, signed the same way
    assert "approved" in answer(slack, DM, "RESULT exec").text and (alices(ws) / "out.txt").exists()
    first = slack.pushes[0][0]
    envelope = slack.sent_envelope(first)
    assert envelope is not None
    body = json.dumps(envelope["payload"]).encode()
    again = httpx.post(url, content=body, timeout=5, headers={"Content-Type": "application/json",
                                                              "X-Slack-Retry-Num": "1", **slack.signed(body, secret)})
    assert again.status_code == 200  # a retry of an event already taken: acknowledged, not answered again
    assert sum("by the events api" in p.text for p in slack.in_channel(DM)) == 1
    assert all(status == 200 for _, _, status in slack.pushes)
