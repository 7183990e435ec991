"""openat2(2) with RESOLVE_BENEATH: the kernel resolves a path strictly beneath a directory.

One syscall instead of a walk, with no symlink (or /proc magic link) followed
and no way out through ``..``. ``None`` where the kernel lacks it (Linux < 5.6)
or a seccomp policy hides it; callers then walk the path themselves.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform

_SYSCALL = {"x86_64": 437, "aarch64": 437, "arm64": 437}.get(platform.machine())
RESOLVE_NO_XDEV, RESOLVE_NO_MAGICLINKS, RESOLVE_NO_SYMLINKS, RESOLVE_BENEATH = 0x01, 0x02, 0x04, 0x08
STRICT = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_libc = ctypes.CDLL(None, use_errno=True)
_usable = _SYSCALL is not None


def openat2(dir_fd: int, path: str, flags: int, mode: int = 0, resolve: int = STRICT) -> int | None:
    """A new descriptor, or ``None`` when openat2 is not available; OSError as open(2) raises it."""
    global _usable
    if not _usable:
        return None
    how = _OpenHow(flags=flags | os.O_CLOEXEC, mode=mode if flags & os.O_CREAT else 0, resolve=resolve)
    fd = _libc.syscall(_SYSCALL, dir_fd, os.fsencode(path), ctypes.byref(how), ctypes.sizeof(how))
    if fd >= 0:
        return int(fd)
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EPERM, errno.E2BIG):
        _usable = False  # remembered: walk from now on
        return None
    raise OSError(err, os.strerror(err), path)
