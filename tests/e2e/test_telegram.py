"""The Telegram channel end to end: a real `pincer channel telegram` process (python-telegram-bot inside),
real Brain and Hands processes, litellm against the scripted model, and a local Bot API server that
speaks Telegram's documented HTTP shape (tests/fake_telegram.py)."""

from __future__ import annotations

import contextlib
import json
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest

from bus.redis_server import EmbeddedRedis, free_port
from bus.streams import Bus
from tests.conftest import Processes, gateway_client, identity_tree, wait_until
from tests.e2e.conftest import channel_rows, channel_state, start_stack
from tests.fake_telegram import TOKEN, FakeTelegram, Sent
from tests.scripted_llm import ScriptedLLM

pytestmark = pytest.mark.e2e

ALICE, BOB, STRANGER = 111, 222, 999


def alices(ws: Path) -> Path:
    """Alice's own workspace: her turns see only it."""
    return identity_tree(ws, f"telegram:{ALICE}")


@pytest.fixture
def channel_env(processes: Processes, pincer_env: dict[str, str], ws: Path,
                telegram: FakeTelegram) -> dict[str, str]:
    """Brain, Hands (exec asks a person) and a Gateway; the channel's settings, the token from ${TG_TOKEN}."""
    (ws / "notes.txt").write_text("the secret word is pincer-42\n")
    mine = alices(ws)
    mine.mkdir(parents=True, exist_ok=True)
    (mine / "notes.txt").write_text("the secret word is pincer-42\n")
    processes.env = {**pincer_env, "PINCER_WORKSPACE": str(ws), "PINCER_HANDS__EXEC__MODE": "ask",
                     "PINCER_HANDS__SANDBOX__ALLOW_DEGRADED": "true",
                     "TG_TOKEN": TOKEN,
                     "PINCER_CHANNELS__TELEGRAM__ENABLED": "true",
                     "PINCER_CHANNELS__TELEGRAM__BOT_TOKEN": "${TG_TOKEN}",
                     "PINCER_CHANNELS__TELEGRAM__API_URL": telegram.api_url,
                     "PINCER_CHANNELS__TELEGRAM__ALLOW_FROM": f'["{ALICE}", "@bob_b"]',
                     "PINCER_CHANNELS__TELEGRAM__POLL_TIMEOUT_S": "1",
                     "PINCER_CHANNELS__TELEGRAM__POLL_GRACE_S": "2",
                     "PINCER_CHANNELS__TELEGRAM__EDIT_INTERVAL_S": "0.2"}
    start_stack(processes, hands=1)
    return processes.env


def start_channel(processes: Processes, telegram: FakeTelegram, name: str = "telegram") -> None:
    polls = len(telegram.calls_of("getUpdates"))
    processes.start("channel", "telegram", name=name)
    wait_until(lambda: len(telegram.calls_of("getUpdates")) > polls, timeout=60, what="the channel polling")


def answer(telegram: FakeTelegram, chat: int, contains: str, *also: str, timeout: float = 60) -> Sent:
    """The bot's message in ``chat`` that shows ``contains`` and each of ``also`` (streamed edits included),
    once it does: a test reading more of it than it waited for would race the reply's last edit."""
    texts = (contains, *also)
    return wait_until(lambda: next((s for s in telegram.to(chat) if all(t in s.text for t in texts)), None),
                      timeout=timeout, what=f"a message to {chat} with {texts!r}")


def test_a_plain_turn_and_a_tool_turn_stream_into_one_message_each(
        processes: Processes, channel_env: dict[str, str], telegram: FakeTelegram) -> None:
    start_channel(processes, telegram)
    telegram.say(ALICE, "hello <b>there</b> & [a link](http://evil.example)")
    shown = answer(telegram, ALICE, "echo: hello", "evil.example)")
    assert shown.text == "echo: hello <b>there</b> & a link (http://evil.example)"  # the model's markup is text
    assert "<b>there" not in shown.markup and "href" not in shown.markup
    telegram.say(ALICE, 'CALL read_file {"path": "notes.txt"}')
    tool = answer(telegram, ALICE, "RESULT read_file", "pincer-42")
    assert "⚙ read_file" in tool.text and "✓" in tool.text
    assert len(telegram.to(ALICE)) == 2  # one message per turn: the answer edited in, never a second one
    assert telegram.calls_of("sendChatAction")  # typing while the agent worked


