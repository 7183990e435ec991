"""One chat turn is one trace: OpenTelemetry spans from the Gateway, the Brain and Hands, joined by traceparent."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.conftest import Processes, gateway_client, stack_healthy, wait_until

pytestmark = pytest.mark.e2e


def spans(where: Path) -> list[dict]:
    found = []
    for path in where.parent.glob(f"{where.name}.*.jsonl"):
        found += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return found


def test_a_turn_with_a_tool_call_is_one_trace_across_three_processes(processes: Processes,
                                                                     pincer_env: dict[str, str]) -> None:
    where = processes.tmp_path / "spans"
    processes.env = {**pincer_env, "PINCER_RUNTIME__OTEL_EXPORTER": "console",
                     "PINCER_RUNTIME__OTEL_FILE": str(where)}
    (processes.tmp_path / "workspace" / "notes.txt").write_text("traced\n")
    for role in ("gateway", "brain", "hands"):
        processes.start(role, name=role)
    client = gateway_client(processes.env)
    wait_until(lambda: stack_healthy(processes.env), timeout=60, what="a healthy stack")
    trace_id = os.urandom(16).hex()
    reply = client.post("/v1/sessions/traced/messages", json={"text": 'CALL read_file {"path": "notes.txt"}'},
                        headers={"traceparent": f"00-{trace_id}-{os.urandom(8).hex()}-01"})
    assert reply.status_code == 200 and "traced" in reply.json()["text"]

    def joined() -> list[dict] | None:
        mine = [s for s in spans(where) if s["context"]["trace_id"] == f"0x{trace_id}"]
        names = {s["name"] for s in mine}
        wanted = {"invoke_agent main", "chat openai/scripted", "execute_tool read_file"}
        return mine if wanted <= names else None

    mine = wait_until(joined, timeout=30, what="the turn's spans from all three processes")
    services = {s["resource"]["attributes"]["service.name"] for s in mine}
    assert services == {"pincer-gateway", "pincer-brain", "pincer-hands"}
    root = next(s for s in mine if s["name"] == "invoke_agent main")
    assert root["attributes"]["gen_ai.conversation.id"] == "owner/traced"  # the session's id on the wire
    by_id = {s["context"]["span_id"]: s for s in mine}
    for child in (s for s in mine if s is not root):
        assert child["parent_id"] in by_id  # every span hangs from the turn's tree, none is orphaned
    assert sum(s["name"].startswith("chat ") for s in mine) == 2  # the call, then the answer
    tool = next(s for s in mine if s["name"] == "execute_tool read_file")
    assert tool["attributes"]["gen_ai.tool.name"] == "read_file" and tool["parent_id"] == root["context"]["span_id"]

    timeline = processes.run("trace", "traced", "--json")
    assert timeline.returncode == 0, timeline.stderr
    steps = json.loads(timeline.stdout)[0]["steps"]
    assert [s["step"] for s in steps] == ["message", "model scripted", "tool read_file", "model scripted"]
    assert steps[0]["trace_id"] == trace_id  # the transcript names the trace the spans belong to
    assert steps[2]["detail"].startswith("ok (hands-") and steps[2]["ms"] is not None and steps[2]["attempts"] == 1
    assert [s["at_ms"] for s in steps] == sorted(s["at_ms"] for s in steps)
    printed = processes.run("trace", "traced", "--turn", "1")
    assert "tool read_file" in printed.stdout and f"trace {trace_id}" in printed.stdout
    assert processes.run("trace", "traced", "--turn", "9").returncode == 2
    assert processes.run("trace", "nobody").returncode == 1
