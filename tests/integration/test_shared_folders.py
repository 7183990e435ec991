"""Folders the owners share (hands.shared_folders) through a real Hands worker: every other identity's file
tools and sandboxed commands read them in its own tree, and change them only where they are shared writable."""

from __future__ import annotations

from pathlib import Path

from bus.protocol import ErrorCode
from tests.conftest import identity_tree


async def test_shared_folders_read_only_and_writable_through_tools_and_the_sandbox(engine, call, ws: Path) -> None:
    (ws / "recipes").mkdir()
    (ws / "recipes" / "cake.txt").write_text("flour, eggs")
    await engine(workspace=ws, sandbox={"allow_degraded": True}, exec={"mode": "full"},
                          shared_folders={"recipes": {}, "drop": {"writable": True}})
    read = await call("read_file", {"path": "recipes/cake.txt"}, sender="bob")
    assert read.success and "flour, eggs" in str(read.data), read.error
    listed = await call("list_directory", {"path": "."}, sender="bob")
    assert listed.success and {"recipes", "drop"} <= {e["name"] for e in listed.data["entries"]}, listed.data
    refused = await call("write_file", {"path": "recipes/cake.txt", "content": "salt"}, sender="bob")
    assert refused.error.code is ErrorCode.PERMISSION_DENIED and "read-only" in refused.error.message
    assert (await call("write_file", {"path": "drop/note.txt", "content": "from bob"}, sender="bob")).success
    assert (ws / "drop" / "note.txt").read_text() == "from bob"  # in the owners' tree, where all see it

    ran = await call("exec", {"command": "cat recipes/cake.txt; echo salt > recipes/cake.txt; echo x > drop/x.txt;"
                                         " echo $?"}, sender="bob")
    assert ran.success, ran.error
    assert ran.data["sandbox"] == "bwrap", ran.data  # mounted into his tree: read-only, writable where shared so
    assert "flour, eggs" in ran.data["stdout"] and "Read-only file system" in ran.data["stderr"], ran.data
    assert (ws / "drop" / "x.txt").read_text() == "x\n"
    assert (ws / "recipes" / "cake.txt").read_text() == "flour, eggs"
    assert not (identity_tree(ws, "bob") / "recipes" / "cake.txt").exists()
    owner = await call("write_file", {"path": "recipes/cake.txt", "content": "flour, eggs, sugar"}, sender="owner")
    assert owner.success  # the owners change it; everyone reads the change
    assert "sugar" in str((await call("read_file", {"path": "recipes/cake.txt"}, sender="bob")).data)