def test_each_chat_user_has_notes_and_conversations_of_their_own(
        processes: Processes, channel_env: dict[str, str], telegram: FakeTelegram) -> None:
    """The channel door sets the sender: Alice's note and words are hers; Bob finds none of them."""
    start_channel(processes, telegram)
    telegram.say(ALICE, 'CALL memory_write {"key": "gift", "content": "a kite for Sam"}')
    answer(telegram, ALICE, "RESULT memory_write", '"scope": "own"')
    telegram.say(ALICE, "my bike lock code is 5521")
    answer(telegram, ALICE, "echo: my bike lock code")
    telegram.say(BOB, 'CALL memory_search {"query": "kite bike lock code"}', username="bob_b")
    bob = whole_result(telegram, BOB, "memory_search")
    assert "kite" not in bob.replace("kite bike lock code", "") and "5521" not in bob
    telegram.say(ALICE, 'CALL memory_search {"query": "kite bike lock code"}')
    alice = whole_result(telegram, ALICE, "memory_search")
    assert "a kite for Sam" in alice and "5521" in alice


def whole_result(telegram: FakeTelegram, chat: int, tool: str) -> str:
    """The result the bot quotes in ``chat``, once its streamed message shows all of it (not an edit before)."""
    def whole() -> str | None:
        for sent in telegram.to(chat):
            _, found, quoted = sent.text.partition(f"RESULT {tool}: ")
            if found:
                with contextlib.suppress(ValueError):
                    json.loads(quoted)
                    return quoted
        return None

    return wait_until(whole, timeout=60, what=f"the whole {tool} result in {chat}")


def test_a_stranger_gets_a_code_once_and_no_model_call_until_paired(
        processes: Processes, channel_env: dict[str, str], telegram: FakeTelegram,
        scripted_llm: ScriptedLLM) -> None:
    start_channel(processes, telegram)
    asked = len(scripted_llm.requests)
    telegram.say(STRANGER, "let me in")
    told = answer(telegram, STRANGER, "I don't know you yet")
    code = told.text.split("code: ")[1].split()[0]
    first = telegram.say(STRANGER, "please?")
    wait_until(lambda: telegram.confirmed > first, timeout=30, what="the second message taken")
    telegram.say(ALICE, "a known person")  # handled after the stranger's, in order
    answer(telegram, ALICE, "echo: a known person")
    assert len(telegram.to(STRANGER)) == 1  # told once
    assert len(scripted_llm.requests) == asked + 1  # only Alice's turn reached the model
    refused = processes.run("channels", "pair", "NOTACODE")
    assert refused.returncode == 1 and "no pending pairing code" in refused.stderr
    paired = processes.run("channels", "pair", code.lower())
    assert paired.returncode == 0 and f"as telegram:{STRANGER}" in paired.stdout, paired.stderr
    assert processes.run("channels", "pair", code).returncode == 1  # a code is spent once
    telegram.say(STRANGER, "thanks")
    answer(telegram, STRANGER, "echo: thanks")


def test_an_approval_is_answered_by_its_own_person_only(
        processes: Processes, channel_env: dict[str, str], telegram: FakeTelegram, ws: Path) -> None:
    start_channel(processes, telegram)
    telegram.say(ALICE, 'CALL exec {"command": "echo approved > out.txt; cat out.txt"}')
    ask = answer(telegram, ALICE, "Allow exec?")
    labels = [button["text"] for row in ask.buttons for button in row]
    assert labels == ["Allow once", "Always", "Deny"]
    once = ask.buttons[0][0]["callback_data"]
    telegram.press(BOB, ask, once, username="bob_b")  # Bob is allowed to talk, but this is Alice's turn
    wait_until(lambda: telegram.answers, timeout=30, what="Bob's press answered")
    assert "not yours" in telegram.answers[0]["text"] and not (alices(ws) / "out.txt").exists()
    telegram.press(STRANGER, ask, once)
    wait_until(lambda: len(telegram.answers) == 2, timeout=30, what="the stranger's press answered")
    assert "not yours" in telegram.answers[1]["text"]
    telegram.press(ALICE, ask, once)
    done = answer(telegram, ALICE, "RESULT exec")
    assert "approved" in done.text and (alices(ws) / "out.txt").read_text() == "approved\n"
    wait_until(lambda: len(telegram.answers) == 3 and ask.text.startswith("Allowed once."), timeout=30,
               what="the press answered and the question edited")  # both run beside the turn, in no order
    assert telegram.answers[2]["text"] == "Allowed once." and not ask.buttons  # the question shows its answer


