"""The Discord channel end to end: a real `pincer channel discord` process (discord.py's gateway client and
REST client inside), real Brain and Hands processes, litellm against the scripted model, and a local
server speaking Discord's REST API and gateway protocol (tests/fake_discord.py)."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Processes, gateway_client, identity_tree, wait_until
from tests.e2e.conftest import channel_rows, channel_state, start_stack
from tests.fake_discord import GENERAL, THREAD, TOKEN, FakeDiscord, Sent
from tests.scripted_llm import ScriptedLLM

pytestmark = pytest.mark.e2e

ALICE, BOB, STRANGER = "2000000000000000001", "2000000000000000002", "2000000000000000999"


def alices(ws: Path) -> Path:
    """Alice's own workspace: her turns see only it."""
    return identity_tree(ws, f"discord:{ALICE}")


@pytest.fixture
def discord() -> Iterator[FakeDiscord]:
    fake = FakeDiscord().start()
    yield fake
    fake.stop()


@pytest.fixture
def discord_env(processes: Processes, pincer_env: dict[str, str], ws: Path, discord: FakeDiscord) -> dict[str, str]:
    (ws / "notes.txt").write_text("the secret word is pincer-42\n")
    mine = alices(ws)
    mine.mkdir(parents=True, exist_ok=True)
    (mine / "notes.txt").write_text("the secret word is pincer-42\n")
    processes.env = {**pincer_env, "PINCER_WORKSPACE": str(ws), "PINCER_HANDS__EXEC__MODE": "ask",
                     "PINCER_HANDS__EXEC__APPROVAL_TIMEOUT_S": "120",  # a question may outlive an outage
                     "PINCER_HANDS__SANDBOX__ALLOW_DEGRADED": "true",
                     "PINCER_REDIS__CLAIM_IDLE_S": "2", "PINCER_REDIS__REAP_INTERVAL_S": "0.5",
                     "DISCORD_TOKEN": TOKEN,
                     "PINCER_CHANNELS__DISCORD__ENABLED": "true",
                     "PINCER_CHANNELS__DISCORD__BOT_TOKEN": "${DISCORD_TOKEN}",
                     "PINCER_CHANNELS__DISCORD__API_URL": discord.api_url,
                     "PINCER_CHANNELS__DISCORD__FILE_HOSTS": '["127.0.0.1"]',
                     "PINCER_CHANNELS__DISCORD__ALLOW_FROM": f'["{ALICE}", "{BOB}"]',
                     "PINCER_CHANNELS__DISCORD__EDIT_INTERVAL_S": "0.2",
                     "PINCER_CHANNELS__DISCORD__STALL_S": "20"}
    start_stack(processes, hands=1)
    return processes.env


def start_channel(processes: Processes, discord: FakeDiscord, name: str = "discord") -> None:
    identified = discord.identifies
    processes.start("channel", "discord", name=name)
    wait_until(lambda: discord.identifies > identified and processes.logs().count("discord: connected") >
               identified, timeout=60, what="the channel on the gateway")


def answer(discord: FakeDiscord, channel: str, contains: str, *also: str, timeout: float = 60) -> Sent:
    """The bot's message in ``channel`` that shows ``contains`` and each of ``also`` (edits included), once it
    does: a test reading more of it than it waited for would race the reply's last edit."""
    texts = (contains, *also)
    return wait_until(lambda: next((s for s in discord.in_channel(channel) if all(t in s.content for t in texts)),
                                   None), timeout=timeout, what=f"a message in {channel} with {texts!r}")


def test_a_plain_turn_and_a_tool_turn_stream_into_one_message_each(
        processes: Processes, discord_env: dict[str, str], discord: FakeDiscord) -> None:
    start_channel(processes, discord)
    dm = discord.dm(ALICE)
    discord.say(ALICE, "hello @everyone [x](https://evil.test)")
    shown = answer(discord, dm, "echo: hello", "evil.test)")
    assert "@everyone" not in shown.content and "x (https://evil.test)" in shown.content  # no ping, no masked link
    discord.say(ALICE, 'CALL read_file {"path": "notes.txt"}')
    tool = answer(discord, dm, "RESULT read_file", "pincer-42")
    assert "⚙ read_file" in tool.content and tool.edits >= 1
    assert len(discord.in_channel(dm)) == 2


