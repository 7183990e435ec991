"""The flight record end to end: real Gateway, Brain and Hands processes, litellm's real HTTP path to the
scripted model, and the `pincer record` command reading, exporting and importing what they recorded."""

from __future__ import annotations

import json

import pytest

from tests.conftest import Processes, gateway_client, stack_healthy, wait_until
from tests.scripted_llm import ScriptedLLM

pytestmark = pytest.mark.e2e


def test_a_tool_turn_is_recorded_shown_exported_imported_and_replayed(
        processes: Processes, pincer_env: dict[str, str], scripted_llm: ScriptedLLM) -> None:
    (processes.tmp_path / "workspace" / "notes.txt").write_text("recorded\n")
    for role in ("gateway", "brain", "hands"):
        processes.start(role, name=role)
    wait_until(lambda: stack_healthy(processes.env), timeout=60, what="a healthy stack")
    with gateway_client(processes.env) as client:
        reply = client.post("/v1/sessions/flight/messages", json={"text": 'CALL read_file {"path": "notes.txt"}'})
    assert reply.status_code == 200 and "recorded" in reply.json()["text"]

    shown = processes.run("record", "show", "flight", "--json")
    assert shown.returncode == 0, shown.stderr
    rows = json.loads(shown.stdout)
    assert [r["kind"] for r in rows] == ["turn", "model", "tool", "model"]
    first, second = rows[1], rows[3]
    assert first["finish_reason"] == "tool_calls" and second["finish_reason"] == "stop"
    assert first["prompt_tokens"] == 11 and not first["cached_tokens"] and second["cached_tokens"] == 8
    assert first["first_token_ms"] is not None and first["total_ms"] >= first["first_token_ms"]
    assert rows[2]["detail"] == "read_file: ok" and rows[2]["worker"]
    table = processes.run("record", "show", "flight")
    assert table.returncode == 0 and "2 model calls, 22 prompt tokens (36% from the provider's cache)" in table.stdout

    exported = processes.tmp_path / "flight.jsonl"
    assert processes.run("record", "export", "flight", "-o", str(exported)).returncode == 0
    lines = exported.read_text().splitlines()
    assert json.loads(lines[0])["session"] == "owner/flight"
    again = processes.run("record", "import", str(exported))
    assert again.returncode == 1 and "has a record already" in again.stderr  # nothing overwritten unasked
    copied = processes.run("record", "import", str(exported), "--session", "copy")
    assert copied.returncode == 0 and "4 steps imported as owner/copy" in copied.stdout
    assert json.loads(processes.run("record", "show", "copy", "--json").stdout) == rows

    asked = len(scripted_llm.requests)
    replayed = processes.run("replay", "flight", "--json")
    assert replayed.returncode == 0, replayed.stderr
    report = json.loads(replayed.stdout)
    assert report["model_calls_matched"] == 2 and report["diverged"] is None and report["turns"][0]["same"]
    from_file = processes.run("replay", str(exported))
    assert from_file.returncode == 0 and "no provider was asked, no tool ran" in from_file.stdout
    assert len(scripted_llm.requests) == asked  # a replay spends nothing
    verse = {"PINCER_BRAIN__INSTRUCTIONS": "Answer in verse."}
    changed = processes.run("replay", "flight", extra_env=verse)
    assert changed.returncode == 3, changed.stderr
    assert "Diverged at turn 1, model call 1" in changed.stdout and "+    Answer in verse." in changed.stdout
    assert len(scripted_llm.requests) == asked

    exported.write_text(exported.read_text().replace("recorded", "RECORDED"))  # an edited part
    edited = processes.run("record", "import", str(exported), "--session", "edited")
    assert edited.returncode == 2 and "does not match its content" in edited.stderr
    missing = processes.run("record", "show", "nothing-here")
    assert missing.returncode == 1 and "has no flight record" in missing.stderr


