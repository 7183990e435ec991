"""One fake behind each seam a unit test replaces (the Protocols in hands/seams.py, and the LLM's in
tests/integration/brain_fakes.py): no Redis, no sandbox, no network."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import fakeredis

from bus.keys import Keys
from bus.protocol import ErrorCode, Question, ToolExecute
from bus.settings import RedisSettings
from bus.store import RedisStore
from bus.streams import Bus
from hands.errors import ToolFailure
from hands.questions import Asked
from hands.sandbox.runner import Extras
from hands.sandbox.running import Running, RunResult, run_to_end
from hands.testing import MemoryNotes


def fake_redis() -> fakeredis.FakeAsyncRedis:
    """Redis in memory (fakeredis) for unit tests: the stores' surface (``bus.store.RedisStore``) and the
    bus's streams. No Lua (fakeredis runs scripts only with lupa): what runs a script is an integration test."""
    return fakeredis.FakeAsyncRedis()


FakeNotes = MemoryNotes  # the shipped one (hands.testing), which skill authors use too


def fake_bus(**settings: Any) -> Bus:
    """The bus over fakeredis (keys under ``u:``): streams, consumers and stores without a server."""
    return Bus(redis=fake_redis(), keys=Keys("u:"), settings=RedisSettings(prefix="u:", **settings))


class FakeApprovals:
    """Answers every ask with ``allow`` (True) or a denial, and remembers what it was asked."""

    def __init__(self, *, allow: bool) -> None:
        self.allow = allow
        self.asked: list[str] = []

    async def check(self, *, command: str | None, argv: list[str] | None, call: ToolExecute, summary: str) -> None:
        self.asked.append(summary)
        if not self.allow:
            raise ToolFailure(ErrorCode.APPROVAL_DENIED, "denied by the fake person", recoverable=False)


class FakeQuestions:
    """Answers every question with ``answers`` (None: nobody answers), and remembers what it was asked."""

    def __init__(self, answers: list[str] | None, *, by: str = "alice") -> None:
        self.answers, self.by = answers, by
        self.asked: list[list[Question]] = []

    async def ask(self, call: ToolExecute, questions: list[Question]) -> Asked:
        self.asked.append(questions)
        if self.answers is None:
            return Asked(None, reason="the fake person is away")
        return Asked(list(self.answers), by=self.by)


class FakeSandbox:
    """Runs commands unsandboxed, as this user, in the workspace: for the tools' own logic only."""

    tier = "fake"
    owner = None  # files stay this user's

    def __init__(self, workspace: Path) -> None:
        self.workspace = workspace
        self.started: list[list[str]] = []

    async def start(self, argv: list[str], *, workdir: str, env: dict[str, str], extra: Extras | None = None,
                    capture_stdout: bool = True, session: str = "", root: Path | None = None,
                    shared: dict[str, Any] | None = None) -> Running:
        self.started.append(argv)
        process = await asyncio.create_subprocess_exec(
            *argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            cwd=(root or self.workspace) / workdir, env={"PATH": "/usr/bin:/bin", **env}, start_new_session=True)
        return Running(process, self.tier, 200_000, capture_stdout=capture_stdout)

    async def run(self, argv: list[str], *, workdir: str, env: dict[str, str], timeout_s: float,
                  stdin: bytes | None = None, session: str = "", root: Path | None = None) -> RunResult:
        return await run_to_end(await self.start(argv, workdir=workdir, env=env, session=session, root=root),
                                timeout_s=timeout_s, stdin=stdin)


class FakePoolGates:
    """Pool-wide limits kept in this process: a semaphore per gate, and the most seen at once."""

    def __init__(self, limits: dict[str, int]) -> None:
        self.limits = limits
        self._gates = {name: asyncio.Semaphore(n) for name, n in limits.items()}
        self.holding: dict[str, int] = dict.fromkeys(limits, 0)
        self.most: dict[str, int] = dict.fromkeys(limits, 0)

    @contextlib.asynccontextmanager
    async def slot(self, gate_names: list[str]) -> AsyncIterator[None]:
        names = [n for n in gate_names if n in self._gates]
        async with contextlib.AsyncExitStack() as held:
            for name in names:
                await held.enter_async_context(self._gates[name])
                self.holding[name] += 1
                self.most[name] = max(self.most[name], self.holding[name])
                held.callback(self._left, name)
            yield

    def _left(self, name: str) -> None:
        self.holding[name] -= 1


def _satisfies() -> Any:  # checked by mypy: each fake fits its seam
    from hands.seams import ApprovalAsking, NoteKeeping, PoolGates, QuestionAsking, Sandboxing

    notes: NoteKeeping = FakeNotes()
    approvals: ApprovalAsking = FakeApprovals(allow=True)
    questions: QuestionAsking = FakeQuestions(["yes"])
    sandbox: Sandboxing = FakeSandbox(Path("."))
    pool: PoolGates = FakePoolGates({})
    store: RedisStore = fake_redis()
    return notes, approvals, questions, sandbox, pool, store
