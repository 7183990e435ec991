"""One file boundary for every role outside the sandbox: the workspace is opened only through
``bus.workspace.Workspace`` (race-free, no link followed), whose trees are each identity's own."""

from __future__ import annotations

import ast
import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from bus.config import ConfigError
from bus.protocol import ErrorCode
from bus.workspace import PathRefused, Workspace
from bus.workspaces import Workspaces, identity_folder
from hands.config import HandsSettings, check_workspace
from tests.conftest import ROOT

OUTSIDE_THE_SANDBOX = ("gateway", "brain", "memory")
# What opens, reads, writes, lists or stats a path by its name.
BY_NAME = {"open", "read_bytes", "read_text", "write_bytes", "write_text", "mkdir", "touch", "unlink", "rename",
           "replace", "exists", "is_file", "is_dir", "stat", "lstat", "iterdir", "glob", "rglob", "resolve",
           "rmdir", "chmod", "chown", "symlink_to", "listdir", "scandir", "makedirs", "walk", "rmtree", "copy",
           "copyfile", "move"}


def _calls_by_name(function: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(function):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if name in BY_NAME:
                found.append(name)
    return found


def _mentions_a_workspace(function: ast.AST) -> bool:
    for node in ast.walk(function):
        text = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
        if "workspace" in text.lower() and text not in ("Workspace", "Workspaces"):
            return True
    return False


def test_no_role_outside_the_sandbox_opens_a_workspace_path_by_name() -> None:
    """A function of the Gateway, the channels, the Brain or memory that reaches a workspace and calls a
    by-name file operation is the race #1 was: check a path, then open it again by name."""
    crossing = []
    for package in OUTSIDE_THE_SANDBOX:
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                function = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                if function and _mentions_a_workspace(node) and (calls := _calls_by_name(node)):
                    crossing.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} calls {calls}")
    assert not crossing, "open workspace files through bus.workspace.Workspace:\n" + "\n".join(crossing)


def test_the_lint_sees_the_race_it_forbids() -> None:
    racy = ast.parse("def send(self, relative):\n    path = (self.workspace / relative).resolve()\n"
                     "    return path.read_bytes()\n").body[0]
    assert _mentions_a_workspace(racy) and sorted(_calls_by_name(racy)) == ["read_bytes", "resolve"]


def test_a_new_file_is_never_one_a_link_was_planted_at(tmp_path: Path) -> None:
    ws = Workspace(tmp_path / "ws")
    ws.ensure()
    outside = tmp_path / "authorized_keys"
    (ws.root / "inbox").mkdir()
    (ws.root / "inbox" / "keys").symlink_to(outside)
    (ws.root / "inbox" / "fifo").mkdir()
    with ws.create_new("inbox", "keys") as (path, fd):
        os.write(fd, b"ssh-ed25519 AAAA")
    assert path == "inbox/keys-1" and not outside.exists()
    assert (ws.root / path).read_bytes() == b"ssh-ed25519 AAAA"
    assert stat.S_IMODE((ws.root / path).stat().st_mode) == 0o600
    with ws.create_new("inbox", "keys") as (second, _):
        pass
    assert second == "inbox/keys-2"  # never the same file twice


@pytest.mark.parametrize("plant", ["folder", "parent", "root-link"])
def test_a_link_on_the_way_to_a_new_file_is_refused(tmp_path: Path, plant: str) -> None:
    ws = Workspace(tmp_path / "ws")
    ws.ensure()
    target = tmp_path / "elsewhere"
    target.mkdir()
    if plant == "folder":
        (ws.root / "inbox").symlink_to(target)
        folder = "inbox"
    elif plant == "parent":
        (ws.root / "inbox").mkdir()
        (ws.root / "inbox" / "telegram").symlink_to(target)
        folder = "inbox/telegram"
    else:
        folder = "../elsewhere"
    with pytest.raises(PathRefused) as refused, ws.create_new(folder, "data.txt"):
        pass
    assert refused.value.code is ErrorCode.PERMISSION_DENIED
    assert list(target.iterdir()) == []


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "../x"])
def test_a_new_file_needs_a_plain_name(tmp_path: Path, name: str) -> None:
    ws = Workspace(tmp_path / "ws")
    ws.ensure()
    with pytest.raises(PathRefused), ws.create_new("inbox", name):
        pass


def test_a_file_is_read_from_the_descriptor_that_was_checked(tmp_path: Path) -> None:
    ws = Workspace(tmp_path / "ws")
    ws.ensure()
    secret = tmp_path / "secret"
    secret.write_text("root only")
    secret.chmod(0o600)
    (ws.root / "notes.txt").write_text("mine")
    (ws.root / "link").symlink_to(secret)
    (ws.root / "dir").mkdir()
    (ws.root / "dir" / "inner").symlink_to(secret)
    (ws.root / "swapped").symlink_to(tmp_path)  # a directory swapped for a link to outside
    os.mkfifo(ws.root / "fifo")
    assert ws.read_bytes("notes.txt", limit=100) == b"mine"
    for path in ("link", "dir/inner", "swapped/secret", "../secret", str(secret), "fifo"):
        with pytest.raises(PathRefused) as refused:
            ws.read_bytes(path, limit=100)
        assert refused.value.code is ErrorCode.PERMISSION_DENIED, path
    with pytest.raises(PathRefused) as big:
        ws.read_bytes("notes.txt", limit=3)
    assert big.value.code is ErrorCode.RESOURCE_EXHAUSTED
    with pytest.raises(PathRefused) as missing:
        ws.read_bytes("gone.txt", limit=3)
    assert missing.value.code is ErrorCode.FILE_NOT_FOUND


