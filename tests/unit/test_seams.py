"""Tools against the fakes behind their seams: the tools' logic, without Redis or a sandbox."""

from __future__ import annotations

from pathlib import Path

from bus.protocol import ErrorCode, ToolExecute, now_ms
from hands.config import HandsSettings
from hands.executor import Executor
from hands.worker import build_registry
from tests.fakes import FakeApprovals, FakeNotes, FakeSandbox


def executor(tmp_path: Path, **services) -> Executor:
    (tmp_path / "ws").mkdir(exist_ok=True)
    return Executor(build_registry(), HandsSettings(workspace=tmp_path / "ws"), worker_id="w-fake", **services)


async def run(executor: Executor, tool: str, **args):
    return await executor.execute(ToolExecute(tool=tool, args=args, session_id="s", reply_to="r", agent_id="a1",
                                              deadline=now_ms() + 10_000))


async def test_memory_tools_against_the_fake_notes(tmp_path: Path) -> None:
    notes = FakeNotes()
    hands = executor(tmp_path, memory=notes)
    assert (await run(hands, "memory_write", key="plan", content="ship it")).success
    assert (await run(hands, "memory_write", key="plan", content=" friday", append=True)).data["chars"] == 14
    assert notes.notes["a1", "", "plan"] == "ship it friday"  # no sender (a bus client): the shared notes
    found = await run(hands, "memory_search", query="FRIDAY")
    assert [n["key"] for n in found.data["hits"]] == ["plan"]
    missing = await run(hands, "memory_read", key="nope")
    assert missing.error.code is ErrorCode.FILE_NOT_FOUND and "plan" in missing.error.message


async def test_a_denied_command_never_reaches_the_sandbox(tmp_path: Path) -> None:
    approvals, sandbox = FakeApprovals(allow=False), FakeSandbox(tmp_path / "ws")
    hands = executor(tmp_path, approvals=approvals, sandbox=sandbox)
    denied = await run(hands, "exec", command="rm -rf important")
    assert denied.error.code is ErrorCode.APPROVAL_DENIED
    assert approvals.asked and "rm -rf important" in approvals.asked[0] and sandbox.started == []


async def test_an_allowed_command_runs_and_reports_its_tier(tmp_path: Path) -> None:
    approvals, sandbox = FakeApprovals(allow=True), FakeSandbox(tmp_path / "ws")
    hands = executor(tmp_path, approvals=approvals, sandbox=sandbox)
    ran = await run(hands, "exec", argv=["echo", "hello"])
    assert ran.success and ran.data["stdout"] == "hello\n" and ran.metadata.sandbox == "fake"
    assert sandbox.started == [["echo", "hello"]]


async def test_pool_limits_hold_through_the_fake_gates(tmp_path: Path) -> None:
    import asyncio

    from hands.registry import Category, ToolDefinition
    from tests.fakes import FakePoolGates

    gates = FakePoolGates({"tool:licensed": 2})
    hands = executor(tmp_path, pool=gates)

    async def licensed(_args, _ctx):
        await asyncio.sleep(0.01)  # the work the licence covers
        return "done"

    hands.registry.register(ToolDefinition(name="licensed", description="d", parameters={"type": "object"},
                                           handler=licensed, category=Category.SKILL))
    results = await asyncio.gather(*(run(hands, "licensed") for _ in range(8)))
    assert all(r.success for r in results)
    assert gates.most["tool:licensed"] == 2 and gates.holding["tool:licensed"] == 0  # never more than the pool's 2
