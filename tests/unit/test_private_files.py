"""Files Pincer keeps (logs, spans, the data dir's lock) are their user's alone, never written through a link."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bus.private_file import append_private
from gateway.runtime.daemon import DataDirLock
from gateway.runtime.logfiles import RoleLog


def test_role_logs_are_private_and_stay_so_across_rotation(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    role = RoleLog(logs, "gateway", max_bytes=200, backups=2)
    for n in range(40):  # several rotations
        role.write(f"line {n} of what a chat said")
    role.close()
    files = sorted(logs.glob("gateway.log*"))
    assert len(files) == 3
    assert all(f.stat().st_mode & 0o777 == 0o600 for f in files), [oct(f.stat().st_mode) for f in files]
    assert logs.stat().st_mode & 0o777 == 0o700


def test_a_wider_file_left_there_is_narrowed(tmp_path: Path) -> None:
    old = tmp_path / "brain.log"
    old.write_text("before\n")
    old.chmod(0o644)
    with append_private(old) as out:
        out.write("after\n")
    assert old.stat().st_mode & 0o777 == 0o600 and old.read_text() == "before\nafter\n"


@pytest.mark.parametrize("opener", ["log", "lock", "append"])
def test_a_link_planted_at_the_name_is_never_followed(tmp_path: Path, opener: str) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("untouched\n")
    victim.chmod(0o644)
    data = tmp_path / "data"
    data.mkdir()
    name = {"log": data / "gateway.log", "lock": data / "pincer.lock", "append": data / "spans.jsonl"}[opener]
    name.symlink_to(victim)
    with pytest.raises(OSError):
        if opener == "log":
            RoleLog(data, "gateway", max_bytes=1000, backups=1).write("x")
        elif opener == "lock":
            DataDirLock(data).acquire()
        else:
            append_private(name)
    assert victim.read_text() == "untouched\n" and victim.stat().st_mode & 0o777 == 0o644
    assert os.path.islink(name)
