"""The workspace boundary: open paths beneath the workspace root, race-free.

Directories are opened with openat2 ``RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
RESOLVE_NO_MAGICLINKS`` where the kernel has it, else walked one component at
a time from a directory descriptor with ``O_NOFOLLOW``; the last component is
opened relative to its directory with ``O_NOFOLLOW``. So a symlink swapped in
mid-call cannot lead outside (a ``realpath`` check followed by ``open`` can
be raced). ``..``, absolute paths
outside the root, symlinks and multiply-linked files are refused.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath

from bus.protocol import ErrorCode
from hands.errors import ToolFailure
from hands.openat2 import openat2

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class Workspace:
    def __init__(self, root: Path, *, owner: tuple[int, int] | None = None) -> None:
        self.root = root.expanduser().resolve()
        # Files and directories the tools create are given to the sandbox's uid, so
        # sandboxed commands can change them too (only set when we run as root).
        self.owner = owner

    def ensure(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        if self.owner:
            os.chown(self.root, *self.owner)

    def parts(self, path: str) -> list[str]:
        """The path's components relative to the root, or ``PERMISSION_DENIED``."""
        if "\x00" in path:
            raise ToolFailure(ErrorCode.INVALID_ARGUMENTS, "the path contains a NUL byte")
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
            raise ToolFailure(ErrorCode.INVALID_ARGUMENTS, f"{path!r} is the workspace directory, not a file")
        parent = self._walk(parts[:-1], create=create_dirs)
        created = False
        try:
            open_flags = (flags & ~os.O_TRUNC) | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
            if flags & os.O_CREAT:
                try:  # did this call make the file? Only then is it ours to give away
                    fd = os.open(parts[-1], open_flags | os.O_EXCL, 0o644, dir_fd=parent)
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
                raise ToolFailure(ErrorCode.INVALID_ARGUMENTS, f"{path!r} is a directory, not a file",
                                  suggestions=["list_directory lists it"], recoverable=True)
            if not stat.S_ISREG(info.st_mode):
                raise ToolFailure(ErrorCode.PERMISSION_DENIED, f"{path!r} is not a regular file ({_kind(info)}); "
                                  "file tools read and write regular files only")
            if info.st_nlink > 1:
                raise ToolFailure(
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
        fd = os.open(self.root, _DIR_FLAGS)
        try:
            for i, part in enumerate(parts):
                if create:
                    try:
                        os.mkdir(part, 0o755, dir_fd=fd)
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
        root = os.open(self.root, _DIR_FLAGS)
        try:
            return openat2(root, "/".join(parts) or ".", os.O_RDONLY | os.O_DIRECTORY)
        except OSError as exc:
            if exc.errno == errno.EXDEV:
                raise self._outside("/".join(parts)) from None
            raise self._os_failure(exc, "/".join(parts)) from None
        finally:
            os.close(root)

    def _outside(self, path: str) -> ToolFailure:
        return ToolFailure(
            ErrorCode.PERMISSION_DENIED,
            f"{path!r} is outside the workspace; tools only reach files beneath {self.root}",
            suggestions=["use a path relative to the workspace, without '..'"],
        )

    def _os_failure(self, exc: OSError, path: str) -> ToolFailure | OSError:
        if exc.errno in (errno.ENXIO, errno.ENODEV):  # a FIFO with no reader, a device with no driver
            return ToolFailure(ErrorCode.PERMISSION_DENIED, f"{path!r} is not a regular file; file tools read and "
                               "write regular files only")
        if exc.errno == errno.ELOOP:
            return ToolFailure(
                ErrorCode.PERMISSION_DENIED,
                f"{path!r} is a symbolic link; tools do not follow links",
                suggestions=["use the real path of the file inside the workspace"],
            )
        if isinstance(exc, FileNotFoundError):
            return ToolFailure(
                ErrorCode.FILE_NOT_FOUND, f"{path!r} does not exist in the workspace",
                suggestions=["list_directory shows what exists"], recoverable=True,
            )
        if isinstance(exc, NotADirectoryError):
            return ToolFailure(
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
