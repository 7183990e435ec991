"""Hands in a scratch copy of a workspace: what a replay with live tools runs its calls on.

The tools are this machine's Hands' (built-ins and the configured skills, under the same policy, limits and
sandbox), run in this process on a copy of the caller's workspace tree made in a temporary directory, so a
replayed ``write_file`` or ``exec`` changes the copy and never the agent's own files. Long-term notes are a
scratch store of their own (empty: a replay's writes never reach the agent's memory). MCP servers' tools
are not started here: a call to one is answered with ``TOOL_NOT_FOUND``, saying so.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from bus.metrics import Meter
from bus.protocol import ToolExecute, ToolResult
from hands.config import HandsSettings, sandbox_owner, workspaces
from hands.executor import Executor
from hands.sandbox.runner import Sandbox
from hands.testing import MemoryNotes
from hands.worker import load_registry


class ScratchHands:
    def __init__(self, settings: HandsSettings, identity: str) -> None:
        """Copy ``identity``'s workspace (as ``settings`` lay it out) into a new temporary directory."""
        self.root = Path(tempfile.mkdtemp(prefix="pincer-scratch-"))
        os.chmod(self.root, 0o711)  # the sandbox's uid passes through to its tree
        scratch = settings.model_copy(update={"workspace": self.root / "workspace",
                                              "identity_workspaces": self.root / "identities"})
        owner = sandbox_owner(scratch)
        real, copy = workspaces(settings).of(identity).root, workspaces(scratch, owner=owner).of(identity).root
        if real.is_dir():
            shutil.copytree(real, copy, symlinks=True, dirs_exist_ok=True)
            if owner is not None:
                for path in (copy, *copy.rglob("*")):
                    os.lchown(path, *owner)
        registry, _ = load_registry(scratch)
        # Cold: a scratch run is one-off, and its sync close() could not wait for a warm sandbox to end.
        sandbox = Sandbox(scratch.sandbox.model_copy(update={"warm": False}), scratch.workspace, meter=Meter())
        self.workspace = copy
        self.executor = Executor(registry, scratch, worker_id="scratch", sandbox=sandbox, memory=MemoryNotes())

    async def call(self, call: ToolExecute) -> ToolResult:
        return await self.executor.execute(call)

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