def test_ask_user_is_answered_by_a_button_and_the_next_message_of_its_own_person_only(
        processes: Processes, channel_env: dict[str, str], telegram: FakeTelegram,
        scripted_llm: ScriptedLLM) -> None:
    """Pressed by its own person only; the written answer taken by a channel started after the one that asked
    was killed -9 (the question waits in Redis, not in the channel), and the turn's answer shown once."""
    start_channel(processes, telegram, name="telegram-1")
    telegram.say(ALICE, 'CALL ask_user {"questions": [{"text": "Which colour?", "choices": ["red", "blue"]}, '
                        '{"text": "Why that one?"}]}')
    ask = answer(telegram, ALICE, "❓ Which colour?")  # its own message (the tool's line quotes it too)
    assert [button["text"] for row in ask.buttons for button in row] == ["red", "blue"]
    blue = ask.buttons[0][1]["callback_data"]
    assert len(blue.encode()) <= 64 and blue.startswith("q:") and blue.endswith(":0:1")  # Telegram's limit
    written = answer(telegram, ALICE, "❓ Why that one?")
    assert "next message" in written.text and not written.buttons
    telegram.press(BOB, ask, blue, username="bob_b")  # Bob may talk to the bot, but this is Alice's turn
    wait_until(lambda: telegram.answers, timeout=30, what="Bob's press answered")
    assert "not yours" in telegram.answers[0]["text"]
    telegram.press(STRANGER, ask, blue)
    wait_until(lambda: len(telegram.answers) == 2, timeout=30, what="the stranger's press answered")
    assert "not yours" in telegram.answers[1]["text"]
    telegram.say(BOB, "it is calm, says Bob")  # his own chat: a turn of his, no answer to Alice's question
    answer(telegram, BOB, "echo: it is calm, says Bob")
    telegram.press(ALICE, ask, blue)
    wait_until(lambda: len(telegram.answers) == 3 and "Answered: blue" in ask.text, timeout=30,
               what="Alice's press answered and the question edited")  # the answer first, then the edit
    assert telegram.answers[2]["text"] == "Answered: blue"
    assert ask.text.startswith("❓ Which colour?") and "Answered: blue" in ask.text and not ask.buttons
    assert not [b for b in scripted_llm.requests if any(m.get("role") == "tool" for m in b["messages"])]
    first = next(proc for name, proc, _ in processes.started if name == "telegram-1")
    processes.stop(first, sig=signal.SIGKILL)
    start_channel(processes, telegram, name="telegram-2")
    telegram.say(ALICE, "it is calm")
    answer(telegram, ALICE, "Noted")
    answer(telegram, ALICE, "RESULT ask_user", "blue", "it is calm", timeout=120)
    assert sum("RESULT ask_user" in s.text for s in telegram.to(ALICE)) == 1
    results = [m["content"] for b in scripted_llm.requests for m in b["messages"] if m.get("role") == "tool"]
    assert [json.loads(r) for r in results] == [{"answers": ["blue", "it is calm"], "by": f"telegram:{ALICE}"}]


def test_in_a_group_only_a_mention_or_a_reply_is_answered(
        processes: Processes, channel_env: dict[str, str], telegram: FakeTelegram) -> None:
    start_channel(processes, telegram)
    group = -5001
    quiet = telegram.say(ALICE, "talking among ourselves", chat=group, group=True)
    wait_until(lambda: telegram.confirmed > quiet, timeout=30, what="the group message taken")
    telegram.say(ALICE, "@pincer_test_bot what now", chat=group, group=True)
    answer(telegram, group, "echo: what now")
    assert not any("ourselves" in s.text for s in telegram.to(group))
    telegram.say(BOB, "and me?", chat=group, group=True, username="bob_b", reply_to_bot=1)
    answer(telegram, group, "echo: and me?")


