"""Pincer beside an older Pincer and nanobot, each started as its users start it: one table, one run.

Three systems, each fresh for every round and each on the same scripted
OpenAI-compatible model (tests/scripted_llm.py in a process of its own):

- an older Pincer (`--ref`, default 145b7f5): a `git worktree add --detach`
  under the cache dir with a venv of its own (`pip install -e` of that tree),
  so the old code runs with the dependencies it declared;
- this tree, from the Python running the bench;
- nanobot 0.3.5's `serve` (PyPI `nanobot-ai[api]`), in a venv of its own.

Both Pincers run as `pincer up --hands 1 --detach` on a private data dir
(supervisor, embedded Redis, Gateway, Brain, one Hands), the client on the
native endpoint with a token; nanobot on `/v1/chat/completions` with a
`session_id`. Rounds alternate (ABCABC...) with a quiet pause before each
start; each figure is the median over rounds. Per start: one turn and a
settle, the idle RSS and PSS of the whole process tree (Redis included); sequential
plain and one-`read_file` turns, and the scripted model's own plain answer to the
same kind of client (a plain turn's overhead is its p50 less that); turns/s with
N sessions in flight and the CPU the tree spent per turn meanwhile (/proc); the
tree's RSS and PSS afterwards.
RSS counts a page shared by several processes (libpython's, a shared library's)
in each of them; PSS divides it among them, so the PSS of a tree is what it
takes from the machine, and compares a five-process tree with one process fairly.

The venvs and the worktree are made the first time (minutes) and kept under
~/.cache/pincer-bench/ (`--cache-dir`); `git worktree remove` takes the
worktree away. Each start's processes and RSS go to stderr as it runs.

Run:         .venv/bin/python bench/versus.py [--ref 145b7f5] [--rounds 2] [--quiet-s 60] [--turns 300]
Quick check: .venv/bin/python bench/versus.py --rounds 1 --quiet-s 0 --turns 100
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.gateway_turns import (  # noqa: E402
    CACHE_DIR,
    FILE_TURN,
    LOAD_LIMITS,
    NANOBOT,
    TOKEN,
    ScriptedModel,
    cpu_ms,
    nanobot_executable,
    nanobot_turn,
    native,
    peer_throughput,
    scratch_venv,
    start_nanobot,
    throughput,
    wait_healthy,
)
from bench.idle_memory import children_of  # noqa: E402
from bus.redis_server import free_port  # noqa: E402
from gateway.runtime.procinfo import proportional_mb, resident_mb  # noqa: E402

Send = Callable[[httpx.Client, str, str], None]


def tree_of(pid: int) -> list[int]:
    """The process and all its descendants, alive now."""
    found, todo = [], [pid]
    while todo:
        found.append(todo.pop())
        todo.extend(children_of(found[-1]))
    return found


def tree_mb(pid: int) -> float:
    return sum(resident_mb(p) or 0.0 for p in tree_of(pid))


def tree_pss_mb(pid: int) -> float:
    return sum(proportional_mb(p) or 0.0 for p in tree_of(pid))


def tree_listing(pid: int) -> str:
    """Each process of the tree and its RSS, for the log: what the sum is made of."""
    rows = []
    for p in tree_of(pid):
        try:
            argv = Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        words = [w.decode(errors="replace") for w in argv if w]
        command = " ".join([Path(words[0]).name, *words[1:]]) if words else "?"
        rows.append(f"  {resident_mb(p) or 0.0:6.0f} MB  (PSS {proportional_mb(p) or 0.0:4.0f})  {command[:100]}")
    return "\n".join(rows)


def tree_cpu(pid: int) -> dict[int, float]:
    cpu = {}
    for p in tree_of(pid):
        try:
            cpu[p] = cpu_ms(p)
        except OSError:  # ended between the walk and the read
            continue
    return cpu


@dataclass
class Running:
    """A started system, as the client and /proc see it."""

    url: str
    root_pid: int  # the process whose tree is the whole system
    send: Send
    load: Callable[[int, int], float]  # (sessions, turns) -> turns/s
    headers: dict[str, str] = field(default_factory=dict)
    brain_pid: int | None = None


def config_of(env: dict[str, str]) -> dict[str, Any]:
    """`PINCER_<SECTION>__<KEY>...` variables as the config file's nested mapping (JSON is YAML)."""
    config: dict[str, Any] = {}
    for name, value in env.items():
        *path, key = name.removeprefix("PINCER_").lower().split("__")
        node = config
        for part in path:
            node = node.setdefault(part, {})
        node[key] = int(value)
    return config


