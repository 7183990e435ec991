"""Whose tree a call sees: a workspace per identity.

An owner (``hands.tools.owners``) and a call that names no sender (only a process on the bus makes
one; every door stamps its sender) use ``hands.workspace``, the agent's workspace as it always was:
what drives the owner's unattended behaviour (the heartbeat's checklist) lives there. Every other
identity (a token, a chat platform's user, a hook) gets a tree of its own under
``hands.identity_workspaces`` (``<workspace>-identities`` by default), which its file tools and its
sandbox see as the whole workspace, and nobody else's turns see at all. Hands builds it from its settings
(``hands.config.workspaces``); the Gateway's channels save
a person's uploads into the same tree and read ``[attach: PATH]`` from it, through the same boundary
(``bus.workspace.Workspace``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from bus.workspace import Shared, Workspace

# An identity is "name" (a token) or "kind:name" (telegram:12345, hook:ci). ":" is in no name, so
# "telegram~12345" cannot be the folder of a token called anything else.
_FOLDER_UNSAFE = re.compile(r"[^A-Za-z0-9_.@+:-]")


def identity_folder(identity: str) -> str:
    """The folder name of ``identity``'s own tree; ValueError for a name no door gives out."""
    if not identity or not identity[0].isalnum() or _FOLDER_UNSAFE.search(identity) or len(identity) > 90:
        raise ValueError(f"{identity!r} is not an identity's name")
    return identity.replace(":", "~")


class Workspaces:
    """The workspace of each identity, made on first use (0700, the sandbox's uid as its owner)."""

    def __init__(self, main: Path, people: Path, *, owners: Iterable[str],
                 owner: tuple[int, int] | None = None, shared: dict[str, bool] | None = None) -> None:
        """``shared``: folders of the main workspace every identity's tree shows (name -> writable)."""
        self.main = Workspace(main, owner=owner)
        self.people = people.expanduser().resolve()
        self.owners = frozenset(owners)
        self.owner = owner
        # Each is opened with O_NOFOLLOW at its last component (a link swapped in later is refused);
        # hands.config.check_workspace refuses one that is a link at start, before its path is resolved here.
        self.shared = {name: Shared(Workspace(self.main.root / name, owner=owner), writable)
                       for name, writable in (shared or {}).items()}
        self._trees: dict[str, Workspace] = {}

    def shared_by_owners(self, identity: str) -> bool:
        return not identity or identity in self.owners

    def of(self, identity: str) -> Workspace:
        """``identity``'s workspace, created if it is new."""
        if self.shared_by_owners(identity):
            return self.main
        tree = self._trees.get(identity)
        if tree is None:
            root = self.people / identity_folder(identity)
            if not self.people.is_dir():  # passable (the sandbox's uid enters its own tree), not listable
                self.people.mkdir(parents=True, exist_ok=True)
                self.people.chmod(0o711)
            own = Workspace(root, owner=self.owner)
            own.ensure()
            for name in self.shared:  # made through the boundary: a link planted at either name is refused
                with self.main.open_dir(name, create=True), own.open_dir(name, create=True):
                    pass  # the folder, and where the sandbox mounts it in this tree
            tree = Workspace(root, owner=self.owner, shared=self.shared)
            if len(self._trees) >= 4096:  # a worker's life can see many people: forget the oldest
                self._trees.pop(next(iter(self._trees)))
            self._trees[identity] = tree
        return tree

