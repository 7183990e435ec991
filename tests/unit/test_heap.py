"""Freed memory goes back to the system: a worker's RSS follows what it holds, not its highest peak."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bus import heap

pytestmark = pytest.mark.skipif(heap._LIBC is None, reason="not glibc: settle and release do nothing by design")

# A peak of blocks, each followed by a small object that stays (as an index's rows outlive a batch's buffers),
# then the blocks freed: RSS before, at the peak and after, in MB, from a process of its own.
PEAK = """
import sys
from bus import heap
def rss():
    return int(next(l for l in open("/proc/self/status") if l.startswith("VmRSS")).split()[1]) / 1024
if sys.argv[1] == "settle":
    heap.settle()
size = int(sys.argv[2])
start = rss()
blocks, pins = [], []
for n in range(400):
    blocks.append(bytearray(size))
    pins.append(bytearray(600))
peak = rss()
del blocks
if sys.argv[1] == "release":
    heap.release()
print(start, peak, rss())
"""


def run_peak(mode: str, size: int) -> tuple[float, float, float]:
    out = subprocess.run([sys.executable, "-c", PEAK, mode, str(size)], capture_output=True, text=True, check=True)
    start, peak, after = map(float, out.stdout.split())
    assert peak - start > 0.6 * 400 * size / 2**20  # the peak really was resident
    return start, peak, after


def test_big_blocks_leave_the_process_when_freed_once_settled() -> None:
    start, peak, after = run_peak("settle", 300_000)
    assert after - start < 0.2 * (peak - start)


def test_release_hands_back_the_free_pages_between_live_objects() -> None:
    start, peak, after = run_peak("release", 100_000)  # below any mapping threshold: these come from the heap
    assert after - start < 0.2 * (peak - start)


def test_without_either_the_freed_peak_stays_resident() -> None:
    """The case the two exist for (if glibc ever returns these pages itself, this says so)."""
    start, peak, after = run_peak("none", 100_000)
    assert after - start > 0.5 * (peak - start)
