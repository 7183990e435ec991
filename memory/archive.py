"""Archived sessions: a session idle past its keep lives on as one file in the data dir.

``<data_dir>/archive/<owner>/<digest>.jsonl``, mode 0600 in 0700 directories: a header line (the
session's id, owner, title, spend, when it was archived), then its transcript entries, then its
flight record's export lines. The path is made of checked names only, never of what a client sent:
the owner's directory is its token name when that is a plain name (a digest otherwise), the file is
a digest of the session id. A read checks the header's id and owner too, so one identity's archive
is never read as another's.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from bus.private_file import write_private
from memory.sessions import TranscriptEntry

FORMAT = 1
OPERATORS = "_operators"  # the directory of sessions from before owners (owner "")
PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")


def owner_dir(owner: str) -> str:
    """The directory name of an owner's archive: its name when plain, else a digest (never a path)."""
    if owner == "":
        return OPERATORS
    if PLAIN_NAME.match(owner):
        return owner
    return "_" + hashlib.sha256(owner.encode()).hexdigest()[:32]


def file_name(session_id: str) -> str:
    return hashlib.sha256(session_id.encode()).hexdigest()[:40] + ".jsonl"


@dataclass
class Archived:
    """One session as archived: what a list shows of it (``about``), its entries and its flight record."""

    session_id: str
    owner: str
    about: dict[str, Any] = field(default_factory=dict)  # title, named, messages, updated_at, spend_usd
    entries: list[TranscriptEntry] = field(default_factory=list)
    record: list[str] = field(default_factory=list)  # FlightRecorder.export lines
    archived_at: float = 0.0

    def header(self) -> dict[str, Any]:
        return {"pincer_archive": FORMAT, "session_id": self.session_id, "owner": self.owner,
                "archived_at": self.archived_at, **self.about}


def merged(old: Archived | None, new: Archived) -> Archived:
    """``new`` over what was archived of the same session before: each entry once (an archive rewritten
    after a crash holds nothing twice), the newer flight record when it has one."""
    if old is None:
        return new
    seen = {_entry_key(e) for e in old.entries}
    entries = old.entries + [e for e in new.entries if _entry_key(e) not in seen]
    about = {**old.about, **new.about, "messages": max(int(old.about.get("messages", 0)),
                                                       int(new.about.get("messages", 0)))}
    return Archived(new.session_id, new.owner, about, entries, new.record or old.record, new.archived_at)


def _entry_key(entry: TranscriptEntry) -> str:
    return json.dumps(entry.model_dump(mode="json", exclude_none=True), sort_keys=True)


class SessionArchive:
    def __init__(self, root: Path) -> None:
        self.root = root  # <data_dir>/archive

    def path(self, owner: str, session_id: str) -> Path:
        return self.root / owner_dir(owner) / file_name(session_id)

    def write(self, archived: Archived) -> Path:
        """Write (or rewrite) the session's file, fsynced before this returns, merged with what it held."""
        path = self.path(archived.owner, archived.session_id)
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)  # a data dir not made yet is made here
        path.parent.mkdir(mode=0o700, exist_ok=True)
        for directory in (self.root, path.parent):  # one made wider (a restore's, by hand) is narrowed
            if directory.stat().st_mode & 0o077:
                directory.chmod(0o700)
        whole = merged(self.read(archived.owner, archived.session_id), archived)
        lines = [json.dumps(whole.header(), ensure_ascii=False)]
        lines += [json.dumps({"entry": e.model_dump(mode="json", exclude_none=True)}, ensure_ascii=False)
                  for e in whole.entries]
        lines += [json.dumps({"record": line}, ensure_ascii=False) for line in whole.record]
        write_private(path, "\n".join(lines) + "\n", durable=True)
        return path

    def read(self, owner: str, session_id: str) -> Archived | None:
        """The owner's archived session, or None (none, unreadable, or another's under the same name)."""
        found = self._load(self.path(owner, session_id))
        if found is None or found.session_id != session_id or found.owner != owner:
            return None
        return found

    def listed(self, owner: str | None) -> list[dict[str, Any]]:
        """What a list shows of each archived session (its header), the owner's or (None) everyone's."""
        if owner is None:
            directories = sorted(p for p in self.root.iterdir() if p.is_dir()) if self.root.is_dir() else []
        else:
            directories = [self.root / owner_dir(owner)]
        shown = []
        for directory in directories:
            for path in sorted(directory.glob("*.jsonl")) if directory.is_dir() else []:
                header = _header(path)
                if header is not None and (owner is None or header.get("owner") == owner):
                    shown.append(header)
        return shown

    def remove(self, owner: str, session_id: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path(owner, session_id))

    @staticmethod
    def _load(path: Path) -> Archived | None:
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (FileNotFoundError, NotADirectoryError):
            return None
        try:
            header = json.loads(lines[0])
            entries = [TranscriptEntry.model_validate(json.loads(line)["entry"])
                       for line in lines[1:] if line.startswith('{"entry"')]
            record = [str(json.loads(line)["record"]) for line in lines[1:] if line.startswith('{"record"')]
        except (IndexError, KeyError, ValueError, ValidationError):
            return None
        about = {k: v for k, v in header.items() if k not in ("pincer_archive", "session_id", "owner", "archived_at")}
        return Archived(str(header.get("session_id")), str(header.get("owner")), about, entries, record,
                        float(header.get("archived_at") or time.time()))


def _header(path: Path) -> dict[str, Any] | None:
    try:
        with path.open(encoding="utf-8") as handle:
            header = json.loads(handle.readline())
    except (OSError, ValueError):
        return None
    return header if isinstance(header, dict) and header.get("pincer_archive") == FORMAT else None
