"""The Matrix channel against a homeserver that limits the agent's account as Synapse does by default
(rc_message: 0.2 events a second, bursts of 10): an approval question is asked once and its choices all land,
each rate limit waited out as the homeserver says, however many the send meets."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Processes, wait_until
from tests.e2e.conftest import channel_state, start_stack
from tests.e2e.test_matrix import answer, direct_room, start_channel
from tests.matrix_server import Person, Synapse
from tests.netcut import NetCut

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def limited() -> Iterator[Synapse]:
    server = Synapse(default_message_limits=True).start()
    yield server
    server.close()


@pytest.fixture
def accounts(limited: Synapse) -> dict[str, Person]:
    admin, alice = limited.register(admin=True), limited.register()  # fresh accounts per test: one homeserver
    limited.unlimit(admin, alice.user_id)  # the person is not the account under test: only the agent's is limited
    return {"alice": alice, "bot": limited.register()}


def matrix_env(pincer_env: dict[str, str], ws: Path, homeserver: str, accounts: dict[str, Person]) -> dict[str, str]:
    bot = accounts["bot"]
    return {**pincer_env, "PINCER_WORKSPACE": str(ws), "PINCER_HANDS__EXEC__MODE": "ask",
            "PINCER_HANDS__SANDBOX__ALLOW_DEGRADED": "true", "MATRIX_TOKEN": bot.token,
            "PINCER_CHANNELS__MATRIX__ENABLED": "true",
            "PINCER_CHANNELS__MATRIX__HOMESERVER": homeserver,
            "PINCER_CHANNELS__MATRIX__USER_ID": bot.user_id,
            "PINCER_CHANNELS__MATRIX__ACCESS_TOKEN": "${MATRIX_TOKEN}",
            "PINCER_CHANNELS__MATRIX__ALLOW_FROM": json.dumps([accounts["alice"].user_id]),
            "PINCER_CHANNELS__MATRIX__POLL_TIMEOUT_S": "2",
            "PINCER_CHANNELS__MATRIX__EDIT_INTERVAL_S": "0.2"}


def test_an_approval_is_asked_once_through_rate_limits_and_decided_by_reaction(
        processes: Processes, pincer_env: dict[str, str], ws: Path, limited: Synapse,
        accounts: dict[str, Person]) -> None:
    alice, bot = accounts["alice"], accounts["bot"]
    processes.env = matrix_env(pincer_env, ws, limited.url, accounts)
    start_stack(processes, hands=1)
    start_channel(processes)
    room = direct_room(alice, bot)
    for n in range(6):  # answers that spend the agent's burst
        alice.say(room, f"hello {n}")
    for n in range(6):
        answer(alice, room, f"echo: hello {n}", timeout=120)
    alice.say(room, 'CALL exec {"command": "echo approved"}')
    ask = answer(alice, room, "Allow exec?", timeout=120)

    def reactions() -> list[dict[str, object]] | None:
        found = [m for m in alice.messages(room) if m["type"] == "m.reaction"
                 and m["content"]["m.relates_to"]["event_id"] == ask["event_id"]]
        return found if len(found) == 3 else None

    wait_until(reactions, timeout=180, what="the three choices as the bot's reactions")
    assert re.search(r"(ask|react|send|edit): Matrix send: M_LIMIT_EXCEEDED .*again in", processes.logs())  # met
    alice.react(room, ask["event_id"], "✅")
    done = answer(alice, room, "RESULT exec", timeout=180)
    assert "approved" in done["content"]["body"]
    questions = [t for t in alice.texts(room) if "Allow exec?" in t]
    assert len(questions) == 1, questions  # asked once, however often a step was limited
    assert len(reactions() or []) == 3  # and each choice added once




def test_a_silent_network_past_stall_s_is_reported_and_all_said_meanwhile_is_answered_once_in_order(
        processes: Processes, pincer_env: dict[str, str], ws: Path, limited: Synapse,
        accounts: dict[str, Person]) -> None:
    alice, bot = accounts["alice"], accounts["bot"]
    relay = NetCut(int(limited.url.rsplit(":", 1)[1])).start()  # the agent's road to the homeserver alone
    try:
        processes.env = {**matrix_env(pincer_env, ws, f"http://{relay.url_host}", accounts),
                         "PINCER_CHANNELS__MATRIX__STALL_S": "6", "PINCER_CHANNELS__MATRIX__POLL_GRACE_S": "2"}
        start_stack(processes, hands=1)
        start_channel(processes)
        room = direct_room(alice, bot)
        alice.say(room, "before")
        answer(alice, room, "echo: before")

        wait_until(lambda: channel_state(processes) == "connected", timeout=30, what="the channel connected")
        relay.cut(20)  # the homeserver stays up for people; the agent's syncs hang, new ones too
        wait_until(lambda: channel_state(processes) != "connected", timeout=6 + 6,
                   what="the silence reported within stall_s")
        for n in range(5):
            alice.say(room, f"during {n}")
        for n in range(5):
            answer(alice, room, f"echo: during {n}", timeout=20 + 120)
        texts = [t for t in alice.texts(room) if t.startswith("echo: during")]
        assert texts == [f"echo: during {n}" for n in range(5)], texts  # each once, in the order said
        assert "poll hung" in processes.logs()  # the hung sync was given up and made afresh
    finally:
        relay.stop()
