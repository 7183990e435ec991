"""One verified archive of everything Pincer keeps, and bringing it back into a fresh place.

An archive (``pincer-backup-<UTC time>.tar.gz``, 0600) holds:

- ``manifest.json``: the release and layout version that wrote it, the prefix, when, each member's
  size and SHA-256, the Redis snapshot's key count, and what was left out;
- ``redis.keys``: every key under the prefix as at one instant (``bus.snapshot``);
- ``data/``: the data dir's own files (its ``config.yaml``, ``archive/``: the sessions retention moved out
  of Redis; with secrets, ``secrets.env``, the owner's ``gateway.token``, ``redis.password`` and the
  Matrix channel's keys); what is rebuilt or fetched again
  (logs, the local model, the embedded Redis's files, sign-in links, state) is not kept;
- ``workspace/`` and ``identities/``: the agent's workspace and every identity's own tree.

Without secrets, nothing that grants access leaves: those files stay out and every signed webhook's
secret is replaced in the copy by one nobody knows (rotate each hook after a restore). An archive is
read back and checked against its manifest before it is called written, and again before a restore
touches anything.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import io
import json
import os
import stat
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bus import schema, snapshot
from bus.errors import PincerError
from bus.presence import version
from bus.progress import Progress, Sink
from bus.snapshot import Scrub
from bus.streams import Bus

FORMAT = 1
KEYS = "redis.keys"
MANIFEST = "manifest.json"
DATA_FILES = ("config.yaml", "archive")  # the data dir's files every archive keeps (archive/: idle sessions)
SECRET_FILES = ("secrets.env", "gateway.token", "redis.password", "matrix")  # only with secrets
CHUNK = 1 << 20


class BackupError(PincerError):
    """An archive that cannot be written, read or restored; the message says why."""


@dataclass(frozen=True)
class Places:
    """Where the files an archive holds live on this machine."""

    data: Path
    workspace: Path
    identities: Path

    def roots(self) -> dict[str, Path]:
        return {"data": self.data, "workspace": self.workspace, "identities": self.identities}


def _sources(places: Places, *, secrets: bool) -> Iterator[tuple[str, Path, str]]:
    """(name in the archive, a root folder, the path beneath it) of every tree or file kept."""
    for name in (*DATA_FILES, *(SECRET_FILES if secrets else ())):
        yield f"data/{name}", places.data, name
    for root in ("workspace", "identities"):
        yield root, places.roots()[root], ""


def _add_tree(archive: tarfile.TarFile, name: str, root: Path, beneath: str) -> Iterator[dict[str, Any]]:
    """Add every regular file under ``root/beneath`` to ``archive``, opened by descriptor beneath ``root``
    and never through a link (the model writes in the workspaces while the backup runs: a file swapped
    for a link to something only Pincer may read must not be copied); each one's manifest entry."""
    try:
        top = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        yield from _add_entry(archive, name, top, beneath) if beneath else _add_dir(archive, name, top)
    finally:
        os.close(top)


def _add_entry(archive: tarfile.TarFile, name: str, parent: int, entry: str) -> Iterator[dict[str, Any]]:
    try:
        fd = os.open(entry, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=parent)
    except (FileNotFoundError, OSError) as exc:  # gone, or a link (ELOOP): not kept
        if isinstance(exc, FileNotFoundError) or exc.errno == errno.ELOOP:
            return
        raise
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            yield from _add_dir(archive, name, fd)
        elif stat.S_ISREG(info.st_mode):
            yield _add_file(archive, name, fd, info)
    finally:
        os.close(fd)


def _add_dir(archive: tarfile.TarFile, name: str, fd: int) -> Iterator[dict[str, Any]]:
    for entry in sorted(os.listdir(fd)):
        yield from _add_entry(archive, f"{name}/{entry}", fd, entry)


def _add_file(archive: tarfile.TarFile, name: str, fd: int, info: os.stat_result) -> dict[str, Any]:
    member = tarfile.TarInfo(name)
    member.size, member.mtime, member.mode = info.st_size, int(info.st_mtime), stat.S_IMODE(info.st_mode)
    reader = _Hashing(os.fdopen(os.dup(fd), "rb"))
    with reader.file:
        archive.addfile(member, reader)  # reads exactly st_size bytes (a file that shrank meanwhile fails)
    return {"name": name, "size": member.size, "sha256": reader.digest.hexdigest()}


