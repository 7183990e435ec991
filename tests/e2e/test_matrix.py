"""The Matrix channel end to end: a real `pincer channel matrix` process (matrix-nio inside), real Brain and
Hands processes, litellm against the scripted model, and a real homeserver (Synapse, tests/matrix_server.py)
with people acting through its client-server API."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from tests.conftest import Processes, identity_tree, wait_until
from tests.e2e.conftest import start_stack
from tests.matrix_server import EncryptedPerson, Person, Synapse
from tests.scripted_llm import ScriptedLLM

# A real homeserver restarts in some tests: on a loaded machine that alone can pass the default 120 s.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def synapse() -> Iterator[Synapse]:
    server = Synapse().start()
    yield server
    server.close()


@pytest.fixture
def people(synapse: Synapse) -> dict[str, Person]:
    people = {who: synapse.register() for who in ("alice", "bob", "stranger")}
    return {**people, "bot": synapse.register(f"pincer{people['alice'].user_id.split(':')[0][5:]}")}


@pytest.fixture
def matrix_env(processes: Processes, pincer_env: dict[str, str], ws: Path, synapse: Synapse,
               people: dict[str, Person]) -> dict[str, str]:
    (ws / "notes.txt").write_text("the secret word is pincer-42\n")
    bot = people["bot"]
    processes.env = {**pincer_env, "PINCER_WORKSPACE": str(ws), "PINCER_HANDS__EXEC__MODE": "ask",
                     "PINCER_HANDS__SANDBOX__ALLOW_DEGRADED": "true",
                     "PINCER_REDIS__CLAIM_IDLE_S": "2", "PINCER_REDIS__REAP_INTERVAL_S": "0.5",
                     "MATRIX_TOKEN": bot.token,
                     "PINCER_CHANNELS__MATRIX__ENABLED": "true",
                     "PINCER_CHANNELS__MATRIX__HOMESERVER": synapse.url,
                     "PINCER_CHANNELS__MATRIX__USER_ID": bot.user_id,
                     "PINCER_CHANNELS__MATRIX__ACCESS_TOKEN": "${MATRIX_TOKEN}",
                     "PINCER_CHANNELS__MATRIX__ALLOW_FROM": json.dumps([people["alice"].user_id,
                                                                         people["bob"].user_id]),
                     "PINCER_CHANNELS__MATRIX__POLL_TIMEOUT_S": "2",
                     # a poll counts as hung after 2 + 2 * 6 s: more than Synapse's own catch-up wait (10 s)
                     "PINCER_CHANNELS__MATRIX__POLL_GRACE_S": "6",
                     "PINCER_CHANNELS__MATRIX__EDIT_INTERVAL_S": "0.2"}
    start_stack(processes, hands=1)
    return processes.env


def start_channel(processes: Processes, name: str = "matrix") -> None:
    up = processes.logs().count("matrix channel up")
    processes.start("channel", "matrix", name=name)
    wait_until(lambda: processes.logs().count("matrix channel up") > up, timeout=60, what="the channel up")


def answer(person: Person, room: str, contains: str, *also: str, timeout: float = 60) -> dict[str, Any]:
    """The bot's message in ``room`` that shows ``contains`` and each of ``also`` (its edits applied), once it
    does, as it reads then: wait for the whole of what the test reads, not a piece streamed before it."""
    texts = (contains, *also)
    return wait_until(lambda: next((m for m in person.messages(room) if m["type"] == "m.room.message"
                                    and all(t in str(m["content"].get("body", "")) for t in texts)), None),
                      timeout=timeout, what=f"a message in {room} with {texts!r}")


def direct_room(person: Person, bot: Person) -> str:
    room = person.room(bot.user_id)
    wait_until(lambda: bot.user_id in person.joined(room), timeout=60, what="the bot joining the room")
    return room


def own_tree(ws: Path, person: Person) -> Path:
    """The workspace of ``person``'s turns: a Matrix user's own tree, not the agent's."""
    return identity_tree(ws, "matrix:" + person.user_id[1:].replace(":", "@"))