def test_a_stranger_gets_a_code_once_and_no_model_call_until_paired(
        processes: Processes, discord_env: dict[str, str], discord: FakeDiscord, scripted_llm: ScriptedLLM) -> None:
    start_channel(processes, discord)
    asked = len(scripted_llm.requests)
    discord.say(STRANGER, "let me in")
    told = answer(discord, discord.dm(STRANGER), "I don't know you yet")
    code = told.content.split("code: ")[1].split()[0]
    discord.say(STRANGER, "please?")
    discord.say(ALICE, "a known person")
    answer(discord, discord.dm(ALICE), "echo: a known person")
    assert len(discord.in_channel(discord.dm(STRANGER))) == 1 and len(scripted_llm.requests) == asked + 1
    paired = processes.run("channels", "pair", code, "--channel", "discord")
    assert paired.returncode == 0 and f"as discord:{STRANGER}" in paired.stdout, paired.stderr
    discord.say(STRANGER, "thanks")
    answer(discord, discord.dm(STRANGER), "echo: thanks")


def test_an_approval_is_pressed_by_its_own_person_only(
        processes: Processes, discord_env: dict[str, str], discord: FakeDiscord, ws: Path) -> None:
    start_channel(processes, discord)
    dm = discord.dm(ALICE)
    discord.say(ALICE, 'CALL exec {"command": "echo approved > out.txt; cat out.txt"}')
    ask = answer(discord, dm, "Allow exec?")
    assert [b["label"] for b in ask.buttons] == ["Allow once", "Always", "Deny"]
    once = ask.buttons[0]["custom_id"]
    discord.press(BOB, ask, once)
    wait_until(lambda: discord.followups, timeout=30, what="Bob's press answered to him alone")
    assert discord.followups[0]["flags"] == 64 and "not yours" in discord.followups[0]["content"]
    assert not (alices(ws) / "out.txt").exists()
    discord.press(ALICE, ask, once)
    done = answer(discord, dm, "RESULT exec")
    assert "approved" in done.content and (alices(ws) / "out.txt").read_text() == "approved\n"
    wait_until(lambda: len(discord.followups) == 2 and ask.content.startswith("Allowed once."), timeout=30,
               what="the press answered and the question edited")  # both run beside the turn, in no order
    assert discord.followups[1]["content"] == "Allowed once." and len(discord.callbacks) == 2 and not ask.buttons


def test_six_choices_fit_discords_rows_and_only_their_person_picks_one(
        processes: Processes, discord_env: dict[str, str], discord: FakeDiscord, scripted_llm: ScriptedLLM) -> None:
    start_channel(processes, discord)
    dm = discord.dm(ALICE)
    choices = ["one", "two", "three", "four", "five", "six"]
    discord.say(ALICE, "CALL ask_user " + json.dumps({"questions": [{"text": "How many?", "choices": choices}]}))
    ask = answer(discord, dm, "❓ How many?")
    assert [b["label"] for b in ask.buttons] == choices
    six = ask.buttons[5]["custom_id"]
    discord.press(BOB, ask, six)
    wait_until(lambda: discord.followups, timeout=30, what="Bob's press answered to him alone")
    assert "not yours" in discord.followups[0]["content"]
    discord.press(ALICE, ask, six)
    done = answer(discord, dm, "RESULT ask_user")
    wait_until(lambda: '"answers": ["six"]' in done.content.replace("\\", ""), timeout=30,
               what="the answer in the result")  # the result's last edit, not one before it
    results = [m["content"] for b in scripted_llm.requests for m in b["messages"] if m.get("role") == "tool"]
    assert [json.loads(r)["answers"] for r in results] == [["six"]]


