"""The workspace boundary: open paths beneath the workspace root, race-free.

Directories are opened with openat2 ``RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
RESOLVE_NO_MAGICLINKS`` where the kernel has it, else walked one component at
a time from a directory descriptor with ``O_NOFOLLOW``; the last component is
opened relative to its directory with ``O_NOFOLLOW``. So a symlink swapped in
mid-call cannot lead outside (a ``realpath`` check followed by ``open`` can
be raced). ``..``, absolute paths
outside the root, symlinks and multiply-linked files are refused.

This is the one boundary for every role that touches workspace files: Hands'
tools, and the channels (uploads saved, ``[attach: PATH]`` read) outside the
sandbox. Files are made 0600 and directories 0700: a workspace is its
identity's alone (``Workspaces``: whose tree a call sees), but for the
folders the operator shares into it (``shared``): a path whose first
component names one is served from that folder, read-only unless it was
shared writable.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from bus.errors import PincerError
from bus.openat2 import openat2
from bus.protocol import ErrorCode


class PathRefused(PincerError):
    """A workspace path refused, and why: a tool's call reports it as its error (``hands.errors``), a channel
    tells the person."""

    def __init__(self, code: ErrorCode, message: str, *, suggestions: list[str] | None = None,
                 recoverable: bool | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.suggestions, self.recoverable = code, message, suggestions or [], recoverable


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


FILE_MODE, DIR_MODE = 0o600, 0o700  # a workspace is one identity's: nobody else on the machine reads it
NAME_LIMIT = 10_000  # "name-1.txt" ... tried before a new file's name is given up on


@dataclass(frozen=True)
class Shared:
    """A folder of another workspace shown in this one under its own name."""

    tree: Workspace
    writable: bool = False


class Workspace:
    def __init__(self, root: Path, *, owner: tuple[int, int] | None = None,
                 shared: dict[str, Shared] | None = None) -> None:
        self.root = root.expanduser().resolve()
        # Files and directories the tools create are given to the sandbox's uid, so
        # sandboxed commands can change them too (only set when we run as root).
        self.owner = owner
        self.shared = shared or {}

    def _routed(self, parts: list[str], *, writing: bool) -> tuple[Workspace, str] | None:
        """Where a path in a shared folder is served from (the folder, the rest of the path); None: here."""
        if not parts or parts[0] not in self.shared:
            return None
        folder = self.shared[parts[0]]
        if writing and not folder.writable:
            raise PathRefused(ErrorCode.PERMISSION_DENIED,
                              f"{parts[0]}/ is a folder the agent's owners share read-only "
                              f"(hands.shared_folders.{parts[0]}.writable); write in a folder of your own",
                              recoverable=True)
        return folder.tree, "/".join(parts[1:]) or "."

    def ensure(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
        if self.owner:
            os.chown(self.root, *self.owner)

    @contextmanager
    def create_new(self, folder: str, name: str) -> Iterator[tuple[str, int]]:
        """A new file in ``folder`` (made if missing), never one that existed: ``name``, else ``stem-1.ext``
        and so on; its path relative to the root and a descriptor open for writing.

        ``O_EXCL | O_NOFOLLOW`` beneath a directory walked without links: whatever was planted at a name
        (a link to ``~/.ssh``, a FIFO), the bytes go only into a file this call made."""
        pure = PurePosixPath(name)
        if name in ("", ".", "..") or pure.name != name:
            raise PathRefused(ErrorCode.INVALID_ARGUMENTS, f"{name!r} is not a file name")
        if routed := self._routed(self.parts(folder), writing=True):
            with routed[0].create_new(routed[1], name) as (made, fd):
                yield "/".join([self.parts(folder)[0], made]), fd
            return
        parent = self._walk(self.parts(folder), create=True)
        try:
            for n in range(NAME_LIMIT):
                candidate = name if n == 0 else f"{pure.stem}-{n}{pure.suffix}"
                try:
                    fd = os.open(candidate, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                                 FILE_MODE, dir_fd=parent)
                except FileExistsError:
                    continue
                except OSError as exc:
                    raise self._os_failure(exc, f"{folder}/{candidate}") from None
                break
            else:
                raise PathRefused(ErrorCode.RESOURCE_EXHAUSTED, f"{folder!r} holds {NAME_LIMIT} files named "
                                  f"like {name!r}; remove some")
        finally:
            os.close(parent)
        try:
            if self.owner:
                os.fchown(fd, *self.owner)
            yield "/".join([*self.parts(folder), candidate]), fd
        finally:
            os.close(fd)

    def read_bytes(self, path: str, *, limit: int) -> bytes:
        """The regular file at ``path`` whole, read from the descriptor that was checked (no link followed at
        any component); ``RESOURCE_EXHAUSTED`` past ``limit`` bytes."""
        with self.open_file(path, os.O_RDONLY) as fd:
            size = os.fstat(fd).st_size
            if size > limit:
                raise PathRefused(ErrorCode.RESOURCE_EXHAUSTED, f"{path!r} is {size} bytes, over the {limit}")
            chunks, total = [], 0
            while chunk := os.read(fd, 1 << 20):
                total += len(chunk)
                if total > limit:  # grew since the fstat
                    raise PathRefused(ErrorCode.RESOURCE_EXHAUSTED, f"{path!r} is over {limit} bytes")
                chunks.append(chunk)
            return b"".join(chunks)

    def parts(self, path: str) -> list[str]:
        """The path's components relative to the root, or ``PERMISSION_DENIED``."""
        if "\x00" in path:
            raise PathRefused(ErrorCode.INVALID_ARGUMENTS, "the path contains a NUL byte")
        pure = PurePosixPath(path)
        if pure.is_absolute():
            try:
                pure = pure.relative_to(self.root)
            except ValueError:
                raise self._outside(path) from None
        parts = [p for p in pure.parts if p not in ("", ".")]
        if ".." in parts:
            raise self._outside(path)
        return parts

    @contextmanager
    def open_dir(self, path: str, *, create: bool = False) -> Iterator[int]:
        """A descriptor of the directory at ``path`` (``.`` is the root)."""
        if routed := self._routed(self.parts(path), writing=create):
            with routed[0].open_dir(routed[1], create=create) as shared_fd:
                yield shared_fd
            return
        fd = self._walk(self.parts(path), create=create)
        try:
            yield fd
        finally:
            os.close(fd)

    @contextmanager
    def open_file(self, path: str, flags: int, *, create_dirs: bool = False) -> Iterator[int]:
        """A descriptor of the regular file at ``path``, opened with ``flags`` (never following a symlink).

        Everything is decided before anything changes: the open never blocks (a FIFO would hold
        the thread for ever) and never truncates; only a regular file with one link is then
        truncated (``O_TRUNC``) or given to the sandbox's uid. A refused call changes nothing.
        """
        parts = self.parts(path)
        if not parts:
            raise PathRefused(ErrorCode.INVALID_ARGUMENTS, f"{path!r} is the workspace directory, not a file")
        writing = bool(flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND))
        if routed := self._routed(parts, writing=writing):
            if routed[1] == ".":
                raise PathRefused(ErrorCode.INVALID_ARGUMENTS, f"{path!r} is a shared folder, not a file",
                                  suggestions=["list_directory lists it"], recoverable=True)
            with routed[0].open_file(routed[1], flags, create_dirs=create_dirs) as shared_fd:
                yield shared_fd
            return
        parent = self._walk(parts[:-1], create=create_dirs)
        created = False
        try:
            open_flags = (flags & ~os.O_TRUNC) | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
            if flags & os.O_CREAT:
                try:  # did this call make the file? Only then is it ours to give away
                    fd = os.open(parts[-1], open_flags | os.O_EXCL, FILE_MODE, dir_fd=parent)
                    created = True
                except FileExistsError:
                    fd = os.open(parts[-1], open_flags & ~os.O_CREAT, dir_fd=parent)
            else:
                fd = os.open(parts[-1], open_flags, dir_fd=parent)
        except OSError as exc:
            raise self._os_failure(exc, path) from None
        finally:
            os.close(parent)
        try:
            info = os.fstat(fd)
            if stat.S_ISDIR(info.st_mode):
                raise PathRefused(ErrorCode.INVALID_ARGUMENTS, f"{path!r} is a directory, not a file",
                                  suggestions=["list_directory lists it"], recoverable=True)
            if not stat.S_ISREG(info.st_mode):
                raise PathRefused(ErrorCode.PERMISSION_DENIED, f"{path!r} is not a regular file ({_kind(info)}); "
                                  "file tools read and write regular files only")
            if info.st_nlink > 1:
                raise PathRefused(
                    ErrorCode.PERMISSION_DENIED,
                    f"{path!r} is a hard link shared with another path; tools only use files with one link",
                    suggestions=["copy the file into the workspace instead of linking it"],
                )
            os.set_blocking(fd, True)
            if flags & os.O_TRUNC:
                os.ftruncate(fd, 0)
            if self.owner and created:
                os.fchown(fd, *self.owner)
            yield fd
        finally:
            os.close(fd)

    def _walk(self, parts: list[str], *, create: bool) -> int:
        if not create:
            fd = self._beneath(parts)
            if fd is not None:
                return fd
        fd = self._open_root()
        try:
            for i, part in enumerate(parts):
                if create:
                    try:
                        os.mkdir(part, DIR_MODE, dir_fd=fd)
                        if self.owner:
                            os.chown(part, *self.owner, dir_fd=fd, follow_symlinks=False)
                    except FileExistsError:
                        pass
                try:
                    child = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except OSError as exc:
                    if exc.errno == errno.ENOTDIR and _is_symlink(part, fd):
                        exc = OSError(errno.ELOOP, "symbolic link")  # O_DIRECTORY reports a link as ENOTDIR
                    raise self._os_failure(exc, "/".join(parts[: i + 1])) from None
                os.close(fd)
                fd = child
            return fd
        except BaseException:
            os.close(fd)
            raise

    def _beneath(self, parts: list[str]) -> int | None:
        """The directory at ``parts`` via openat2 (kernel-enforced), or None to walk instead."""
        root = self._open_root()
        try:
            return openat2(root, "/".join(parts) or ".", os.O_RDONLY | os.O_DIRECTORY)
        except OSError as exc:
            if exc.errno == errno.EXDEV:
                raise self._outside("/".join(parts)) from None
            raise self._os_failure(exc, "/".join(parts)) from None
        finally:
            os.close(root)

    def _open_root(self) -> int:
        """The root's descriptor; a root that became a link (a shared folder swapped after start) is refused."""
        try:
            return os.open(self.root, _DIR_FLAGS)
        except OSError as exc:
            if exc.errno in (errno.ENOTDIR, errno.ELOOP):
                raise PathRefused(ErrorCode.PERMISSION_DENIED, f"{self.root} is no longer a directory of its own "
                                  "(a link or a file took its place); nothing in it is reached") from None
            raise self._os_failure(exc, ".") from None

    def _outside(self, path: str) -> PathRefused:
        return PathRefused(
            ErrorCode.PERMISSION_DENIED,
            f"{path!r} is outside the workspace; tools only reach files beneath {self.root}",
            suggestions=["use a path relative to the workspace, without '..'"],
        )

    def _os_failure(self, exc: OSError, path: str) -> PathRefused | OSError:
        if exc.errno in (errno.ENXIO, errno.ENODEV):  # a FIFO with no reader, a device with no driver
            return PathRefused(ErrorCode.PERMISSION_DENIED, f"{path!r} is not a regular file; file tools read and "
                               "write regular files only")
        if exc.errno == errno.ELOOP:
            return PathRefused(
                ErrorCode.PERMISSION_DENIED,
                f"{path!r} is a symbolic link; tools do not follow links",
                suggestions=["use the real path of the file inside the workspace"],
            )
        if isinstance(exc, FileNotFoundError):
            return PathRefused(
                ErrorCode.FILE_NOT_FOUND, f"{path!r} does not exist in the workspace",
                suggestions=["list_directory shows what exists"], recoverable=True,
            )
        if isinstance(exc, NotADirectoryError):
            return PathRefused(
                ErrorCode.FILE_NOT_FOUND, f"{path!r}: a part of the path is not a directory", recoverable=True,
            )
        exc.filename = exc.filename or path
        return exc


def _kind(info: os.stat_result) -> str:
    mode = info.st_mode
    return ("a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "a socket"
            if stat.S_ISSOCK(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a file")


def _is_symlink(name: str, dir_fd: int) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False
