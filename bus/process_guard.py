"""Child-process hygiene shared by everything that starts other processes: die with the parent, stay undumpable."""

from __future__ import annotations

import ctypes
import signal

_PR_SET_PDEATHSIG, _PR_GET_DUMPABLE, _PR_SET_DUMPABLE = 1, 3, 4


def die_with_parent() -> None:
    """preexec_fn: the kernel sends the child SIGTERM if its parent dies, so nothing is orphaned."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def make_undumpable() -> bool:
    """Close this process's /proc files (environ, mem, maps) and ptrace to other processes of its own
    uid: a command run as the same user (the rlimits tier without root) cannot read its secrets."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
    return bool(libc.prctl(_PR_GET_DUMPABLE, 0, 0, 0, 0) == 0)