def test_in_a_server_a_mention_is_needed_and_a_thread_is_its_own_session(
        processes: Processes, discord_env: dict[str, str], discord: FakeDiscord,
        scripted_llm: ScriptedLLM) -> None:
    start_channel(processes, discord)
    discord.say(ALICE, "talking among ourselves", channel=GENERAL)
    discord.say(ALICE, "remember kiwi", channel=GENERAL, mention=True)
    answer(discord, GENERAL, "echo: remember kiwi")
    discord.say(BOB, "quiet in the thread", channel=THREAD)
    discord.say(BOB, "in a thread now", channel=THREAD, mention=True)
    answer(discord, THREAD, "echo: in a thread now")
    assert not any("kiwi" in json.dumps(m) for m in scripted_llm.requests[-1]["messages"])
    discord.say(BOB, "and no mention needed", channel=THREAD)  # the bot was called into this thread
    answer(discord, THREAD, "echo: and no mention needed")
    said = [s.content for s in discord.in_channel(GENERAL) + discord.in_channel(THREAD)]
    assert not any("ourselves" in t or "quiet in the thread" in t for t in said)


def test_files_land_in_the_workspace_and_go_back_out(
        processes: Processes, discord_env: dict[str, str], discord: FakeDiscord, ws: Path) -> None:
    start_channel(processes, discord)
    dm = discord.dm(ALICE)
    discord.say(ALICE, 'CALL read_file {"path": "inbox/discord/data.txt"}',
                file=("../../data.txt", b"hello from a file"))
    answer(discord, dm, "RESULT read_file", "hello from a file")
    discord.say(ALICE, "here you are\n[attach: notes.txt]")
    sent = wait_until(lambda: next((s for s in discord.in_channel(dm) if s.files), None), timeout=60,
                      what="the file sent back")
    assert sent.files == [("notes.txt", b"the secret word is pincer-42\n")]


def test_killed_mid_turn_and_cut_off_every_message_is_answered_once(
        processes: Processes, discord_env: dict[str, str], discord: FakeDiscord, scripted_llm: ScriptedLLM) -> None:
    start_channel(processes, discord, name="discord-1")
    dm = discord.dm(ALICE)
    discord.say(ALICE, "before")
    answer(discord, dm, "echo: before")
    discord.say(ALICE, "SLEEP 4\nslow one")
    wait_until(lambda: any("slow one" in json.dumps(r["messages"]) for r in scripted_llm.requests), timeout=60,
               what="the turn at the model")
    first = next(proc for name, proc, _ in processes.started if name == "discord-1")
    processes.stop(first, sig=signal.SIGKILL)
    discord.say(ALICE, "while it was down")  # no session alive: only the channel's history has it
    start_channel(processes, discord, name="discord-2")
    answer(discord, dm, "slept 4s", timeout=120)
    answer(discord, dm, "echo: while it was down", timeout=60)  # caught up from the history
    resumes = discord.resumes
    discord.cut(2)  # the network goes: the connection dropped, new ones refused for a while
    for n in range(3):
        discord.say(ALICE, f"during {n}")
    for n in range(3):
        answer(discord, dm, f"echo: during {n}", timeout=120)
    discord.reconnect()  # Discord's RECONNECT: resumed, nothing lost across it
    discord.say(ALICE, "after the reconnect")
    answer(discord, dm, "echo: after the reconnect", timeout=60)
    texts = [s.content for s in discord.in_channel(dm)]
    for text in ("echo: before", "slept 4s", "echo: while it was down", "echo: during 0", "echo: during 1",
                 "echo: during 2", "echo: after the reconnect"):
        assert sum(text in t for t in texts) == 1, (text, texts)
    assert sum("slow one" in json.dumps(r["messages"][-1]) for r in scripted_llm.requests) == 1
    assert discord.resumes > resumes  # the library resumed its session rather than starting anew

    def counted() -> list[dict[str, Any]] | None:
        rows = channel_rows(processes)
        return rows if rows and rows[0]["state"] == "connected" and rows[0]["in"] >= 4 else None

    rows = wait_until(counted, timeout=30, what="the channel connected, its messages counted")
    assert rows[0]["channel"] == "discord" and rows[0]["bot"] == "pincer"


