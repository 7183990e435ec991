"""Which sandbox tier a machine gives, decided once per worker by trying each (best first)."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
from enum import StrEnum
from pathlib import Path

from hands.config import SandboxSettings

log = logging.getLogger("hands.sandbox")
# The landlock tier's launcher, run as text (the sandbox uid needs no access to our files).
SHIM_SOURCE = (Path(__file__).parent / "shim.py").read_text()


class Tier(StrEnum):
    """How commands are contained, best first; reported in every result (``sandbox``)."""

    BWRAP = "bwrap"
    LANDLOCK = "landlock"
    RLIMITS = "rlimits"


def choose_tier(settings: SandboxSettings, *, as_root: bool) -> Tier:
    """The best tier this machine offers that the settings allow (``rlimits`` when nothing else works)."""
    wanted = settings.tier
    if wanted in ("auto", "bwrap") and shutil.which("bwrap") and _bwrap_works(settings, as_root=as_root):
        return Tier.BWRAP
    if wanted in ("auto", "landlock") and _landlock_works(settings, as_root=as_root):
        return Tier.LANDLOCK
    if wanted != "auto" and wanted != "rlimits":
        log.warning("hands.sandbox.tier is %s but it does not work here; falling back to rlimits", wanted)
    return Tier.RLIMITS


def _landlock_works(settings: SandboxSettings, *, as_root: bool) -> bool:
    probe_dir = Path(tempfile.mkdtemp(prefix="pincer-probe-"))
    try:
        probe_dir.chmod(0o755)
        if as_root:
            os.chown(probe_dir, settings.uid, settings.gid)
        drop = ["setpriv", f"--reuid={settings.uid}", f"--regid={settings.gid}", "--clear-groups"] \
            if as_root else []
        seccomp = seccomp_fd("landlock")
        try:
            done = subprocess.run([*drop, *shim(), str(probe_dir), ".", str(seccomp), "--", "/usr/bin/true"],
                                  capture_output=True, timeout=20, stdin=subprocess.DEVNULL, pass_fds=(seccomp,))
        finally:
            os.close(seccomp)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("landlock probe failed: %s", exc)
        return False
    finally:
        shutil.rmtree(probe_dir, ignore_errors=True)
    if done.returncode != 0:
        log.warning("landlock tier unusable here: %s", done.stderr.decode(errors="replace").strip())
    return done.returncode == 0


def _bwrap_works(settings: SandboxSettings, *, as_root: bool) -> bool:
    probe = [*(["setpriv", f"--reuid={settings.uid}", f"--regid={settings.gid}", "--clear-groups"]
               if as_root else []),
             "bwrap", "--unshare-all", "--unshare-user", "--die-with-parent", "--ro-bind", "/usr", "/usr",
             "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
             "--", "/usr/bin/true"]
    try:
        done = subprocess.run(probe, capture_output=True, timeout=10, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("bubblewrap probe failed: %s", exc)
        return False
    if done.returncode != 0:
        log.warning("bubblewrap is installed but unusable here: %s", done.stderr.decode(errors="replace").strip())
    return done.returncode == 0


def shim() -> list[str]:
    """The landlock tier's launcher, passed as text so the sandbox uid needs no access to our files."""
    python = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable
    return [python, "-I", "-c", SHIM_SOURCE]


def seccomp_fd(tier: str, *, network: bool = False) -> int:
    from hands.sandbox.seccomp import bpf_fd

    return bpf_fd(tier=tier, network=network)
