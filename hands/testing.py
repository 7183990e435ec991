"""Test a skill's tool in a few lines: loaded and run as a Hands worker would, without Redis or a model.

    from hands.testing import SkillUnderTest

    async def test_counts_words(tmp_path):
        skill = SkillUnderTest("skills/word_count", workspace=tmp_path)
        result = await skill.call(text="to be or not to be")
        assert result.success and result.data["words"] == 6

The skill is loaded by the same loader (its SKILL.md checked, its permissions
against the policy, a refusal raised as ``SkillRefused``), its arguments
validated against its schema, and the handler run by the same executor with
a real workspace (``workspace``) and in-memory notes: what ``call`` returns is
the ``ToolResult`` the model would read, errors included, after the same
encoding it crosses the bus in (a tuple comes back a list). What the handler
reports with ``ctx.progress`` is kept in ``progress``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bus.codec import decode, encode
from bus.protocol import ToolExecute, ToolProgress, ToolResult, now_ms
from hands.config import HandsSettings
from hands.executor import Executor
from hands.notes import CallersNotes
from hands.permissions import PermissionPolicy
from hands.registry import ToolRegistry
from hands.seams import Notes
from hands.skills import SkillRefused, load_skill


class MemoryNotes:
    """Long-term notes in a dict, per agent and owner: what ``ctx.memory`` is in a test (hands.seams.NoteKeeping).
    Owner "" holds the agent's shared notes, which every owner also sees (its own first)."""

    def __init__(self) -> None:
        self.notes: dict[tuple[str, str, str], str] = {}

    async def write(self, agent_id: str, key: str, content: str, *, owner: str, append: bool = False) -> str:
        old = self.notes.get((agent_id, owner, key), "") if append else ""
        self.notes[agent_id, owner, key] = old + content
        return self.notes[agent_id, owner, key]

    async def read(self, agent_id: str, key: str, *, owner: str) -> tuple[str, str] | None:
        for whose, scope in ((owner, "own"), ("", "shared")):
            if (agent_id, whose, key) in self.notes:
                return self.notes[agent_id, whose, key], scope
        return None

    async def list(self, agent_id: str, *, owner: str) -> Notes:
        return [{"key": key, "chars": len(text), "scope": "own" if whose else "shared"}
                for (agent, whose, key), text in sorted(self.notes.items())
                if agent == agent_id and whose in (owner, "")]

    async def search(self, agent_id: str, query: str, *, owner: str, limit: int = 10, turn: str = "") -> Notes:
        return [{"source": "note", "key": key, "excerpt": text[:80]}
                for (agent, whose, key), text in sorted(self.notes.items())
                if agent == agent_id and whose in (owner, "") and query.lower() in text.lower()][:limit]

    async def delete(self, agent_id: str, key: str, *, owner: str) -> bool:
        return self.notes.pop((agent_id, owner, key), None) is not None


class SkillUnderTest:
    """One skill folder (with SKILL.md and handler.py), ready to be called."""

    def __init__(self, folder: str | Path, *, workspace: str | Path, session_id: str = "test/main",
                 agent_id: str = "main", sender: str = "tester", **settings: Any) -> None:
        folder = Path(folder).resolve()
        workspace = Path(workspace)
        workspace.mkdir(parents=True, exist_ok=True)
        # ``workspace`` is the calls' own: the sender is an owner, whose tree is hands.workspace itself.
        tools = {"owners": [sender], **settings.pop("tools", {})}
        self.settings = HandsSettings.model_validate({"workspace": workspace, "skill_dirs": [folder.parent],
                                                      "tools": tools, **settings})
        registry = ToolRegistry()
        loaded = load_skill(folder, registry, PermissionPolicy(self.settings.policy, workspace.resolve()))
        if not isinstance(loaded, str):
            raise SkillRefused(f"skill {loaded.name!r} has instructions only (no parameters or handler.py): "
                               "there is no tool to call")
        self.name = loaded
        self.notes = CallersNotes(MemoryNotes(), owner=sender)  # what the handler's ctx.memory sees

        self.progress: list[str] = []
        self.session_id, self.agent_id, self.sender = session_id, agent_id, sender
        self._executor = Executor(registry, self.settings, worker_id="skill-test", memory=self.notes.store,
                                  progress=self._progress)

    async def call(self, *, timeout_s: float = 30.0, **args: Any) -> ToolResult:
        """Run the tool with ``args`` as the model would send them; the result the model would read."""
        result = await self._executor.execute(ToolExecute(
            tool=self.name, args=args, session_id=self.session_id, agent_id=self.agent_id, sender=self.sender,
            reply_to="skill-test", deadline=now_ms() + int(timeout_s * 1000)))
        crossed = decode(encode(result))  # as it reaches the Brain: tuples are lists, and so on
        assert isinstance(crossed, ToolResult)
        return crossed

    async def _progress(self, _stream: str, progress: ToolProgress) -> None:
        if progress.status == "output":
            self.progress.append(progress.message)