def test_a_plain_turn_and_a_tool_turn_stream_by_edits(
        processes: Processes, matrix_env: dict[str, str], people: dict[str, Person], ws: Path) -> None:
    alice, bot = people["alice"], people["bot"]
    start_channel(processes)
    own_tree(ws, alice).mkdir(parents=True, exist_ok=True)
    (own_tree(ws, alice) / "notes.txt").write_text("the secret word is pincer-42\n")
    room = direct_room(alice, bot)
    alice.say(room, "hello <b>there</b> **you**")
    shown = answer(alice, room, "echo: hello", "</b> you")
    assert shown["content"]["body"] == "echo: hello <b>there</b> you"
    assert shown["content"]["formatted_body"] == "echo: hello &lt;b&gt;there&lt;/b&gt; <b>you</b>"
    alice.say(room, 'CALL read_file {"path": "notes.txt"}')
    tool = answer(alice, room, "RESULT read_file", "pincer-42")
    assert "⚙ read_file" in tool["content"]["body"]
    assert tool.get("edits", 0) >= 1  # streamed into one message by m.replace edits
    assert len([m for m in alice.messages(room) if m["type"] == "m.room.message"]) == 2


def test_a_strangers_invite_is_declined_until_paired(
        processes: Processes, matrix_env: dict[str, str], people: dict[str, Person],
        scripted_llm: ScriptedLLM) -> None:
    stranger, bot = people["stranger"], people["bot"]
    start_channel(processes)
    asked = len(scripted_llm.requests)
    room = stranger.room(bot.user_id)
    logged = wait_until(lambda: next((line for line in processes.logs().splitlines()
                                      if "a stranger wrote" in line and "code=" in line), None),
                        timeout=60, what="the stranger's code logged")
    code = logged.split("code=")[1].split()[0].strip('"')
    assert bot.user_id not in stranger.joined(room) and len(scripted_llm.requests) == asked
    paired = processes.run("channels", "pair", code, "--channel", "matrix")
    assert paired.returncode == 0 and "as matrix:" in paired.stdout, paired.stderr
    second = direct_room(stranger, bot)
    stranger.say(second, "thanks")
    answer(stranger, second, "echo: thanks")


def test_in_a_group_a_mention_is_needed_and_an_approval_is_its_own_persons(
        processes: Processes, matrix_env: dict[str, str], people: dict[str, Person], ws: Path) -> None:
    alice, bob, bot = people["alice"], people["bob"], people["bot"]
    start_channel(processes)
    room = alice.room(bot.user_id, bob.user_id, name="team")
    bob.join(room)
    wait_until(lambda: bot.user_id in alice.joined(room), timeout=60, what="the bot in the group")
    alice.say(room, "talking among ourselves")
    alice.say(room, 'CALL exec {"command": "echo approved > out.txt; cat out.txt"}', mentions=[bot.user_id])
    ask = answer(alice, room, "Allow exec?")
    assert "React with ✅ allow once" in ask["content"]["body"]
    def choices() -> list[dict[str, Any]] | None:  # the bot reacts once per choice, one after another
        found = [m for m in alice.messages(room) if m["type"] == "m.reaction"
                 and m["content"]["m.relates_to"]["event_id"] == ask["event_id"]]
        return found if len(found) == 3 else None

    reactions = wait_until(choices, timeout=30, what="the bot's three reactions as the choices")
    assert {r["content"]["m.relates_to"]["key"] for r in reactions} == {"✅", "🔁", "❌"}
    bob.react(room, ask["event_id"], "✅")  # Bob may talk, but this is Alice's turn
    answer(alice, room, "not yours")
    assert not (own_tree(ws, alice) / "out.txt").exists()
    alice.react(room, ask["event_id"], "✅")
    done = answer(alice, room, "RESULT exec")
    assert "approved" in done["content"]["body"] and (own_tree(ws, alice) / "out.txt").read_text() == "approved\n"
    assert not (ws / "out.txt").exists() and not (own_tree(ws, bob) / "out.txt").exists()  # hers alone
    assert not any("ourselves" in t for t in alice.texts(room))
    bob.say(room, f"{bot.user_id.removeprefix('@').partition(':')[0]}: what now?")  # named: a mention
    assert answer(alice, room, "echo: what", "now?")["content"]["body"] == "echo: what now?"  # the name left out
    bob.say(room, f"{bot.user_id}: and then?")  # by the full id
    assert answer(alice, room, "echo: and", "then?")["content"]["body"] == "echo: and then?"