class Pincer:
    """`pincer up --hands 1 --detach` of one tree, on a private data dir and the scripted model."""

    def __init__(self, name: str, python: Path, tree: Path) -> None:
        self.name, self.python, self.tree = name, python, tree

    def start(self, tmp: Path, llm: ScriptedModel) -> Running:
        (tmp / "ws").mkdir()
        (tmp / "ws" / "notes.txt").write_text("the secret word is pincer-42\n")
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("PINCER_")}
        self.env.update({
            "PINCER_DATA_DIR": str(tmp / "data"), "PINCER_WORKSPACE": str(tmp / "ws"),
            "PINCER_MODEL": "openai/scripted", "PINCER_LLM_API_BASE": llm.api_base, "PINCER_LLM_API_KEY": "sk",
            "PINCER_GATEWAY_PORT": str(free_port()), "PINCER_GATEWAY_TOKEN": TOKEN, "HOME": str(tmp),
            # The tree's own code, whatever the venv's editable install points at.
            "PYTHONPATH": str(self.tree), "PINCER_CONFIG": str(tmp / "config.yaml"),
        })
        # A file, not the environment: the supervisor keeps every variable ending in _TOKEN from the Gateway,
        # open_turns_per_token's among them.
        (tmp / "config.yaml").write_text(json.dumps(config_of(LOAD_LIMITS)))
        self.cwd = tmp
        self.pincer("up", "--hands", "1", "--detach")
        state = json.loads((tmp / "data" / "pincer.json").read_text())
        url = state["gateway_url"].rstrip("/")
        wait_healthy(url)
        return Running(url=url, root_pid=state["supervisor"]["pid"], send=native,
                       load=lambda sessions, turns: asyncio.run(
                           throughput(url, sessions=sessions, turns=turns, openai=False)),
                       headers={"Authorization": f"Bearer {TOKEN}"}, brain_pid=state["children"]["brain"]["pid"])

    def pincer(self, *argv: str, check: bool = True) -> None:
        done = subprocess.run([str(self.python), "-m", "gateway", *argv], env=self.env, cwd=self.cwd,
                              capture_output=True, text=True)
        if check and done.returncode != 0:
            raise SystemExit(f"{self.name}: `pincer {' '.join(argv)}` failed:\n{done.stdout}{done.stderr}")

    def stop(self) -> None:
        """Whatever `up` started, even when it failed before it was ready (then `stop` finds nothing)."""
        self.pincer("stop", check=False)


def older_pincer(ref: str, cache_dir: Path) -> Pincer:
    """`ref` checked out beside this tree (a detached worktree) with its own venv, made the first time."""
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", f"{ref}^{{commit}}"],
                            check=True, capture_output=True, text=True).stdout.strip()
    tree = cache_dir / f"pincer-{commit}"
    if not (tree / ".git").exists():
        cache_dir.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), commit], check=True)
    return Pincer(ref, scratch_venv(tree / ".venv", "-e", str(tree)) / "python", tree)


def user_venv(cache_dir: Path) -> Path:
    """This tree installed as a user's `./pincer up` installs it: no extras (the test venv's, the `otel` one
    among them, add ~3 MB to every process that imports redis-py). One venv per pyproject.toml."""
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()[:10]
    return scratch_venv(cache_dir / f"pincer-here-{digest}", "-e", str(ROOT)) / "python"


class Nanobot:
    """nanobot's `serve` on the scripted model (see bench/gateway_turns.py's start_nanobot)."""

    name = f"nanobot {NANOBOT.rsplit('==', 1)[1]}"

    def __init__(self, executable: str) -> None:
        self.executable = executable
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, tmp: Path, llm: ScriptedModel) -> Running:
        url, self.proc = start_nanobot(self.executable, tmp, llm)
        return Running(url=url, root_pid=self.proc.pid, send=nanobot_turn,
                       load=lambda sessions, turns: asyncio.run(peer_throughput(url, sessions=sessions, turns=turns)))

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(30)


System = Pincer | Nanobot


