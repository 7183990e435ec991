"""The backup archive: what it keeps, what it leaves out, and that a damaged one is never restored."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from bus.snapshot import Taken
from gateway.runtime import backup
from gateway.runtime.backup import BackupError, Places


def places(root: Path) -> Places:
    found = Places(data=root / "data", workspace=root / "ws", identities=root / "ws-identities")
    for folder in found.roots().values():
        folder.mkdir(parents=True)
    return found


def packed(tmp_path: Path, *, secrets: bool = False) -> Path:
    here = places(tmp_path / "from")
    (here.data / "config.yaml").write_text("brain: {}\n")
    (here.data / "secrets.env").write_text("KEY=sk-x\n")
    (here.data / "matrix").mkdir()
    (here.data / "matrix" / "device.db").write_text("keys")
    (here.data / "pincer.json").write_text("{}")  # state: rebuilt, never kept
    (here.data / "archive" / "alice").mkdir(parents=True)  # sessions retention moved out of Redis
    (here.data / "archive" / "alice" / "s.jsonl").write_text('{"pincer_archive": 1}\n')
    (here.workspace / "a.txt").write_text("a")
    (here.workspace / "link").symlink_to("/etc/passwd")  # a link the model made: not followed
    (here.identities / "bob").mkdir()
    (here.identities / "bob" / "b.txt").write_text("b")
    keys = tmp_path / "redis.keys"
    keys.write_bytes(b"")
    import hashlib
    taken = Taken(keys=0, sha256=hashlib.sha256(b"").hexdigest(), server="7.0")
    return backup._pack(keys, taken, "p:", here, tmp_path / "out", secrets, lambda _: None)


def test_an_archive_keeps_the_data_and_workspaces_and_secrets_only_when_asked(tmp_path: Path) -> None:
    with tarfile.open(packed(tmp_path)) as tar:
        names = set(tar.getnames())
    assert names == {"manifest.json", "redis.keys", "data/config.yaml", "data/archive/alice/s.jsonl",
                     "workspace/a.txt", "identities/bob/b.txt"}
    with tarfile.open(packed(tmp_path / "with", secrets=True)) as tar:
        assert {"data/secrets.env", "data/matrix/device.db"} <= set(tar.getnames())


def test_a_damaged_archive_is_refused_with_what_is_wrong(tmp_path: Path) -> None:
    good = packed(tmp_path)
    with tarfile.open(good) as tar:
        members = [(m, tar.extractfile(m).read() if m.isfile() else b"") for m in tar.getmembers()]
    bad = tmp_path / "bad.tar.gz"
    with tarfile.open(bad, "w:gz") as tar:
        for member, body in members:
            if member.name == "workspace/a.txt":
                body = b"changed"
                member.size = len(body)
            tar.addfile(member, io.BytesIO(body))
    with pytest.raises(BackupError, match=r"workspace/a\.txt does not match its manifest"):
        backup.verify(bad)
    (tmp_path / "junk.tar.gz").write_bytes(b"not an archive")
    with pytest.raises(BackupError, match="not a readable Pincer backup"):
        backup.verify(tmp_path / "junk.tar.gz")


def test_a_restore_goes_only_into_fresh_places_and_the_same_prefix(tmp_path: Path) -> None:
    archive = packed(tmp_path)
    target = places(tmp_path / "to")
    with pytest.raises(BackupError, match=r"set redis\.prefix to 'p:'"):
        backup._checked(archive, "other:", target)
    (target.workspace / "mine.txt").write_text("x")
    with pytest.raises(BackupError, match="is not empty"):
        backup._checked(archive, "p:", target)
    (target.workspace / "mine.txt").unlink()
    assert backup._checked(archive, "p:", target)["prefix"] == "p:"
    backup._extract_files(archive, target)
    assert (target.identities / "bob" / "b.txt").read_text() == "b"
    assert (target.data / "archive" / "alice" / "s.jsonl").read_text() == '{"pincer_archive": 1}\n'
    assert not (target.workspace / "link").exists()


def test_prune_keeps_the_newest(tmp_path: Path) -> None:
    for stamp in ("20261201T000000Z", "20261202T000000Z", "20261203T000000Z"):
        (tmp_path / f"pincer-backup-{stamp}.tar.gz").write_text("")
    gone = backup.prune(tmp_path, 2)
    assert [p.name for p in gone] == ["pincer-backup-20261201T000000Z.tar.gz"]
    assert len(list(tmp_path.glob("*.tar.gz"))) == 2
