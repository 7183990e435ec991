"""What a chat turn costs through the Gateway, with every check on: native endpoint and OpenAI side by side.

A private redis-server, real `pincer gateway`, `brain` and `hands` processes,
and the tests' scripted OpenAI-compatible model on loopback (it answers at
once), so litellm's real HTTP path runs. Measured from one client:

- sequential p50/p90 of a plain turn and of a turn with one `read_file` call,
  on `POST /v1/sessions/{id}/messages` and `POST /v1/chat/completions`
  (alternating rounds, so drift hits both alike);
- turns per second with N sessions in flight (default 100), and the CPU each
  process spent per turn meanwhile (from /proc);
- the guard's own cost per request (Host, Origin, body, token), in process.

The nearest Python peer runs beside it on the same model when given
(`--nanobot PATH`): nanobot's `serve` (PyPI `nanobot-ai`, in a venv of its
own, since its dependencies are not Pincer's; `--nanobot auto` makes that venv
under ~/.cache/pincer-bench/ itself the first time):

    python3.11 -m venv /tmp/nb && /tmp/nb/bin/pip install 'nanobot-ai[api]==0.3.5'

Run: .venv/bin/python bench/gateway_turns.py [--turns 1000] [--sessions 100] [--nanobot auto|/tmp/nb/bin/nanobot]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bus.redis_server import EmbeddedRedis, free_port  # noqa: E402

TOKEN = "pcr_bench-" + os.urandom(8).hex()
FILE_TURN = 'CALL read_file {"path": "notes.txt"}'
# Every check stays on; only the per-token limits are raised so the load is not refused.
LOAD_LIMITS = {
    "PINCER_GATEWAY__LIMITS__OPEN_TURNS_PER_TOKEN": "10000", "PINCER_GATEWAY__LIMITS__OPEN_STREAMS_PER_TOKEN": "10000",
    "PINCER_GATEWAY__LIMITS__MESSAGES_PER_MINUTE": "10000000", "PINCER_GATEWAY__LIMITS__BURST": "100000",
    "PINCER_BRAIN__MAX_TURNS": "64", "PINCER_BRAIN__MAX_WAITING": "256",
}
CACHE_DIR = Path.home() / ".cache" / "pincer-bench"
NANOBOT = "nanobot-ai[api]==0.3.5"


def scratch_venv(venv: Path, *requirements: str) -> Path:
    """A venv of its own for a peer whose dependencies are not Pincer's, made once and kept; its bin dir."""
    installed = venv / ".pincer-bench-installed"
    if not installed.exists():
        print(f"installing {' '.join(requirements)} into {venv} (once)", file=sys.stderr, flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", *requirements], check=True)
        installed.write_text(" ".join(requirements) + "\n")
    return venv / "bin"


def nanobot_executable(cache_dir: Path = CACHE_DIR) -> str:
    """nanobot's `nanobot` command, from the registry into a scratch venv under the cache dir if not there yet."""
    return str(scratch_venv(cache_dir / f"nanobot-{NANOBOT.rsplit('==', 1)[1]}", NANOBOT) / "nanobot")


class ScriptedModel:
    """The tests' scripted model in a process of its own, so the bench client does not share its GIL."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.scripted_llm"], cwd=ROOT, stdout=subprocess.PIPE)
        assert self.proc.stdout is not None
        self.api_base = self.proc.stdout.readline().decode().strip()

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def start_stack(tmp: Path, redis_url: str, llm: ScriptedModel,
                extra: dict[str, str] | None = None) -> tuple[dict[str, str], list[subprocess.Popen[bytes]]]:
    workspace = tmp / "workspace"
    workspace.mkdir()
    (workspace / "notes.txt").write_text("the secret word is pincer-42\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PINCER_")}
    env.update({
        "PINCER_REDIS_URL": redis_url, "PINCER_MODEL": "openai/scripted", "PINCER_LLM_API_BASE": llm.api_base,
        "PINCER_LLM_API_KEY": "sk-scripted", "PINCER_BRAIN__LLM_RETRIES": "0", "PINCER_WORKSPACE": str(workspace),
        "PINCER_HANDS__SKILL_DIRS": f'["{ROOT / "skills"}"]', "PINCER_DATA_DIR": str(tmp / "data"),
        "PINCER_GATEWAY_PORT": str(free_port()), "PINCER_GATEWAY_TOKEN": TOKEN,
        "PINCER_RUNTIME__LOG_LEVEL": "WARNING", "PYTHONPATH": str(ROOT), **LOAD_LIMITS,
    })
    env.update(extra or {})
    procs = [subprocess.Popen([sys.executable, "-m", "gateway", role], env=env, cwd=tmp,
                              stdout=subprocess.DEVNULL, stderr=(tmp / f"{role}.log").open("wb"))
             for role in ("gateway", "brain", "hands")]
    return env, procs


def stop_stack(procs: list[subprocess.Popen[bytes]], llm: ScriptedModel, redis: EmbeddedRedis) -> None:
    """Every process the bench started, the model and Redis, stopped (whatever is still running)."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(15)
    llm.stop()
    redis.stop()


def wait_healthy(url: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/healthz", timeout=2).json().get("status") == "ok":
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit("the stack did not become healthy within 60 s")


def native(client: httpx.Client, session: str, text: str) -> None:
    response = client.post(f"/v1/sessions/{session}/messages", json={"text": text})
    assert response.status_code == 200, response.text


def openai_turn(client: httpx.Client, session: str, text: str) -> None:
    response = client.post("/v1/chat/completions", headers={"X-Pincer-Session": session},
                           json={"model": "pincer", "messages": [{"role": "user", "content": text}]})
    assert response.status_code == 200, response.text


def sequential(client: httpx.Client, rounds: int, per_round: int) -> dict[str, list[float]]:
    kinds = {"native plain": (native, "hello"), "openai plain": (openai_turn, "hello"),
             "native read_file": (native, FILE_TURN), "openai read_file": (openai_turn, FILE_TURN)}
    times: dict[str, list[float]] = {k: [] for k in kinds}
    for round_ in range(rounds):
        for name, (send, text) in kinds.items():
            for i in range(per_round):
                started = time.perf_counter()
                send(client, f"seq-{name.replace(' ', '-')}-{round_}-{i}", text)
                times[name].append((time.perf_counter() - started) * 1000)
    return times


def start_nanobot(executable: str, tmp: Path, llm: ScriptedModel) -> tuple[str, subprocess.Popen[bytes]]:
    """nanobot's OpenAI-compatible server on the same scripted model, with its own copy of the workspace."""
    home = tmp / "nanobot"
    (home / "ws").mkdir(parents=True)
    (home / "ws" / "notes.txt").write_text("the secret word is pincer-42\n")
    config = {"agents": {"defaults": {"model": "scripted", "provider": "custom", "workspace": str(home / "ws")}},
              "providers": {"custom": {"apiKey": "sk-scripted", "apiBase": llm.api_base}}}
    (home / "config.json").write_text(json.dumps(config))
    port = free_port()
    proc = subprocess.Popen([executable, "serve", "--port", str(port), "--config", str(home / "config.json"),
                             "--workspace", str(home / "ws")], env={**os.environ, "HOME": str(home)}, cwd=home,
                            stdout=subprocess.DEVNULL, stderr=(tmp / "nanobot.log").open("wb"))
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            httpx.get(f"{url}/health", timeout=2)
            return url, proc
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.terminate()
    raise SystemExit(f"nanobot serve did not answer within 60 s (see {tmp / 'nanobot.log'})")


def nanobot_turn(client: httpx.Client, session: str, text: str) -> None:
    response = client.post("/v1/chat/completions", json={
        "model": "scripted", "session_id": session, "messages": [{"role": "user", "content": text}]})
    assert response.status_code == 200, response.text


def peer_sequential(url: str, rounds: int, per_round: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {"nanobot plain": [], "nanobot read_file": []}
    with httpx.Client(base_url=url, timeout=120) as client:
        nanobot_turn(client, "warm", "hello")
        for round_ in range(rounds):
            for name, text in (("nanobot plain", "hello"), ("nanobot read_file", FILE_TURN)):
                for i in range(per_round):
                    started = time.perf_counter()
                    nanobot_turn(client, f"seq-{name[8:]}-{round_}-{i}", text)
                    times[name].append((time.perf_counter() - started) * 1000)
    return times


async def peer_throughput(url: str, *, sessions: int, turns: int) -> float:
    limits = httpx.Limits(max_connections=sessions, max_keepalive_connections=sessions)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as client:
        per_session = max(1, turns // sessions)

        async def one(session: int) -> None:
            for i in range(per_session):
                r = await client.post("/v1/chat/completions", json={
                    "model": "scripted", "session_id": f"tp-{session}",
                    "messages": [{"role": "user", "content": f"m{i}"}]})
                assert r.status_code == 200, r.text

        started = time.perf_counter()
        await asyncio.gather(*(one(s) for s in range(sessions)))
        return per_session * sessions / (time.perf_counter() - started)


def cpu_ms(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


async def throughput(url: str, *, sessions: int, turns: int, openai: bool) -> float:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    limits = httpx.Limits(max_connections=sessions, max_keepalive_connections=sessions)
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=120, limits=limits) as client:
        per_session = max(1, turns // sessions)

        async def one(session: int) -> None:
            for i in range(per_session):
                if openai:
                    r = await client.post("/v1/chat/completions", headers={"X-Pincer-Session": f"tp-o-{session}"},
                                          json={"model": "pincer", "messages": [{"role": "user", "content": f"m{i}"}]})
                else:
                    r = await client.post(f"/v1/sessions/tp-n-{session}/messages", json={"text": f"m{i}"})
                assert r.status_code == 200, r.text

        started = time.perf_counter()
        await asyncio.gather(*(one(s) for s in range(sessions)))
        return per_session * sessions / (time.perf_counter() - started)


def guard_cost(iterations: int = 20000) -> dict[str, float]:
    """µs the guard adds to a request (Host, Origin, body read, cached token lookup), in process."""
    import fakeredis.aioredis

    from bus.keys import Keys
    from bus.metrics import Meter
    from gateway.config import GatewaySettings
    from gateway.server.guard import Guard
    from gateway.tokens import Identity, TokenStore, digest, new_token

    async def inner(scope: Any, receive: Any, send: Any) -> None:
        await receive()

    async def run() -> dict[str, float]:
        redis, keys = fakeredis.aioredis.FakeRedis(), Keys()  # fakeredis has no Lua: write the record itself
        token = new_token()
        await redis.hset(keys.tokens, digest(token), Identity(name="bench").model_dump_json())
        store = TokenStore(redis, keys)
        guard = Guard(inner, settings=GatewaySettings(), tokens=store, meter=Meter())
        scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": [
            (b"host", b"127.0.0.1:8780"), (b"authorization", f"Bearer {token}".encode()),
            (b"content-type", b"application/json"), (b"content-length", b"64"), (b"origin", b"http://127.0.0.1:8780"),
            (b"user-agent", b"OpenAI/Python 2.0"), (b"accept", b"application/json")]}
        body = {"type": "http.request", "body": b"x" * 64, "more_body": False}

        async def receive() -> dict[str, Any]:
            return body

        async def send(_message: Any) -> None:
            return None

        results = {}
        for name, app in (("bare", inner), ("guarded", guard)):
            for _ in range(2000):  # warm the token cache and the interpreter
                await app(dict(scope), receive, send)
            started = time.perf_counter()
            for _ in range(iterations):
                await app(dict(scope), receive, send)
            results[name] = (time.perf_counter() - started) / iterations * 1e6
        return results

    found = asyncio.run(run())
    return {"guard_us": found["guarded"] - found["bare"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--per-round", type=int, default=20)
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--turns", type=int, default=1000)
    parser.add_argument("--nanobot", metavar="PATH", help="nanobot's executable, to measure it beside Pincer "
                        f"(auto: {NANOBOT} in a venv under {CACHE_DIR}, installed there if missing)")
    args = parser.parse_args()
    if args.nanobot == "auto":
        args.nanobot = nanobot_executable()

    tmp = Path(tempfile.mkdtemp(prefix="pincer-bench-gw-"))
    redis = EmbeddedRedis(tmp / "redis-data")
    llm = ScriptedModel()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        env, procs = start_stack(tmp, redis.start(), llm)
        url = f"http://127.0.0.1:{env['PINCER_GATEWAY_PORT']}"
        wait_healthy(url)
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60) as client:
            sequential(client, 1, 5)  # warm up: imports, litellm's first call, the tool list
            times = sequential(client, args.rounds, args.per_round)
        pids = {"gateway": procs[0].pid, "brain": procs[1].pid, "hands": procs[2].pid, "redis": redis.process.pid}  # type: ignore[union-attr]
        rates, cpu = {}, {}
        for kind in ("native", "openai"):
            before = {k: cpu_ms(p) for k, p in pids.items()}
            rates[kind] = asyncio.run(throughput(url, sessions=args.sessions, turns=args.turns,
                                                 openai=kind == "openai"))
            done = args.turns // args.sessions * args.sessions
            cpu[kind] = {k: (cpu_ms(p) - before[k]) / done for k, p in pids.items()}
        guard = guard_cost()
        for proc in procs:  # the peer gets the machine to itself, as Pincer did
            proc.terminate()
            proc.wait(15)
        if args.nanobot:
            peer_url, peer = start_nanobot(args.nanobot, tmp, llm)
            procs.append(peer)
            times.update(peer_sequential(peer_url, args.rounds, args.per_round))
            peer_before = cpu_ms(peer.pid)
            rates["nanobot"] = asyncio.run(peer_throughput(peer_url, sessions=args.sessions, turns=args.turns))
            done = args.turns // args.sessions * args.sessions
            cpu["nanobot"] = {"gateway": (cpu_ms(peer.pid) - peer_before) / done, "brain": 0.0, "hands": 0.0,
                              "redis": 0.0}
    finally:
        stop_stack(procs, llm, redis)

    print(f"\n{platform.node()} · {os.cpu_count()} CPUs · Python {platform.python_version()} · "
          f"{time.strftime('%Y-%m-%d')}\n")
    print("| turn | p50 ms | p90 ms |\n|---|---|---|")
    for name, values in times.items():
        values.sort()
        print(f"| {name} | {statistics.median(values):.2f} | {values[int(len(values) * 0.9)]:.2f} |")
    for kind in ("plain", "read_file"):
        gap = statistics.median(times[f"openai {kind}"]) - statistics.median(times[f"native {kind}"])
        print(f"\nOpenAI layer over native, {kind}: {gap:+.2f} ms p50")
    print(f"guard (Host, Origin, body, cached token) per request: {guard['guard_us']:.1f} µs\n")
    print(f"| endpoint | turns/s, {args.sessions} sessions in flight | CPU ms per turn: gateway (nanobot: all) "
          "| brain | hands | redis |")
    print("|---|---|---|---|---|---|")
    for kind, rate in rates.items():
        c = cpu[kind]
        print(f"| {kind} | {rate:.0f} | {c['gateway']:.2f} | {c['brain']:.2f} | {c['hands']:.2f} | {c['redis']:.2f} |")


if __name__ == "__main__":
    main()