def test_an_outage_past_stall_s_is_reported_then_a_fresh_connection_answers_all_in_order(
        processes: Processes, discord_env: dict[str, str], discord: FakeDiscord, scripted_llm: ScriptedLLM,
        ws: Path) -> None:
    discord.heartbeat_ms = 1000  # something arrives every second while the gateway is there
    discord.resume_window_s = 10  # the outage outlasts the session: nothing is replayed to a new one
    processes.env = {**processes.env, "PINCER_CHANNELS__DISCORD__STALL_S": "6"}
    start_channel(processes, discord)
    dm = discord.dm(ALICE)
    discord.say(ALICE, "before")
    answer(discord, dm, "echo: before")
    discord.say(ALICE, 'CALL exec {"command": "echo approved > out.txt; cat out.txt"}')
    ask = answer(discord, dm, "Allow exec?")  # asked before the outage, decided after it
    identifies = discord.identifies

    assert channel_state(processes) == "connected"
    discord.cut(25)  # past stall_s, and past the library's own first retries: it would wait ~50 s more
    wait_until(lambda: channel_state(processes) != "connected", timeout=6 + 6,
               what="the outage reported within stall_s")
    with gateway_client(processes.env) as client:
        ready, metrics = client.get("/readyz"), client.get("/metrics").text
    assert ready.status_code == 503 and "the discord channel is" in ready.text, ready.text
    assert 'pincer_channel_connected{channel="discord"} 0.0' in metrics
    for n in range(4):
        discord.say(ALICE, f"during {n}")
    wait_until(lambda: channel_state(processes) == "connected", timeout=25 + 30,
               what="connected again, by the kit's own backoff")
    assert discord.identifies > identifies  # a new session: the old one is past its resume window
    discord.press(ALICE, ask, ask.buttons[0]["custom_id"])
    done = answer(discord, dm, "RESULT exec")
    assert "approved" in done.content and (alices(ws) / "out.txt").read_text() == "approved\n"
    for n in range(4):  # read back from the history: a new session is sent nothing it missed
        answer(discord, dm, f"echo: during {n}", timeout=30)
    assert sum("Allow exec?" in s.content or s.content.startswith("Allowed once.")
               for s in discord.in_channel(dm)) == 1  # the question asked once, and its message edited
    texts = [s.content for s in discord.in_channel(dm) if s.content.startswith("echo: during")]
    assert texts == [f"echo: during {n}" for n in range(4)], texts  # each once, in the order said


def test_a_name_that_spells_an_allowed_id_or_a_taken_handle_gets_a_code_not_a_turn(
        processes: Processes, discord_env: dict[str, str], discord: FakeDiscord, scripted_llm: ScriptedLLM) -> None:
    processes.env = {**processes.env, "PINCER_CHANNELS__DISCORD__ALLOW_FROM": f'["{ALICE}", "@carol"]'}
    start_channel(processes, discord)
    carol, mallory, eve = "2000000000000000101", "2000000000000000102", "2000000000000000103"
    asked = len(scripted_llm.requests)
    discord.say(mallory, "let me in", username=ALICE, display_name=ALICE)  # the allowed id's digits as names
    answer(discord, discord.dm(mallory), "I don't know you yet")
    discord.say(carol, "hi, carol here", username="carol")
    answer(discord, discord.dm(carol), "echo: hi, carol here")
    discord.say(carol, "renamed", username="carol.new", display_name="Carol")  # the id stays hers
    answer(discord, discord.dm(carol), "echo: renamed")
    discord.say(eve, "i am carol now", username="carol")  # the freed name taken by someone else
    answer(discord, discord.dm(eve), "I don't know you yet")
    assert len(scripted_llm.requests) == asked + 2  # no model call for either impostor
    assert not any("echo" in s.content for s in discord.in_channel(discord.dm(mallory)) +
                   discord.in_channel(discord.dm(eve)))
