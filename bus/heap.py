"""Freed memory handed back to the system (glibc's malloc; elsewhere these do nothing).

A long-lived process whose work comes in peaks (a Hands worker embedding a batch of chunks,
growing a scope's matrix) otherwise keeps its heap at the highest peak: glibc raises its
threshold for mapping big blocks each time one is freed, so later big blocks come from the
heap, and the heap's free pages stay resident. The soak (bench/soak.py) saw a Hands worker's
RSS climb in steps of 20-30 MB while the memory in use stayed level.

The price: a block of at least ``MAP_FROM`` made and freed per message maps and unmaps it each
time (~10 µs). msgpack's Packer starts with exactly 256 KiB, so packing goes through
``bus.codec.pack``, which starts it small.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

M_MMAP_THRESHOLD = -3  # mallopt's parameter (malloc.h)
MAP_FROM = 256 * 1024  # blocks this big or bigger are mapped and unmapped whole, never kept in the heap


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None


_LIBC = _libc()


def settle() -> bool:
    """Fix the threshold for mapping big blocks (setting it stops glibc from raising it); whether it took."""
    if _LIBC is None:
        return False
    return bool(_LIBC.mallopt(M_MMAP_THRESHOLD, MAP_FROM))


def release() -> bool:
    """The heap's free pages back to the system now; whether any were."""
    return _LIBC is not None and bool(_LIBC.malloc_trim(0))