def test_ask_user_is_answered_by_a_numbered_reaction_and_a_next_message(
        processes: Processes, matrix_env: dict[str, str], people: dict[str, Person],
        scripted_llm: ScriptedLLM) -> None:
    alice, bot = people["alice"], people["bot"]
    start_channel(processes)
    room = direct_room(alice, bot)
    alice.say(room, 'CALL ask_user {"questions": [{"text": "Which colour?", "choices": ["red", "blue"]}, '
                    '{"text": "Why that one?"}]}')
    ask = answer(alice, room, "❓ Which colour?")
    assert "React with 1\N{COMBINING ENCLOSING KEYCAP} red · 2\N{COMBINING ENCLOSING KEYCAP} blue" in \
        ask["content"]["body"]
    answer(alice, room, "❓ Why that one?")

    def choices() -> list[dict[str, Any]] | None:  # the bot reacts once per choice, one after another
        found = [m for m in alice.messages(room) if m["type"] == "m.reaction"
                 and m["content"]["m.relates_to"]["event_id"] == ask["event_id"]]
        return found if len(found) == 2 else None

    wait_until(choices, timeout=30, what="the bot's two reactions as the choices")
    alice.react(room, ask["event_id"], "2\N{COMBINING ENCLOSING KEYCAP}")
    answer(alice, room, "Answered: blue")
    alice.say(room, "it is calm")
    answer(alice, room, "Noted")
    answer(alice, room, "RESULT ask_user", "blue", "it is calm")
    results = [m["content"] for b in scripted_llm.requests for m in b["messages"] if m.get("role") == "tool"]
    assert [json.loads(r)["answers"] for r in results] == [["blue", "it is calm"]]


def test_files_both_ways_and_an_encrypted_room_is_declined_plainly(
        processes: Processes, matrix_env: dict[str, str], people: dict[str, Person], ws: Path,
        scripted_llm: ScriptedLLM) -> None:
    alice, bot = people["alice"], people["bot"]
    start_channel(processes)
    room = direct_room(alice, bot)
    alice.send_file(room, "../../data.txt", b"hello from a file")
    answer(alice, room, "The person sent a file, saved in the workspace at inbox/matrix/")
    alice.say(room, 'CALL read_file {"path": "inbox/matrix/data.txt"}')  # her own workspace's inbox
    answer(alice, room, "RESULT read_file", "hello from a file")
    mine = own_tree(ws, alice)
    assert (mine / "inbox" / "matrix" / "data.txt").read_bytes() == b"hello from a file"
    (mine / "notes.txt").write_text("the secret word is pincer-42\n")
    alice.say(room, "here you are\n[attach: notes.txt]")
    sent = wait_until(lambda: next((m for m in alice.messages(room) if m["content"].get("msgtype") == "m.file"),
                                   None), timeout=60, what="the file sent back")
    assert sent["content"]["body"] == "notes.txt"
    assert alice.download(sent["content"]["url"]) == b"the secret word is pincer-42\n"
    asked = len(scripted_llm.requests)
    secret = alice.room(bot.user_id, encrypted=True)
    wait_until(lambda: bot.user_id in alice.joined(secret), timeout=60, what="the bot in the encrypted room")
    alice.send(secret, {"algorithm": "m.megolm.v1.aes-sha2", "ciphertext": "AwgAEn...", "sender_key": "x",
                        "device_id": "D", "session_id": "s"}, kind="m.room.encrypted")
    notice = answer(alice, secret, "end-to-end encrypted")
    assert notice["content"]["msgtype"] == "m.notice" and len(scripted_llm.requests) == asked


def test_killed_mid_turn_and_the_homeserver_restarted_each_message_is_answered_once(
        processes: Processes, matrix_env: dict[str, str], people: dict[str, Person], synapse: Synapse,
        scripted_llm: ScriptedLLM) -> None:
    alice, bot = people["alice"], people["bot"]
    start_channel(processes, name="matrix-1")
    room = direct_room(alice, bot)
    alice.say(room, "SLEEP 4\nslow one")
    wait_until(lambda: any("slow one" in json.dumps(r["messages"]) for r in scripted_llm.requests), timeout=60,
               what="the turn at the model")
    first = next(proc for name, proc, _ in processes.started if name == "matrix-1")
    processes.stop(first, sig=signal.SIGKILL)
    alice.say(room, "while it was down")
    start_channel(processes, name="matrix-2")
    answer(alice, room, "slept 4s", timeout=120)
    answer(alice, room, "echo: while it was down", timeout=60)
    synapse.stop()  # the homeserver goes away: the channel waits, and syncs on from where it was
    wait_until(lambda: "matrix poll:" in processes.logs(), timeout=60, what="the poller noticing")
    synapse.start()
    for n in range(3):
        alice.say(room, f"after {n}")
    try:
        for n in range(3):
            answer(alice, room, f"echo: after {n}", timeout=120)
    except AssertionError as exc:  # seen once in CI, never here: what each side said, at the top of the report
        said = [line[:300] for line in processes.logs().splitlines() if "WARNING" in line or "ERROR" in line]
        raise AssertionError(f"{exc}\n--- Pincer's warnings ---\n" + "\n".join(said[-30:])
                             + f"\n--- Synapse's warnings ---\n{synapse.warnings()}") from None
    texts = alice.texts(room)
    for text in ("slept 4s", "echo: while it was down", "echo: after 0", "echo: after 1", "echo: after 2"):
        assert sum(text in t for t in texts) == 1, (text, texts)
    assert sum("slow one" in json.dumps(r["messages"][-1]) for r in scripted_llm.requests) == 1


