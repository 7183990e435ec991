"""The session archive's pure parts: paths made of checked names only, a file only its owner reads, each
entry once however often a session is archived."""

from __future__ import annotations

from pathlib import Path

from bus.config import Config, load_config
from bus.settings import RetentionSettings
from memory.archive import OPERATORS, Archived, SessionArchive, file_name, merged, owner_dir
from memory.sessions import TranscriptEntry


def entry(text: str, ts: int) -> TranscriptEntry:
    return TranscriptEntry(role="user", content=text, timestamp=ts)


def test_paths_are_checked_names_or_digests_never_what_a_client_sent(tmp_path: Path) -> None:
    archive = SessionArchive(tmp_path / "archive")
    assert owner_dir("alice") == "alice" and owner_dir("") == OPERATORS
    for hostile in ("../bob", "..", "a/b", ".hidden", "x\0y", "telegram:1/../../etc"):
        name = owner_dir(hostile)
        assert "/" not in name and not name.startswith(".") and name != hostile
    for session in ("alice/../../bob/x", "alice/" + "../" * 20 + "etc/passwd", "alice/notes"):
        path = archive.path("alice", session)
        assert path.parent == tmp_path / "archive" / "alice" and path.name == file_name(session)
        assert path.resolve().is_relative_to((tmp_path / "archive").resolve())


def test_an_archive_is_private_and_read_only_as_its_owners(tmp_path: Path) -> None:
    archive = SessionArchive(tmp_path / "archive")
    path = archive.write(Archived("alice/notes", "alice", {"title": "notes", "messages": 1},
                                  [entry("my pin is 4321", 1)], ['{"session": "alice/notes"}'], archived_at=5.0))
    assert path.stat().st_mode & 0o777 == 0o600 and path.parent.stat().st_mode & 0o777 == 0o700
    found = archive.read("alice", "alice/notes")
    assert found is not None and [e.content for e in found.entries] == ["my pin is 4321"]
    assert found.record == ['{"session": "alice/notes"}'] and found.about["title"] == "notes"
    assert archive.read("bob", "alice/notes") is None  # under bob's directory there is nothing of alice's
    path_of_bob = archive.path("bob", "alice/notes")
    path_of_bob.parent.mkdir(mode=0o700)
    path_of_bob.write_bytes(path.read_bytes())  # alice's file copied under bob's name: its header says alice's
    assert archive.read("bob", "alice/notes") is None
    assert [h["session_id"] for h in archive.listed("alice")] == ["alice/notes"]
    assert archive.listed("bob") == [] and archive.listed("carol") == []


def test_archiving_again_keeps_each_entry_once_and_adds_what_is_new(tmp_path: Path) -> None:
    archive = SessionArchive(tmp_path / "archive")
    first = Archived("s", "alice", {"messages": 2}, [entry("one", 1), entry("two", 2)])
    archive.write(first)
    archive.write(first)  # a pass killed after writing: the next one writes the same again
    archive.write(Archived("s", "alice", {"messages": 1}, [entry("three", 3)]))  # the session came back
    found = archive.read("alice", "s")
    assert found is not None and [e.content for e in found.entries] == ["one", "two", "three"]
    assert found.about["messages"] == 2
    assert merged(None, first) is first
    (tmp_path / "archive" / "alice").chmod(0o755)  # as a restore's tar may leave it
    archive.write(first)
    assert (tmp_path / "archive" / "alice").stat().st_mode & 0o777 == 0o700


def test_retention_defaults_are_the_packaged_config(tmp_path: Path) -> None:
    packaged = load_config(Path(__file__).parents[2] / "config.yaml", env={}).runtime.retention
    assert packaged == RetentionSettings()
    assert (packaged.transcript_days, packaged.dead_letter_days, packaged.alert_days) == (90, 30, 30)
    forever = Config({"runtime": {"retention": {"transcript_days": None}}}).runtime.retention
    assert forever.transcript_days is None


def test_record_export_reads_an_archived_sessions_record_from_the_data_dir(tmp_path: Path) -> None:
    from gateway.cli.record import _archived_record

    config = Config({"runtime": {"data_dir": str(tmp_path)}})
    archive = SessionArchive(config.runtime.archive_path)
    archive.write(Archived("alice/trip", "alice", {}, [entry("hi", 1)], ['{"session": "alice/trip"}']))
    assert _archived_record(config, "alice/trip") == ['{"session": "alice/trip"}']
    assert _archived_record(config, "bob/trip") == []