def p50(client: httpx.Client, send: Send, text: str, *, count: int, tag: str) -> float:
    times = []
    for i in range(count):
        started = time.perf_counter()
        send(client, f"seq-{tag}-{i}", text)
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def model_alone(llm: ScriptedModel, *, count: int) -> float:
    """The scripted model's own plain answer, streamed to the same kind of client: what every system's
    plain turn contains, so a turn's overhead is its p50 less this one."""
    body = {"model": "scripted", "stream": True,
            "messages": [{"role": "system", "content": "You are an assistant."}, {"role": "user", "content": "hello"}]}
    times = []
    with httpx.Client(base_url=llm.api_base, headers={"Authorization": "Bearer sk-scripted"}, timeout=60) as client:
        for _ in range(count):
            started = time.perf_counter()
            with client.stream("POST", "/chat/completions", json=body) as response:
                response.raise_for_status()
                for _chunk in response.iter_bytes():
                    pass
            times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def measure(system: System, args: argparse.Namespace) -> dict[str, float]:
    """One fresh start of `system`: every figure of the table."""
    tmp = Path(tempfile.mkdtemp(prefix="pincer-bench-versus-"))
    llm = ScriptedModel()
    try:
        try:
            run = system.start(tmp, llm)
            found: dict[str, float] = {}
            with httpx.Client(base_url=run.url, headers=run.headers, timeout=120) as client:
                run.send(client, "first", "hello")
                time.sleep(args.settle_s)  # what an idle system holds once its first turn is done
                found["idle_mb"] = tree_mb(run.root_pid)
                found["idle_pss_mb"] = tree_pss_mb(run.root_pid)
                print(f"{system.name} idle:\n{tree_listing(run.root_pid)}", file=sys.stderr, flush=True)
                found["plain_ms"] = p50(client, run.send, "hello", count=args.sequential, tag="plain")
                found["tool_ms"] = p50(client, run.send, FILE_TURN, count=args.sequential, tag="tool")
            found["model_ms"] = model_alone(llm, count=args.sequential)
            found["plain_over_ms"] = found["plain_ms"] - found["model_ms"]
            before = tree_cpu(run.root_pid)
            found["turns_s"] = run.load(args.sessions, args.turns)
            after = tree_cpu(run.root_pid)
            loaded = args.turns // args.sessions * args.sessions
            found["cpu_ms"] = sum(ms - before.get(pid, 0.0) for pid, ms in after.items()) / loaded
            found["after_mb"] = tree_mb(run.root_pid)
            found["after_pss_mb"] = tree_pss_mb(run.root_pid)
            if run.brain_pid is not None:
                found["brain_mb"] = resident_mb(run.brain_pid) or 0.0
        finally:
            system.stop()
    finally:
        llm.stop()
    return found


ROWS = [
    ("plain turn p50 (ms)", "plain_ms", "{:.1f}"),
    ("the scripted model alone, p50 (ms)", "model_ms", "{:.1f}"),
    ("plain turn overhead: p50 less the model's (ms)", "plain_over_ms", "{:.1f}"),
    ("tool turn p50, one read_file call (ms)", "tool_ms", "{:.1f}"),
    ("turns/s, {sessions} sessions in flight", "turns_s", "{:.0f}"),
    ("CPU ms per turn under load (whole tree)", "cpu_ms", "{:.1f}"),
    ("resident memory idle, whole tree (MB, Redis included)", "idle_mb", "{:.0f}"),
    ("resident memory after the run ({total} turns, MB)", "after_mb", "{:.0f}"),
    ("proportional memory (PSS) idle, whole tree (MB)", "idle_pss_mb", "{:.0f}"),
    ("proportional memory (PSS) after the run (MB)", "after_pss_mb", "{:.0f}"),
    ("the Brain after the run (MB)", "brain_mb", "{:.0f}"),
]


def table(systems: list[System], results: dict[str, list[dict[str, float]]], args: argparse.Namespace) -> str:
    total = 1 + 2 * args.sequential + args.turns // args.sessions * args.sessions
    lines = ["| | " + " | ".join(s.name for s in systems) + " |", "|---" * (len(systems) + 1) + "|"]
    for label, key, form in ROWS:
        cells = []
        for system in systems:
            values = [r[key] for r in results[system.name] if key in r]
            cells.append(form.format(statistics.median(values)) if values else "n/a")
        lines.append(f"| {label.format(sessions=args.sessions, total=total)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ref", default="145b7f5", help="the older Pincer: a commit, tag or branch")
    parser.add_argument("--rounds", type=int, default=2, help="starts of each system (ABCABC...); medians over them")
    parser.add_argument("--quiet-s", type=float, default=60.0, help="idle seconds before each start")
    parser.add_argument("--settle-s", type=float, default=5.0, help="after the first turn, before the idle RSS")
    parser.add_argument("--sequential", type=int, default=20, help="turns of each kind for the p50s")
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--turns", type=int, default=300, help="turns of the load, over --sessions sessions")
    parser.add_argument("--cache-dir", type=Path, default=CACHE_DIR, help="the venvs and the older worktree")
    args = parser.parse_args()

    here = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True).stdout.strip()
    systems: list[System] = [older_pincer(args.ref, args.cache_dir),
                             Pincer(f"this tree ({here})", user_venv(args.cache_dir), ROOT),
                             Nanobot(nanobot_executable(args.cache_dir))]
    load = os.getloadavg()[0]
    results: dict[str, list[dict[str, float]]] = {s.name: [] for s in systems}
    for round_ in range(args.rounds):
        for system in systems:
            time.sleep(args.quiet_s)
            print(f"round {round_ + 1}/{args.rounds}: {system.name}", file=sys.stderr, flush=True)
            results[system.name].append(measure(system, args))

    print(f"\n{platform.node()} · {os.cpu_count()} CPUs · Python {platform.python_version()} · "
          f"{time.strftime('%Y-%m-%d %H:%M')} · load average {load:.1f} at the start · {args.rounds} rounds, "
          f"{args.quiet_s:g} s quiet before each start\n")
    print(table(systems, results, args))


if __name__ == "__main__":
    main()
