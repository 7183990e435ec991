"""Across releases: the previous release's wheel runs as each role beside this code.

docs/upgrades.md promises that two releases next to each other read each other's messages and stored data, so
a pool can be upgraded one process at a time. Here the previous release's wheel (v0.2.0's, kept in tests/releases
as it was built from its tag; or one built from the tag ``PINCER_PREVIOUS_RELEASE`` names) is unpacked, and put
first on the ``PYTHONPATH`` of one role's
process (the same installed dependencies serve both); the other two roles run this tree. Each role takes its turn
as the old one: plain, tool and streamed turns are answered through the Gateway, and ``pincer status`` shows both
releases with its warning. When this tree's stored layout is newer than the old release's, the promise is the
other one: the old process refuses to start and says why.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from httpx_sse import connect_sse

from bus import schema
from bus.release import VERSION
from tests.conftest import ROOT, Processes, gateway_client, gateway_health, wait_until
from tests.e2e.conftest import send

pytestmark = pytest.mark.e2e

PREVIOUS = "v0.2.0"  # the release before this one; PINCER_PREVIOUS_RELEASE names another tag
SHIPPED = ROOT / "tests" / "releases"  # the previous release's wheel as published: a clone needs no tags or history
EX_CONFIG = 78  # a process that must not be restarted: here, data newer than it knows
ROLES = ("gateway", "brain", "hands")


@dataclass(frozen=True)
class Release:
    tag: str
    version: str  # what its processes report in their heartbeats
    path: Path  # its unpacked wheel: what goes first on PYTHONPATH
    schema: int  # the stored layout version it knows

    def env(self) -> dict[str, str]:
        return {"PYTHONPATH": str(self.path)}


@pytest.fixture(scope="session")
def previous_release(tmp_path_factory: pytest.TempPathFactory) -> Release:
    """The previous release's wheel, unpacked (once per test session): the one kept in tests/releases, as
    published, or one built from the tag ``PINCER_PREVIOUS_RELEASE`` names."""
    tag = os.environ.get("PINCER_PREVIOUS_RELEASE")
    where = tmp_path_factory.mktemp(f"release-{tag or PREVIOUS}")
    wheel = _built(tag, where) if tag else SHIPPED / f"pincer-{PREVIOUS.removeprefix('v')}-py3-none-any.whl"
    unpacked = where / "unpacked"
    with zipfile.ZipFile(wheel) as archive_file:
        archive_file.extractall(unpacked)
    info = next(unpacked.glob("pincer-*.dist-info"))
    version = info.name.removeprefix("pincer-").removesuffix(".dist-info")
    return Release(tag or PREVIOUS, version, unpacked, _layout_version(unpacked / "bus" / "schema.py"))


def _built(tag: str, where: Path) -> Path:
    """A release's wheel built from its git tag (the build tests/releases/README.md describes)."""
    found = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"refs/tags/{tag}^{{commit}}"], cwd=ROOT,
                           capture_output=True, text=True)
    if found.returncode != 0:
        pytest.fail(f"the release tag {tag} is not in this clone ({ROOT}): fetch the tags (git fetch --tags "
                    "origin) and run again; a shallow clone needs --unshallow too", pytrace=False)
    source, dist = where / "source", where / "dist"
    source.mkdir()
    archive = subprocess.run(["git", "archive", "--format=tar", tag], cwd=ROOT, capture_output=True, check=True,
                             timeout=120)
    subprocess.run(["tar", "-x", "-C", str(source)], input=archive.stdout, check=True, timeout=120)
    # The same build the installed tests make (test_installed.py): pip's isolated build, from the configured index.
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--quiet", "--disable-pip-version-check",
                            "--no-deps", "-w", str(dist), str(source)],
                           cwd=where, capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, f"building {tag}'s wheel failed:\n{built.stdout}\n{built.stderr}"
    return next(dist.glob("pincer-*.whl"))


