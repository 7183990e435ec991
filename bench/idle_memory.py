"""Resident memory of an idle `pincer up`, per process: supervisor, embedded Redis, Gateway, Brain, Hands.

Starts `pincer up --detach` on a private data dir with an `openai/` model on
the scripted server (so the Brain's road is the one most people take), lets
it settle after one turn, reads VmRSS of every process from /proc, stops it.

Run: .venv/bin/python bench/idle_memory.py [--model openai/scripted] [--direct true|false]
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.gateway_turns import ScriptedModel  # noqa: E402
from bus.redis_server import free_port  # noqa: E402
from gateway.runtime.daemon import StateFile, resident_mb  # noqa: E402


def children_of(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="openai/scripted")
    parser.add_argument("--direct", default="true", choices=["true", "false"])
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="pincer-bench-mem-"))
    llm = ScriptedModel()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PINCER_")}
    env.update({"PINCER_DATA_DIR": str(tmp / "data"), "PINCER_WORKSPACE": str(tmp / "ws"),
                "PINCER_MODEL": args.model, "PINCER_LLM_API_BASE": llm.api_base, "PINCER_LLM_API_KEY": "sk",
                "PINCER_BRAIN__OPENAI_DIRECT": args.direct, "PINCER_GATEWAY_PORT": str(free_port()),
                "HOME": str(tmp)})
    (tmp / "ws").mkdir()
    pincer = [sys.executable, "-m", "gateway"]
    try:
        subprocess.run([*pincer, "up", "--detach"], env=env, check=True, cwd=tmp, capture_output=True)
        subprocess.run([*pincer, "chat", "-m", "hello"], env=env, check=True, cwd=tmp, capture_output=True)
        time.sleep(5)  # let it settle: what an idle daemon holds
        state = StateFile(tmp / "data").read()
        assert state is not None
        rows = [("supervisor", state.supervisor.pid), *((r, p.pid) for r, p in state.children.items())]
        rows += [("redis-server", pid) for pid in children_of(state.supervisor.pid)
                 if "redis" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")]
        sizes = [(role, resident_mb(pid) or 0.0) for role, pid in rows]
    finally:
        subprocess.run([*pincer, "stop"], env=env, cwd=tmp, capture_output=True)
        llm.stop()
    print(f"\n{platform.node()} · Python {platform.python_version()} · {time.strftime('%Y-%m-%d')} · "
          f"model {args.model}, openai_direct {args.direct}\n")
    print("| process | resident MB |\n|---|---|")
    for role, mb in sizes:
        print(f"| {role} | {mb:.0f} |")
    print(f"| **all** | **{sum(mb for _, mb in sizes):.0f}** |")


if __name__ == "__main__":
    main()
