"""The private internals Pincer relies on, checked at the lowest versions its pins allow.

The main run installs the newest versions the pins allow (a fresh resolve);
this one makes a venv with the oldest of the libraries whose internals are
used (redis-py, hiredis through it, pydantic, msgpack) and runs the same
checks there, so a pin's floor is a fact, not a hope.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.e2e

LOWEST = ["redis[hiredis]==5.2.*", "pydantic==2.7.*", "msgpack==1.0.*", "pytest>=8,<10", "pytest-asyncio>=0.24,<2"]


def test_private_internals_hold_at_the_lowest_pins(tmp_path: Path) -> None:
    uv = shutil.which("uv") or str(Path(sys.executable).parent / "uv")
    venv = tmp_path / "lowest"
    subprocess.run([uv, "venv", "--quiet", "--python", sys.executable, str(venv)], check=True, timeout=120)
    subprocess.run([uv, "pip", "install", "--quiet", "--python", str(venv / "bin" / "python"), *LOWEST],
                   check=True, timeout=600)
    shutil.copy(ROOT / "tests" / "unit" / "test_private_internals.py", tmp_path / "test_private_internals.py")
    ran = subprocess.run([str(venv / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "-o", "asyncio_mode=auto", "-W", "ignore::DeprecationWarning", "test_private_internals.py"],
                         cwd=tmp_path, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
                         capture_output=True, text=True, timeout=300)
    versions = subprocess.run([str(venv / "bin" / "python"), "-c",
                               "import redis, pydantic, msgpack; print(redis.__version__, pydantic.VERSION, "
                               "'.'.join(map(str, msgpack.version)))"], capture_output=True, text=True).stdout
    assert versions.startswith("5.2.") and " 2.7." in versions and " 1.0." in versions, versions
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "passed" in ran.stdout and "failed" not in ran.stdout