def test_with_encryption_on_an_encrypted_room_is_talked_to_in_kind_and_its_keys_outlive_a_kill(
        processes: Processes, matrix_env: dict[str, str], people: dict[str, Person], tmp_path: Path,
        ws: Path) -> None:
    bot = people["bot"]
    processes.env = {**processes.env, "PINCER_CHANNELS__MATRIX__ENCRYPTION": "true",
                     "PINCER_CHANNELS__MATRIX__STORE_DIR": str(tmp_path / "bot-keys")}
    start_channel(processes, name="matrix-1")
    alice = EncryptedPerson(people["alice"], tmp_path / "alice-keys")
    try:
        room = alice.room(bot.user_id)
        wait_until(lambda: bot.user_id in people["alice"].joined(room), timeout=60, what="the bot in the room")
        alice.say(room, "hello in secret")
        wait_until(lambda: "echo: hello in secret" in alice.answers(room), timeout=60, what="the decrypted answer")
        on_server = people["alice"].call("GET", f"/rooms/{quote(room)}/messages", params={"dir": "b", "limit": 100})
        bots = [event for event in on_server["chunk"] if event["sender"] == bot.user_id]
        assert bots and all(event["type"] != "m.room.message" for event in bots)  # only ciphertext on the server
        assert "hello in secret" not in json.dumps(on_server)
        alice.send_file(room, "data.txt", b"hello from a sealed file")
        wait_until(lambda: any("saved in the workspace at inbox/matrix/" in text for text in alice.answers(room)),
                   timeout=60, what="the sealed file taken")
        alice.say(room, 'CALL read_file {"path": "inbox/matrix/data.txt"}')
        mine = identity_tree(ws, "matrix:" + alice.person.user_id[1:].replace(":", "@"))
        (mine / "notes.txt").write_text("the secret word is pincer-42\n")
        wait_until(lambda: any("hello from a sealed file" in text for text in alice.answers(room)), timeout=60,
                   what="the file read by a tool, decrypted")
        alice.say(room, "here you are\n[attach: notes.txt]")
        assert wait_until(lambda: alice.files(room).get("notes.txt"), timeout=60,
                          what="a sealed file sent back") == b"the secret word is pincer-42\n"
        keys = device_keys(people["alice"], bot.user_id)
        first = next(proc for name, proc, _ in processes.started if name == "matrix-1")
        processes.stop(first, sig=signal.SIGKILL)
        start_channel(processes, name="matrix-2")  # the same device: its keys were kept in store_dir
        assert device_keys(people["alice"], bot.user_id) == keys and keys  # not a new identity key
        alice.say(room, "still secret after the kill")
        wait_until(lambda: "echo: still secret after the kill" in alice.answers(room), timeout=90,
                   what="an answer from the restarted channel")
        assert alice.undecrypted(room) == 0
        assert sum(text == "echo: hello in secret" for text in alice.answers(room)) == 1
    finally:
        alice.close()


def device_keys(person: Person, user_id: str) -> dict[str, str]:
    """The identity keys the homeserver publishes for a user's devices."""
    found = person.call("POST", "/keys/query", json={"device_keys": {user_id: []}})["device_keys"].get(user_id, {})
    return {device: str(info["keys"].get(f"curve25519:{device}")) for device, info in found.items()}


def test_more_said_while_away_than_one_sync_brings_is_read_back_and_answered(
        processes: Processes, matrix_env: dict[str, str], people: dict[str, Person]) -> None:
    alice, bot = people["alice"], people["bot"]
    processes.env = {**processes.env, "PINCER_CHANNELS__MATRIX__SYNC_TIMELINE_LIMIT": "3"}
    start_channel(processes, name="matrix-1")
    room = direct_room(alice, bot)
    alice.say(room, "before")
    answer(alice, room, "echo: before")
    first = next(proc for name, proc, _ in processes.started if name == "matrix-1")
    processes.stop(first)
    for n in range(8):  # eight messages (and a sync brings three events a room): a limited timeline
        alice.say(room, f"while away {n}")
    start_channel(processes, name="matrix-2")
    for n in range(8):
        answer(alice, room, f"echo: while away {n}", timeout=90)
    texts = alice.texts(room)
    assert all(sum(f"while away {n}" in t for t in texts) == 1 for n in range(8)), texts
