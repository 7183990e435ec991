"""Freed memory goes back to the system: a worker's RSS follows what it holds, not its highest peak."""

from __future__ import annotations

import subprocess
import sys

import msgpack
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


# Minor page faults of a settled process packing 2,000 small messages one way or the other: a block
# mapped afresh for each faults at least once when first written.
PACKING = """
import sys, msgpack
from bus import heap
from bus.codec import pack
heap.settle()
def faults():
    return int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[7])
one = pack if sys.argv[1] == "pack" else lambda value: msgpack.packb(value, use_bin_type=True)
one({"warm": 1})
before = faults()
for n in range(2000):
    one({"call_id": str(n), "success": True})
print(faults() - before)
"""


@pytest.mark.parametrize("way", ["pack", "packb"])
def test_packing_a_small_message_maps_no_block_in_a_settled_process(way: str) -> None:
    out = subprocess.run([sys.executable, "-c", PACKING, way], capture_output=True, text=True, check=True)
    faults = int(out.stdout)
    if way == "packb":  # msgpack's own first buffer is as big as the threshold: why bus.codec.pack exists
        assert faults >= 2000
    else:
        assert faults < 200


def test_pack_grows_past_its_first_buffer() -> None:
    from bus.codec import pack

    big = {"data": "x" * 3_000_000, "items": list(range(50_000))}
    assert msgpack.unpackb(pack(big), raw=False) == big
    assert msgpack.unpackb(pack(["text", b"raw"], bin_type=False), raw=True) == [b"text", b"raw"]