def _layout_version(path: Path) -> int:
    """``VERSION`` in a release's bus/schema.py, read without importing that release's code here."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "VERSION" for t in node.targets):
            return int(ast.literal_eval(node.value))
    raise AssertionError(f"no VERSION in {path}")


@pytest.fixture
def old(previous_release: Release) -> Release:
    assert previous_release.version != VERSION, (
        f"{previous_release.tag} reports {previous_release.version}, as this tree does: a release's working "
        "version moves past its tag (bus/release.py)")
    return previous_release


@pytest.fixture
def workspace_note(pincer_env: dict[str, str]) -> str:
    (Path(pincer_env["PINCER_WORKSPACE"]) / "notes.txt").write_text("the secret word is pincer-42\n")
    return "pincer-42"


def _start_pool(processes: Processes, old_role: str, old: Release) -> None:
    """A Gateway, a Brain and a Hands worker; ``old_role`` runs the old release's code, the others this tree's."""
    for role in ROLES:
        processes.start(role, name=f"{role}-{'old' if role == old_role else 'new'}",
                        extra_env=old.env() if role == old_role else None)
    wait_until(lambda: (h := gateway_health(processes.env)) and h.get("brains") == 1 and h.get("hands") == 1,
               timeout=90, what="the Gateway's /healthz counting one Brain and one Hands worker")


def _status(processes: Processes) -> dict[str, Any]:
    found = processes.run("status", "--json")
    assert found.stdout, found.stderr
    status: dict[str, Any] = json.loads(found.stdout)
    return status


@pytest.mark.parametrize("old_role", ROLES)
def test_the_previous_release_runs_as_one_role_beside_this_one(processes: Processes, old: Release, old_role: str,
                                                                workspace_note: str) -> None:
    if old.schema < schema.VERSION:
        pytest.skip(f"this tree's stored layout ({schema.VERSION}) is newer than {old.tag}'s ({old.schema}): "
                    "the refusal is tested instead")
    _start_pool(processes, old_role, old)

    plain = send(processes.env, "hello across releases", session=f"plain-{old_role}")
    assert plain.status_code == 200, plain.text
    assert plain.json()["text"] == "echo: hello across releases"

    tool = send(processes.env, 'CALL read_file {"path": "notes.txt"}', session=f"tool-{old_role}")
    assert tool.status_code == 200, tool.text
    body = tool.json()
    assert body["text"].startswith("RESULT read_file:") and workspace_note in body["text"]
    assert [c["tool"] for c in body["tool_calls"]] == ["read_file"]

    with gateway_client(processes.env) as client, connect_sse(
        client, "POST", f"/v1/sessions/sse-{old_role}/messages", json={"text": "CALL list_directory {}"},
    ) as source:
        assert source.response.status_code == 200
        events = [(e.event, json.loads(e.data)) for e in source.iter_sse()]
    kinds = [kind for kind, _ in events]
    assert kinds[:2] == ["tool", "tool"] and kinds[-1] == "reply", kinds
    deltas = "".join(data["text"] for kind, data in events if kind == "delta")
    assert "notes.txt" in deltas and deltas == events[-1][1]["text"]

    with gateway_client(processes.env) as client:  # the whole turn is kept, whoever wrote it
        entries = client.get(f"/v1/sessions/tool-{old_role}").json()["entries"]
    assert [e["role"] for e in entries] == ["user", "assistant", "tool", "assistant"]

    # Both releases are live, each under its own version, and `pincer status` says they differ.
    versions = wait_until(lambda: (v := _status(processes)["versions"]) and len(v) == 2 and v, timeout=30,
                          what="pincer status showing two releases")
    assert set(versions) == {old.version, VERSION}, versions
    assert [i.split("-")[0] for i in versions[old.version]] == [old_role], versions
    assert sorted(i.split("-")[0] for i in versions[VERSION]) == sorted(set(ROLES) - {old_role}), versions
    assert _status(processes)["dead"] == 0  # nothing either release wrote was dropped by the other as malformed
    shown = processes.run("status")
    assert re.search(rf"versions differ: .*{re.escape(old.version)}.*{re.escape(VERSION)}",
                     " ".join(shown.stdout.split())), shown.stdout


@pytest.mark.parametrize("old_role", ROLES)
def test_the_previous_release_refuses_a_newer_stored_layout(processes: Processes, old: Release, old_role: str,
                                                             redis_url: str, prefix: str) -> None:
    """What a release that moves the layout leaves the previous one: it stops, exits 78, and says why. When this
    tree's layout is newer, this tree's Gateway writes it first; otherwise a next release's is stood in for."""
    client = redis.Redis.from_url(redis_url)
    try:
        if old.schema < schema.VERSION:
            newer = schema.VERSION
            processes.start("gateway", name="gateway-new")
            wait_until(lambda: int(client.get(f"{prefix}schema") or 0) == newer, timeout=60,
                       what=f"this tree's Gateway bringing the stored layout to {newer}")
        else:
            newer = old.schema + 1
            client.set(f"{prefix}schema", newer)
        proc = processes.start(old_role, name=f"{old_role}-old", extra_env=old.env())
        assert proc.wait(timeout=60) == EX_CONFIG, processes.logs()
        log = processes.logs()
        assert f"layout version {newer}" in log and f"knows up to {old.schema}" in log, log
        assert int(client.get(f"{prefix}schema") or 0) == newer  # untouched: nothing was migrated down
    finally:
        client.close()