class _Hashing:
    """A file read once into the archive, hashed as it goes (what is kept is what is hashed)."""

    def __init__(self, file: Any) -> None:
        self.file, self.digest = file, hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        chunk: bytes = self.file.read(size)
        self.digest.update(chunk)
        return chunk


async def write(url: str, prefix: str, places: Places, folder: Path, *, secrets: bool, scrub: Scrub | None,
                say: Callable[[str], None] = lambda _: None, sink: Sink | None = None) -> Path:
    """Take the archive into ``folder``; its path once it is written and verified. ``sink``: where the
    progress of the keys and the files is shown (bus/progress.py)."""
    with tempfile.TemporaryDirectory(prefix="pincer-backup-") as scratch:
        keys = Path(scratch) / KEYS
        say("taking Redis's snapshot")
        counting = Progress("copying Redis's keys", None, sink, noun="keys") if sink else None
        taken = await snapshot.take(url, prefix, keys, scrub=None if secrets else scrub, progress=counting)
        say(f"{taken.keys:,} keys under {prefix!r}; reading files")
        reading = Progress("archiving files", None, sink, unit="bytes") if sink else None
        return await asyncio.to_thread(_pack, keys, taken, prefix, places, folder, secrets, say, reading)


def _pack(keys: Path, taken: snapshot.Taken, prefix: str, places: Places, folder: Path, secrets: bool,
          say: Callable[[str], None], progress: Progress | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    stamp = datetime.now(UTC)
    final = folder / f"pincer-backup-{stamp:%Y%m%dT%H%M%SZ}.tar.gz"
    partial = folder / f".{final.name}.partial"
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as raw, tarfile.open(fileobj=raw, mode="w:gz") as archive:
            archive.add(keys, KEYS, recursive=False)
            files = []
            for name, root, beneath in _sources(places, secrets=secrets):
                for entry in _add_tree(archive, name, root, beneath):
                    files.append(entry)
                    if progress is not None:
                        progress.advance(entry["size"])
            if progress is not None:
                progress.finish()
            manifest = {
                "format": FORMAT, "pincer": version(), "schema": schema.VERSION, "prefix": prefix,
                "created_at": stamp.isoformat(), "redis": {"keys": taken.keys, "sha256": taken.sha256,
                                                           "server": taken.server},
                "secrets": secrets,
                "left_out": [] if secrets else [*(f"data/{n}" for n in SECRET_FILES), "signed webhooks' secrets"],
                "files": files,
            }
            body = json.dumps(manifest, indent=2).encode()
            info = tarfile.TarInfo(MANIFEST)  # last: it lists what the archive turned out to hold
            info.size, info.mtime, info.mode = len(body), int(time.time()), 0o600
            archive.addfile(info, io.BytesIO(body))
        say("verifying the archive")
        verify(partial)
        partial.rename(final)
    finally:
        partial.unlink(missing_ok=True)
    return final


def verify(path: Path) -> dict[str, Any]:
    """The manifest of the archive at ``path`` once every member matches it; BackupError otherwise."""
    try:
        with tarfile.open(path, mode="r:gz") as archive:
            manifest = _manifest(archive)
            expected = {f["name"]: f for f in manifest["files"]}
            seen = set()
            for member in archive:
                if member.name in (MANIFEST, KEYS):
                    continue
                entry = expected.get(member.name)
                if entry is None or not member.isfile():
                    raise BackupError(f"{path.name}: {member.name!r} is not in its manifest")
                if _member_sha256(archive, member) != entry["sha256"]:
                    raise BackupError(f"{path.name}: {member.name} does not match its manifest (damaged)")
                seen.add(member.name)
            if missing := sorted(set(expected) - seen):
                raise BackupError(f"{path.name}: missing {', '.join(missing[:5])}")
            keys = archive.getmember(KEYS)
            if _member_sha256(archive, keys) != manifest["redis"]["sha256"]:
                raise BackupError(f"{path.name}: the Redis snapshot does not match its manifest (damaged)")
    except (tarfile.TarError, OSError, EOFError, KeyError, ValueError) as exc:
        raise BackupError(f"{path.name}: not a readable Pincer backup ({exc})") from None
    return manifest


def _manifest(archive: tarfile.TarFile) -> dict[str, Any]:
    file = archive.extractfile(MANIFEST)
    if file is None:
        raise BackupError("the archive has no manifest")
    manifest: dict[str, Any] = json.load(file)
    if manifest.get("format") != FORMAT:
        raise BackupError(f"archive format {manifest.get('format')!r}; this release reads {FORMAT}")
    return manifest


def _member_sha256(archive: tarfile.TarFile, member: tarfile.TarInfo) -> str:
    file = archive.extractfile(member)
    if file is None:
        raise BackupError(f"{member.name} is not a file")
    digest = hashlib.sha256()
    while chunk := file.read(CHUNK):
        digest.update(chunk)
    return digest.hexdigest()


async def restore(path: Path, bus: Bus, places: Places, *, say: Callable[[str], None] = lambda _: None,
                  sink: Sink | None = None) -> dict[str, Any]:
    """Bring the archive at ``path`` into ``places`` and the Redis of ``bus``, all of which must be fresh;
    the manifest. Nothing is written before the archive checks out and every target is found empty."""
    manifest = await asyncio.to_thread(_checked, path, bus.keys.prefix, places)
    with tempfile.TemporaryDirectory(prefix="pincer-restore-") as scratch:
        keys = Path(scratch) / KEYS
        await asyncio.to_thread(_extract_keys, path, Path(scratch))
        say(f"restoring {manifest['redis']['keys']:,} keys under {bus.keys.prefix!r}")
        try:
            await snapshot.restore(bus, keys, progress=Progress(
                "restoring keys", manifest["redis"]["keys"], sink, noun="keys") if sink else None)
        except snapshot.SnapshotError as exc:
            raise BackupError(str(exc)) from None
    say(f"restoring {len(manifest['files']):,} files")
    await asyncio.to_thread(_extract_files, path, places)
    return manifest


def _checked(path: Path, prefix: str, places: Places) -> dict[str, Any]:
    """The manifest, once the archive verifies, fits this release and prefix, and every target is fresh."""
    manifest = verify(path)
    if manifest["prefix"] != prefix:
        raise BackupError(f"the archive holds prefix {manifest['prefix']!r}, the configured one is "
                          f"{prefix!r}: set redis.prefix to {manifest['prefix']!r} to restore it")
    if manifest["schema"] > schema.VERSION:
        raise BackupError(f"the archive's data has layout version {manifest['schema']}; this release knows up "
                          f"to {schema.VERSION}: restore it with the release that wrote it ({manifest['pincer']})")
    roots = places.roots()
    for entry in manifest["files"]:
        root, _, rest = entry["name"].partition("/")
        if (roots[root] / rest).exists():
            raise BackupError(f"{roots[root] / rest} exists: restore into a fresh data dir and empty workspaces")
    for name in ("workspace", "identities"):
        if roots[name].is_dir() and any(roots[name].iterdir()):
            raise BackupError(f"{roots[name]} is not empty: restore into empty workspaces")
    return manifest


def _extract_keys(path: Path, into: Path) -> None:
    with tarfile.open(path, "r:gz") as archive:
        archive.extract(KEYS, into, filter="data")


def _extract_files(path: Path, places: Places) -> None:
    roots = places.roots()
    mask = os.umask(0o077)  # folders the archive does not list are made private, as Pincer makes its own
    try:
        with tarfile.open(path, "r:gz") as archive:
            for member in archive:
                root, _, rest = member.name.partition("/")
                if member.name in (MANIFEST, KEYS) or root not in roots:
                    continue
                roots[root].mkdir(parents=True, exist_ok=True, mode=0o700)
                # "data": no link, device, absolute path or ".." leaves the target
                archive.extract(member.replace(name=rest), roots[root], filter="data")
    finally:
        os.umask(mask)


def prune(folder: Path, keep: int) -> list[Path]:
    """Remove all but the newest ``keep`` archives in ``folder``; the ones removed."""
    archives = sorted(folder.glob("pincer-backup-*.tar.gz"))
    gone = archives[:-keep] if keep > 0 else archives
    for old in gone:
        old.unlink(missing_ok=True)
    return gone