def test_files_land_in_the_workspace_and_go_back_out(
        processes: Processes, channel_env: dict[str, str], telegram: FakeTelegram, ws: Path) -> None:
    start_channel(processes, telegram)
    telegram.say(ALICE, 'CALL read_file {"path": "inbox/telegram/data.txt"}',
                 document=("../../data.txt", b"hello from a file"))
    answer(telegram, ALICE, "RESULT read_file", "hello from a file")
    assert (alices(ws) / "inbox" / "telegram" / "data.txt").read_bytes() == b"hello from a file"
    telegram.say(ALICE, "here you are\n[attach: notes.txt]\n[attach: ../../etc/passwd]")
    wait_until(lambda: any(s.document for s in telegram.to(ALICE)), timeout=60, what="the file sent back")
    document = next(s.document for s in telegram.to(ALICE) if s.document)
    assert document == ("notes.txt", b"the secret word is pincer-42\n")
    answer(telegram, ALICE, "could not send ../../etc/passwd: '../../etc/passwd' is outside the workspace")
    assert not any("[attach:" in s.text for s in telegram.to(ALICE))


def test_an_outage_a_flood_limit_and_a_hung_poll_are_waited_out(
        processes: Processes, channel_env: dict[str, str], telegram: FakeTelegram) -> None:
    start_channel(processes, telegram)
    telegram.fail("getUpdates", 502, times=3)
    telegram.fail("sendMessage", 429, times=1, retry_after=1)
    telegram.say(ALICE, "through the storm")
    answer(telegram, ALICE, "echo: through the storm")
    polls = len(telegram.calls_of("getUpdates"))
    telegram.hang(4)  # polls in the next 4 s never answer: the channel must notice and reconnect
    for n in range(3):  # said while the poll hangs
        telegram.say(ALICE, f"during {n}")
    wait_until(lambda: len(telegram.calls_of("getUpdates")) > polls + 1, timeout=60, what="polling again")
    telegram.say(ALICE, "after the hang")
    answer(telegram, ALICE, "echo: after the hang", timeout=90)
    for n in range(3):  # a reply's last edit waits out edit_interval_s, so a later turn's may show first
        answer(telegram, ALICE, f"echo: during {n}", timeout=30)
    texts = [s.text for s in telegram.to(ALICE) if s.text.startswith("echo: during")]
    assert texts == [f"echo: during {n}" for n in range(3)], texts  # each once, in the order said
    assert sum("through the storm" in s.text for s in telegram.to(ALICE)) == 1
    def counted() -> list[dict[str, Any]] | None:  # as the next heartbeat reports it
        rows = channel_rows(processes)
        return rows if rows and rows[0]["in"] >= 5 else None

    rows = wait_until(counted, timeout=30, what="every message counted")
    assert rows[0]["channel"] == "telegram" and rows[0]["errors"] >= 3 and rows[0]["state"] == "connected"
    assert rows[0]["enabled"] is True
    pool = json.loads(processes.run("status", "--json").stdout)
    assert [c["state"] for c in pool["channels"]] == ["connected"]
    with gateway_client(channel_env) as client:
        metrics = client.get("/metrics").text
        assert 'pincer_channel_connected{channel="telegram"} 1.0' in metrics
        assert 'pincer_channel_errors_total{channel="telegram"}' in metrics
        assert client.get("/readyz").json()["status"] == "ready"


def test_killed_mid_turn_the_answer_comes_once_and_the_turn_runs_once(
        processes: Processes, channel_env: dict[str, str], telegram: FakeTelegram, bus: Bus,
        scripted_llm: ScriptedLLM) -> None:
    start_channel(processes, telegram, name="telegram-1")
    telegram.say(ALICE, "SLEEP 4\nslow one")
    wait_until(lambda: telegram.calls_of("sendChatAction"), timeout=60, what="the turn under way")
    first = next(proc for name, proc, _ in processes.started if name == "telegram-1")
    processes.stop(first, sig=signal.SIGKILL)
    start_channel(processes, telegram, name="telegram-2")
    answer(telegram, ALICE, "slept 4s", timeout=120)
    assert sum("slept 4s" in s.text for s in telegram.to(ALICE)) == 1
    assert sum("slow one" in json.dumps(r["messages"][-1]) for r in scripted_llm.requests) == 1