def test_each_identity_has_a_tree_of_its_own(tmp_path: Path) -> None:
    trees = Workspaces(tmp_path / "ws", tmp_path / "ws-identities", owners=["owner"])
    assert trees.of("owner").root == trees.of("").root == (tmp_path / "ws").resolve()
    alice, bob = trees.of("telegram:111"), trees.of("bob")
    assert alice.root == (tmp_path / "ws-identities" / "telegram~111").resolve()
    assert len({alice.root, bob.root, trees.main.root}) == 3
    assert stat.S_IMODE(alice.root.stat().st_mode) == 0o700
    assert stat.S_IMODE(trees.people.stat().st_mode) == 0o711  # passable, not listable
    for bad in ("../owner", "a/b", ".hidden", "x" * 100):
        with pytest.raises(ValueError):
            identity_folder(bad)
    assert identity_folder("telegram:111") != identity_folder("telegram-111")


def shared_trees(tmp_path: Path, **shared: bool) -> Workspaces:
    (tmp_path / "ws" / "recipes").mkdir(parents=True)
    (tmp_path / "ws" / "recipes" / "cake.txt").write_text("flour, eggs")
    return Workspaces(tmp_path / "ws", tmp_path / "ws-identities", owners=["owner"], shared=shared)


def test_a_shared_folder_is_read_by_everyone_and_written_by_nobody_else(tmp_path: Path) -> None:
    trees = shared_trees(tmp_path, recipes=False)
    bob = trees.of("telegram:222")
    assert bob.read_bytes("recipes/cake.txt", limit=100) == b"flour, eggs"
    assert bob.read_bytes("./recipes/cake.txt", limit=100) == b"flour, eggs"
    with bob.open_dir("recipes") as fd:
        assert os.listdir(fd) == ["cake.txt"]
    with bob.open_dir(".") as fd:
        assert os.listdir(fd) == ["recipes"]  # where the folder shows in his tree
    refusals: list[Callable[[], object]] = [
        lambda: bob.open_file("recipes/cake.txt", os.O_WRONLY | os.O_TRUNC).__enter__(),
        lambda: bob.open_file("recipes/new.txt", os.O_WRONLY | os.O_CREAT).__enter__(),
        lambda: bob.open_file("recipes/cake.txt", os.O_RDWR).__enter__(),
        lambda: bob.open_file("recipes/cake.txt", os.O_WRONLY | os.O_APPEND).__enter__(),
        lambda: bob.open_dir("recipes/sub", create=True).__enter__(),
        lambda: bob.create_new("recipes", "upload.txt").__enter__(),
    ]
    for attempt in refusals:
        with pytest.raises(PathRefused) as refused:
            attempt()
        assert refused.value.code is ErrorCode.PERMISSION_DENIED
        assert "hands.shared_folders.recipes.writable" in refused.value.message
    assert sorted(os.listdir(tmp_path / "ws" / "recipes")) == ["cake.txt"]
    assert (tmp_path / "ws" / "recipes" / "cake.txt").read_text() == "flour, eggs"
    with pytest.raises(PathRefused):
        bob.read_bytes("recipes/../../ws/secret", limit=100)  # the folder is no way out of either tree
    with bob.create_new("inbox/telegram", "mine.txt") as (made, _fd):  # his own tree still takes writes
        assert made == "inbox/telegram/mine.txt"


def test_a_writable_shared_folder_takes_everyones_writes_into_the_owners_tree(tmp_path: Path) -> None:
    trees = shared_trees(tmp_path, recipes=True)
    alice = trees.of("alice")
    with alice.open_file("recipes/soup.txt", os.O_WRONLY | os.O_CREAT) as fd:
        os.write(fd, b"leeks")
    with alice.create_new("recipes", "soup.txt") as (made, fd):
        os.write(fd, b"more leeks")
    assert made == "recipes/soup-1.txt"
    assert (tmp_path / "ws" / "recipes" / "soup.txt").read_text() == "leeks"
    assert trees.of("owner").read_bytes("recipes/soup-1.txt", limit=100) == b"more leeks"


def test_a_shared_folder_swapped_for_a_link_is_refused(tmp_path: Path) -> None:
    trees = shared_trees(tmp_path, recipes=False)
    bob = trees.of("bob")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "cake.txt").write_text("secret")
    (tmp_path / "ws" / "recipes").rename(tmp_path / "ws" / "old")
    (tmp_path / "ws" / "recipes").symlink_to(outside)  # after start: an owner's command swaps it
    with pytest.raises(PathRefused) as refused:
        bob.read_bytes("recipes/cake.txt", limit=100)
    assert refused.value.code is ErrorCode.PERMISSION_DENIED
    settings = HandsSettings(workspace=tmp_path / "ws", shared_folders={"recipes": {}})
    with pytest.raises(ConfigError, match=r"shared_folders\.recipes: .* is a symbolic link"):
        check_workspace(settings, data_dir=tmp_path / "data")  # and at the next start, refused before use
    for bad in ("inbox", "../up", "a/b", ".hidden"):
        with pytest.raises(ValueError, match="cannot be a shared folder"):
            HandsSettings(workspace=tmp_path / "ws", shared_folders={bad: {}})
