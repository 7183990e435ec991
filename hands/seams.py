"""The services a tool may use, as Protocols: the real ones satisfy them, and so do the fakes in
``tests/fakes.py`` that unit tests put in their place (no Redis, no sandbox needed)."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from pathlib import Path

    from bus.protocol import Question, ToolExecute
    from bus.workspace import Shared
    from hands.background import BackgroundProcess
    from hands.questions import Asked
    from hands.sandbox.runner import Extras
    from hands.sandbox.running import Running, RunResult

Notes = list[dict[str, Any]]  # a method named list would shadow the builtin in the annotations below


class NoteKeeping(Protocol):
    """Long-term notes per agent and owner (``memory.longterm.LongTermMemory``); owner "" is the shared ones."""

    async def write(self, agent_id: str, key: str, content: str, *, owner: str, append: bool = False) -> str: ...
    async def read(self, agent_id: str, key: str, *, owner: str) -> tuple[str, str] | None: ...
    async def list(self, agent_id: str, *, owner: str) -> Notes: ...
    async def search(self, agent_id: str, query: str, *, owner: str, limit: int = 10, turn: str = "") -> Notes: ...
    async def delete(self, agent_id: str, key: str, *, owner: str) -> bool: ...


class ApprovalAsking(Protocol):
    """Exec approvals (``hands.approvals.ApprovalGate``): returns when a command may run, raises when not."""

    async def check(self, *, command: str | None, argv: list[str] | None, call: ToolExecute, summary: str) -> None: ...


class QuestionAsking(Protocol):
    """Questions to the call's person (``hands.questions.PersonAsker``): their answers, or why there are none."""

    async def ask(self, call: ToolExecute, questions: list[Question]) -> Asked: ...


class Sandboxing(Protocol):
    """Where commands run (``hands.sandbox.runner.Sandbox``)."""

    @property
    def tier(self) -> str:
        """How commands are contained here (``hands.sandbox.tiers.Tier``), reported in every result."""

    @property
    def owner(self) -> tuple[int, int] | None:
        """Who must own workspace files for commands to write them (the sandbox uid, as root)."""

    async def start(self, argv: list[str], *, workdir: str, env: dict[str, str], extra: Extras | None = None,
                    capture_stdout: bool = True, session: str = "", root: Path | None = None,
                    shared: dict[str, Shared] | None = None) -> Running: ...

    async def run(self, argv: list[str], *, workdir: str, env: dict[str, str], timeout_s: float,
                  stdin: bytes | None = None, session: str = "", root: Path | None = None) -> RunResult: ...


class PoolGates(Protocol):
    """Limits across every worker of the pool (``hands.pool_limits.PoolLimits``)."""

    limits: dict[str, int]

    def slot(self, gate_names: list[str]) -> AbstractAsyncContextManager[None]: ...


class BackgroundKeeping(Protocol):
    """Commands that outlive their call (``hands.background.BackgroundProcesses``)."""

    processes: dict[str, BackgroundProcess]

    def room_for(self, session_id: str) -> str | None: ...
    async def adopt(self, running: Running, *, session_id: str, command: str,
                    timeout_s: float) -> BackgroundProcess: ...
    def local(self, process_id: str, *, session_id: str | None = None) -> BackgroundProcess: ...
    async def owner(self, process_id: str) -> str | None: ...
    async def listing(self, session_id: str) -> Notes: ...