def test_two_replicas_poll_one_at_a_time_and_answer_each_message_once(
        processes: Processes, channel_env: dict[str, str], telegram: FakeTelegram) -> None:
    start_channel(processes, telegram, name="telegram-a")
    processes.start("channel", "telegram", name="telegram-b")
    for n in range(6):
        telegram.say(ALICE, f"message {n}")
    for n in range(6):
        answer(telegram, ALICE, f"echo: message {n}")
    assert all(sum(f"message {n}" in s.text for s in telegram.to(ALICE)) == 1 for n in range(6))
    assert telegram.most_polls_at_once == 1  # never two pollers: no 409 from Telegram


def test_a_redis_restart_loses_no_update_and_answers_each_once(
        processes: Processes, pincer_env: dict[str, str], ws: Path, telegram: FakeTelegram, tmp_path: Path,
        scripted_llm: ScriptedLLM) -> None:
    server = EmbeddedRedis(tmp_path / "own-redis")
    url = server.start()
    try:
        processes.env = {**pincer_env, "PINCER_REDIS_URL": url, "PINCER_WORKSPACE": str(ws),
                         "PINCER_REDIS__CLAIM_IDLE_S": "1", "PINCER_REDIS__REAP_INTERVAL_S": "0.3",
                         "PINCER_CHANNELS__TELEGRAM__BOT_TOKEN": TOKEN,
                         "PINCER_CHANNELS__TELEGRAM__API_URL": telegram.api_url,
                         "PINCER_CHANNELS__TELEGRAM__ALLOW_FROM": f'["{ALICE}"]',
                         "PINCER_CHANNELS__TELEGRAM__POLL_TIMEOUT_S": "1",
                         "PINCER_CHANNELS__TELEGRAM__POLL_GRACE_S": "2",
                         "PINCER_CHANNELS__TELEGRAM__EDIT_INTERVAL_S": "0.2"}
        start_stack(processes, hands=1)
        start_channel(processes, telegram)
        telegram.say(ALICE, "before")
        answer(telegram, ALICE, "echo: before")
        telegram.say(ALICE, "SLEEP 3\nmid-turn")  # at the model when Redis stops
        wait_until(lambda: any("mid-turn" in json.dumps(r["messages"]) for r in scripted_llm.requests), timeout=60,
                   what="the turn at the model")
        server.stop()  # SIGTERM: Redis writes its append-only file and exits
        during = [telegram.say(ALICE, f"during {n}") for n in range(3)]  # left with Telegram, unconfirmed
        wait_until(lambda: "telegram poll: Redis away" in processes.logs(), timeout=30,
                   what="the poller waiting for Redis (it takes nothing it cannot store)")
        assert telegram.confirmed <= during[0]
        server.start()  # same port, password and data
        for text in ("slept 3s", "echo: during 0", "echo: during 1", "echo: during 2"):
            answer(telegram, ALICE, text, timeout=120)
        for text in ("echo: before", "slept 3s", "echo: during 0", "echo: during 1", "echo: during 2"):
            assert sum(text in s.text for s in telegram.to(ALICE)) == 1, (text, [s.text for s in telegram.to(ALICE)])
    finally:
        processes.stop_all()
        server.stop()


def test_stop_cancels_the_running_turn_and_new_starts_a_fresh_session(
        processes: Processes, channel_env: dict[str, str], telegram: FakeTelegram,
        scripted_llm: ScriptedLLM) -> None:
    start_channel(processes, telegram)
    telegram.say(ALICE, "remember: the word is kiwi")
    answer(telegram, ALICE, "echo: remember")
    telegram.say(ALICE, "SLEEP 30\nslow")
    wait_until(lambda: any("slow" in json.dumps(r["messages"][-1]) for r in scripted_llm.requests), timeout=60,
               what="the slow turn at the model")
    telegram.say(ALICE, "/stop")
    answer(telegram, ALICE, "Stopping.")
    stopped = answer(telegram, ALICE, "⚠", timeout=60)  # the slow turn's message ends with why
    assert "cancel" in stopped.text.lower()
    telegram.say(ALICE, "/new")
    answer(telegram, ALICE, "Started a fresh conversation.")
    telegram.say(ALICE, "what was the word?")
    answer(telegram, ALICE, "echo: what was the word?")
    fresh = scripted_llm.requests[-1]["messages"]
    assert not any("kiwi" in json.dumps(m) for m in fresh)  # the new session has no memory of the old one


