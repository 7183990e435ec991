"""Resident memory of an idle `pincer up`, per process: supervisor, embedded Redis, Gateway, Brain, Hands.

Starts `pincer up --detach` on a private data dir with an `openai/` model on
the scripted server (so the Brain's road is the one most people take), lets
it settle after one turn, reads VmRSS and PSS of every process from /proc, stops it. With ``--turns N`` it
then sends N more turns over the native endpoint (each session 12 turns long, one turn in four a
`read_file` call) and reads every process again: what a Brain holds once it has worked.

Run: .venv/bin/python bench/idle_memory.py [--model openai/scripted] [--direct true|false] [--turns 300]
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

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.gateway_turns import FILE_TURN, ScriptedModel  # noqa: E402
from bus.redis_server import free_port  # noqa: E402
from gateway.runtime.daemon import StateFile  # noqa: E402
from gateway.runtime.procinfo import proportional_mb, resident_mb  # noqa: E402
from gateway.tokens import read_owner_token  # noqa: E402


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


def sizes_of(data_dir: Path) -> list[tuple[str, float, float]]:
    """Each process: its role, RSS and PSS (MB)."""
    state = StateFile(data_dir).read()
    assert state is not None
    rows = [("supervisor", state.supervisor.pid), *((r, p.pid) for r, p in state.children.items())]
    rows += [("redis-server", pid) for pid in children_of(state.supervisor.pid)
             if "redis" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")]
    return [(role, resident_mb(pid) or 0.0, proportional_mb(pid) or 0.0) for role, pid in rows]


def send_turns(url: str, token: str, turns: int) -> None:
    """``turns`` turns, one after another: sessions of 12 turns, every fourth turn a tool call."""
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60) as client:
        for n in range(turns):
            text = FILE_TURN if n % 4 == 3 else f"hello, turn {n}"
            response = client.post(f"/v1/sessions/mem-{n // 12}/messages", json={"text": text})
            assert response.status_code == 200, response.text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="openai/scripted")
    parser.add_argument("--direct", default="true", choices=["true", "false"])
    parser.add_argument("--turns", type=int, default=0, help="then this many turns, and every process again")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="pincer-bench-mem-"))
    llm = ScriptedModel()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PINCER_")}
    env.update({"PINCER_DATA_DIR": str(tmp / "data"), "PINCER_WORKSPACE": str(tmp / "ws"),
                "PINCER_MODEL": args.model, "PINCER_LLM_API_BASE": llm.api_base, "PINCER_LLM_API_KEY": "sk",
                "PINCER_BRAIN__OPENAI_DIRECT": args.direct, "PINCER_GATEWAY_PORT": str(free_port()),
                # This tree's code, not whichever tree the venv's editable install points at (a worktree's).
                "HOME": str(tmp), "PYTHONPATH": str(ROOT),
                # Only the per-token rate is raised, so the turns are not refused.
                "PINCER_GATEWAY__LIMITS__MESSAGES_PER_MINUTE": "1000000", "PINCER_GATEWAY__LIMITS__BURST": "100000"})
    (tmp / "ws").mkdir()
    (tmp / "ws" / "notes.txt").write_text("the secret word is pincer-42\n")
    pincer = [sys.executable, "-m", "gateway"]
    try:
        subprocess.run([*pincer, "up", "--detach"], env=env, check=True, cwd=tmp, capture_output=True)
        subprocess.run([*pincer, "chat", "-m", "hello"], env=env, check=True, cwd=tmp, capture_output=True)
        time.sleep(5)  # let it settle: what an idle daemon holds
        sizes = sizes_of(tmp / "data")
        worked: list[tuple[str, float, float]] = []
        if args.turns:
            token = read_owner_token(tmp / "data")
            assert token is not None
            send_turns(f"http://127.0.0.1:{env['PINCER_GATEWAY_PORT']}", token, args.turns)
            time.sleep(5)
            worked = sizes_of(tmp / "data")
    finally:
        subprocess.run([*pincer, "stop"], env=env, cwd=tmp, capture_output=True)
        llm.stop()
    print(f"\n{platform.node()} · Python {platform.python_version()} · {time.strftime('%Y-%m-%d')} · "
          f"model {args.model}, openai_direct {args.direct}\n")
    after = {role: (rss, pss) for role, rss, pss in worked}
    tail = f" after {args.turns} turns | PSS after |" if worked else ""
    print(f"| process | resident MB idle | PSS idle |{tail}\n|---|---|---|{'---|---|' if worked else ''}")
    for role, rss, pss in sizes:
        later = after.get(role, (0.0, 0.0))
        print(f"| {role} | {rss:.1f} | {pss:.1f} |" + (f" {later[0]:.1f} | {later[1]:.1f} |" if worked else ""))
    total = f" **{sum(r for r, _ in after.values()):.1f}** | **{sum(p for _, p in after.values()):.1f}** |" \
        if worked else ""
    print(f"| **all** | **{sum(r for _, r, _ in sizes):.1f}** | **{sum(p for _, _, p in sizes):.1f}** |{total}")

if __name__ == "__main__":
    main()
