"""Real MCP servers from the package registries, installed once per machine where the sandbox uid can read them."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

# Not under pytest's temp dirs (root's alone) nor /root: the sandbox uid must read them.
CACHE = Path("/var/tmp/pincer-test-mcp")
EVERYTHING = ("@modelcontextprotocol/server-everything", "2026.8.31")  # Node; stdio and streamable HTTP
TIME = ("mcp-server-time", "2026.10.19")  # Python; stdio


def _readable(path: Path) -> None:
    subprocess.run(["chmod", "-R", "a+rX", str(path)], check=True)
    for parent in [path, *path.parents]:
        if parent == Path("/"):
            break
        parent.chmod(parent.stat().st_mode | 0o055)


def everything_server() -> Path:
    """The entry script of the reference Node server (``node <it> stdio`` or ``streamableHttp``)."""
    name, version = EVERYTHING
    where = CACHE / f"everything-{version}"
    entry = where / "node_modules" / name / "dist" / "index.js"
    if not entry.exists():
        where.mkdir(parents=True, exist_ok=True)
        subprocess.run(["npm", "install", "--silent", "--no-audit", "--no-fund", "--prefix", str(where),
                        f"{name}@{version}"], check=True, timeout=600)
    _readable(where)
    return entry


def time_server() -> Path:
    """A venv on the system's python3 (the sandbox mounts /usr, not pyenv's /root) holding the time server."""
    name, version = TIME
    venv = CACHE / f"time-{version}"
    if not (venv / "bin" / "mcp-server-time").exists():
        shutil.rmtree(venv, ignore_errors=True)
        uv = shutil.which("uv") or str(Path(os.environ.get("VIRTUAL_ENV", ".venv")) / "bin" / "uv")
        subprocess.run([uv, "venv", "--quiet", "--python", "/usr/bin/python3", str(venv)], check=True, timeout=300)
        subprocess.run([uv, "pip", "install", "--quiet", "--python", str(venv / "bin" / "python"),
                        f"{name}=={version}"], check=True, timeout=600)
    _readable(venv)
    return venv