def test_a_photo_is_saved_and_a_file_over_the_cap_is_refused_by_name(
        processes: Processes, channel_env: dict[str, str], telegram: FakeTelegram, ws: Path) -> None:
    processes.env = {**channel_env, "PINCER_CHANNELS__TELEGRAM__MAX_FILE_BYTES": "2048"}
    start_channel(processes, telegram)
    telegram.say(ALICE, "a picture", photo=b"\xff\xd8\xff" + b"p" * 100)
    answer(telegram, ALICE, "saved in the workspace at inbox/telegram/photo-", "103 bytes")
    telegram.say(ALICE, "a big one", document=("big.bin", b"x" * 4096))
    answer(telegram, ALICE, "big.bin, but it was not saved", "over the 2048")
    assert not (alices(ws) / "inbox" / "telegram" / "big.bin").exists()


def test_webhook_mode_checks_the_secret_and_answers_a_redelivered_update_once(
        processes: Processes, channel_env: dict[str, str], telegram: FakeTelegram) -> None:
    port = free_port()
    hook = f"http://127.0.0.1:{port}/telegram-hook"
    processes.env = {**channel_env, "PINCER_CHANNELS__TELEGRAM__WEBHOOK_URL": hook,
                     "PINCER_CHANNELS__TELEGRAM__WEBHOOK_LISTEN": f"127.0.0.1:{port}"}
    processes.start("channel", "telegram", name="telegram-hook")
    wait_until(lambda: telegram.webhook is not None, timeout=60, what="the webhook set")
    assert telegram.webhook is not None and telegram.webhook[0] == hook and len(telegram.webhook[1]) >= 32
    telegram.push_twice = True  # Telegram may deliver an update again: it is answered once
    telegram.say(ALICE, "by webhook")
    answer(telegram, ALICE, "echo: by webhook")
    telegram.say(ALICE, "and again")
    answer(telegram, ALICE, "echo: and again")
    assert sum("by webhook" in s.text for s in telegram.to(ALICE)) == 1
    update = {"update_id": 1, "message": {"message_id": 1, "date": 0, "chat": {"id": ALICE, "type": "private"},
                                          "from": {"id": ALICE, "is_bot": False, "first_name": "M"}, "text": "forged"}}
    for headers in ({}, {"X-Telegram-Bot-Api-Secret-Token": "guess"}):
        forged = httpx.post(hook, json=update, headers=headers, timeout=10)
        assert forged.status_code == 401, forged.text
    garbage = httpx.post(hook, content=b"{not json", timeout=10,
                         headers={"X-Telegram-Bot-Api-Secret-Token": telegram.webhook[1]})
    assert garbage.status_code == 400
    assert not telegram.calls_of("getUpdates")  # no polling beside a webhook (Telegram would answer 409)
    rows = wait_until(lambda: (r := channel_rows(processes)) and
                      r[0]["state"] == "connected" and r, timeout=60, what="the webhook channel connected")
    assert rows[0]["in"] >= 2


def test_a_poller_that_makes_no_progress_is_reported_stalled_and_recovers(
        processes: Processes, channel_env: dict[str, str], telegram: FakeTelegram) -> None:
    processes.env = {**channel_env, "PINCER_CHANNELS__TELEGRAM__STALL_S": "5"}
    start_channel(processes, telegram)
    telegram.hang(3600)  # every poll hangs from now on: the process is alive, the channel is not

    wait_until(lambda: channel_state(processes) == "stalled", timeout=90, what="the channel reported stalled")
    with gateway_client(processes.env) as client:
        ready = client.get("/readyz")
        assert ready.status_code == 503 and "the telegram channel is stalled" in ready.json()["problems"]
        assert 'pincer_channel_connected{channel="telegram"} 0.0' in client.get("/metrics").text
    hung = len(telegram.calls_of("getUpdates"))  # each hung poll is abandoned and tried afresh, not waited on
    wait_until(lambda: len(telegram.calls_of("getUpdates")) > hung, timeout=30, what="a fresh poll after a hung one")
    telegram.hang_until = 0.0
    telegram.say(ALICE, "back?")
    answer(telegram, ALICE, "echo: back?", timeout=90)
    wait_until(lambda: channel_state(processes) == "connected", timeout=60, what="connected again")