def test_a_fork_keeps_the_first_messages_and_asks_no_model_for_them(
        processes: Processes, pincer_env: dict[str, str], scripted_llm: ScriptedLLM) -> None:
    for role in ("gateway", "brain", "hands"):
        processes.start(role, name=role)
    wait_until(lambda: stack_healthy(processes.env), timeout=60, what="a healthy stack")
    with gateway_client(processes.env) as client:
        for text in ("first words", "second words", "third words"):
            assert client.post("/v1/sessions/long/messages", json={"text": text}).status_code == 200
    asked = len(scripted_llm.requests)
    forked = processes.run("fork", "long", "--at", "2", "--name", "retry", "--json")
    assert forked.returncode == 0, forked.stderr
    made = json.loads(forked.stdout)
    assert made["session_id"] == "retry" and made["entries"] == 4 and made["record_steps"] == 4
    assert len(scripted_llm.requests) == asked  # nothing before the fork point is asked again
    with gateway_client(processes.env) as client:
        reply = client.post("/v1/sessions/retry/messages", json={"text": "a different third"})
        assert reply.status_code == 200 and reply.json()["text"] == "echo: a different third"
        entries = client.get("/v1/sessions/retry").json()["entries"]
        taken = client.post("/v1/sessions/long/fork", json={"at": 1, "name": "retry"})
        past = client.post("/v1/sessions/long/fork", json={"at": 4, "name": "elsewhere"})
        strangers = client.post("/v1/sessions/nobody/fork", json={"at": 1, "name": "mine"})
    assert len(scripted_llm.requests) == asked + 1
    sent = [m["content"] for m in scripted_llm.requests[-1]["messages"] if m["role"] != "system"]
    assert sent == ["first words", "echo: first words", "second words", "echo: second words", "a different third"]
    assert [e["content"] for e in entries if e["role"] == "user"] == ["first words", "second words",
                                                                      "a different third"]
    assert taken.status_code == 409 and "exists already" in taken.json()["error"]["message"]
    assert past.status_code == 400 and "messages 1 to 3" in past.json()["error"]["message"]
    assert strangers.status_code == 404
    recorded = json.loads(processes.run("record", "show", "retry", "--json").stdout)
    assert [r["kind"] for r in recorded] == ["turn", "model"] * 3  # two copied turns, then its own


def test_sessions_are_listed_titled_renamed_searched_and_with_their_spend(
        processes: Processes, pincer_env: dict[str, str], scripted_llm: ScriptedLLM) -> None:
    priced = {"PINCER_BRAIN__PRICES": json.dumps({"openai/scripted": {"input_per_mtok": 1000,
                                                                      "output_per_mtok": 1000}})}
    processes.start("gateway", name="gateway")
    processes.start("brain", name="brain", extra_env=priced)
    processes.start("hands", name="hands")
    wait_until(lambda: stack_healthy(processes.env), timeout=60, what="a healthy stack")
    with gateway_client(processes.env) as client:
        for session, text in (("trip", "plan   a trip\nto Lisbon in May " + "please " * 20), ("trip", "and back"),
                              ("bills", "pay the water bill")):
            assert client.post(f"/v1/sessions/{session}/messages", json={"text": text}).status_code == 200
        listed = client.get("/v1/sessions").json()
        renamed = client.patch("/v1/sessions/bills", json={"title": "  Household\n bills "})
        empty = client.patch("/v1/sessions/bills", json={"title": " \n "})
        strangers = client.patch("/v1/sessions/nobody", json={"title": "mine"})
        found = client.get("/v1/sessions", params={"q": "household"}).json()
        by_name = client.get("/v1/sessions", params={"q": "TRI"}).json()
        forked = client.post("/v1/sessions/trip/fork", json={"at": 1, "name": "trip-2"})
        after = {d["id"]: d for d in client.get("/v1/sessions").json()["details"]}
    details = {d["id"]: d for d in listed["details"]}
    assert listed["sessions"] == ["bills", "trip"]  # newest first, as before
    assert details["trip"]["title"].startswith("plan a trip to Lisbon in May please") and \
        details["trip"]["title"].endswith("…") and len(details["trip"]["title"]) == 80
    assert details["trip"]["messages"] == 2 and details["bills"]["messages"] == 1
    assert details["trip"]["spend_usd"] > details["bills"]["spend_usd"] > 0  # two turns against one
    assert renamed.status_code == 200 and renamed.json()["title"] == "Household bills"
    assert empty.status_code == 400 and strangers.status_code == 404
    assert found["sessions"] == ["bills"] and found["details"][0]["named"] is True
    assert by_name["sessions"] == ["trip"]
    assert forked.status_code == 201
    assert after["trip-2"]["title"].endswith("(from message 1)") and after["trip-2"]["spend_usd"] == 0
    assert after["bills"]["title"] == "Household bills"
