"""Process hardening helpers (bus/process_guard.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path


def test_a_hands_process_closes_its_proc_files_to_its_own_uid() -> None:
    import sys

    probe = ("from bus.process_guard import make_undumpable; import ctypes; ok = make_undumpable(); "
             "print(ok, ctypes.CDLL(None).prctl(3, 0, 0, 0, 0))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.stdout.split() == ["True", "0"]  # PR_GET_DUMPABLE: 0, so /proc/<pid>/environ is root's
