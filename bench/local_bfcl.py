"""The local model on a BFCL-shaped set: does Pincer's path to it cost the model accuracy?

The cases (`bench/local_bfcl.jsonl`, 36 written for this bench) take the
shape of the Berkeley Function Calling Leaderboard's single-turn "simple"
(one function offered) and "multiple" (two to four offered, one fits)
categories: each line holds an ``id``, the ``question`` (one user message),
the ``function`` list offered (name, description, JSON Schema parameters;
BFCL writes ``"type": "dict"`` and ``"float"``, here plain JSON Schema, as
the OpenAI API takes it) and the ``ground_truth`` (BFCL keeps it in a second
file joined by id): the right function and, per argument, the values allowed,
``""`` meaning that an optional argument may be left out.

Scored as BFCL's AST checker scores a first call: the right function; every
required argument there; no argument the function does not have; each value
of the schema's type (an integer passes for a number) and one of the allowed
values, strings compared after BFCL's standardisation (case, spaces and
``,./-_*^`` ignored). Deterministic: greedy decoding, no user simulator.

Each case is asked two ways, of one model served by the same server, in
turn (so a run cut short still pairs them):
- server: straight to the local model's OpenAI endpoint (what
  `python -m localmodel serve` runs) with the openai SDK, the functions as
  ``tools``, the question the only message;
- pincer: the same functions and question as a Brain sends them for the
  local model: its client built as `pincer up` configures it
  (`brain.worker.default_llm`: `openai/local`, the openai SDK's direct road,
  streamed), its system prompt (`brain.prompt.system_prompt` of the default
  instructions), the functions as `ToolSpec`s.
Both pass through the server's chat handler (`localmodel/chat.py`: the tools
listed with guidance, a reply reviewed and asked again once), which is the
local model as Pincer ships it; what differs is the Brain's part. Latency is
the request's, and each prompt is read afresh (the two ways' prompts differ
from their first line, so llama.cpp's prefix cache helps neither).

Run (llama-cpp-python importable; the model from the tests' cache by default):
    nice -n 10 .venv/bin/python bench/local_bfcl.py [--model PATH] [--threads N] [--limit N]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import platform
import re
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from localmodel import KEY_VARIABLE  # noqa: E402
from localmodel.weights import MODEL_FILE  # noqa: E402

CASES = ROOT / "bench" / "local_bfcl.jsonl"
DEFAULT_MODEL = Path("/var/tmp/pincer-test-local") / MODEL_FILE  # where the tests keep the assembled model


@dataclass(frozen=True)
class Case:
    id: str
    question: str
    functions: list[dict[str, Any]]
    answer: dict[str, dict[str, list[Any]]]  # BFCL's ground truth: {function: {argument: allowed values}}

    @property
    def category(self) -> str:
        return self.id.rsplit("_", 1)[0]


@dataclass
class Outcome:
    case: Case
    wrong: str | None  # None: right; else what was wrong
    said: str  # the first call (or the text) as the model gave it
    seconds: float
    asked_again: int = 0  # the server's handler asked the model once more


def load(path: Path = CASES) -> list[Case]:
    cases = []
    for line in path.read_text().splitlines():
        row = json.loads(line)
        (turn,) = row["question"]
        cases.append(Case(row["id"], turn[-1]["content"], row["function"], row["ground_truth"][0]))
    return cases


# --- BFCL's AST check of one call ---

def standard(text: str) -> str:
    """BFCL's string standardisation: case, spaces and ``,./-_*^`` do not count."""
    return re.sub(r"[ ,./\\\-_*^]", "", text).lower().replace("'", '"')


TYPES: dict[str, tuple[type, ...]] = {"string": (str,), "integer": (int,), "number": (int, float),
                                      "boolean": (bool,), "array": (list,), "object": (dict,)}


def same(value: Any, allowed: Any) -> bool:
    if isinstance(value, str) and isinstance(allowed, str):
        return standard(value) == standard(allowed)
    if isinstance(value, list) and isinstance(allowed, list):
        return len(value) == len(allowed) and all(same(v, a) for v, a in zip(value, allowed, strict=True))
    if isinstance(value, bool) or isinstance(allowed, bool):
        return value is allowed
    return bool(value == allowed)


def check(case: Case, name: str, arguments: Any) -> str | None:
    """Why the call is wrong, or None when BFCL's AST checker would pass it."""
    ((expected, truth),) = case.answer.items()
    if name != expected:
        return f"called {name}, not {expected}"
    if not isinstance(arguments, dict):
        return "arguments are not an object"
    schema = next(f for f in case.functions if f["name"] == name)["parameters"]
    missing = [p for p in schema.get("required", []) if p not in arguments]
    if missing:
        return f"missing {', '.join(missing)}"
    for key, value in arguments.items():
        if key not in schema["properties"]:
            return f"no such argument {key}"
        kind = TYPES.get(schema["properties"][key].get("type", ""), (object,))
        if not isinstance(value, kind) or (isinstance(value, bool) and bool not in kind):
            return f"{key}={value!r} is not {schema['properties'][key]['type']}"
        if not any(same(value, allowed) for allowed in truth[key] if allowed != ""):
            return f"{key}={value!r}"
    left_out = [key for key, allowed in truth.items() if key not in arguments and "" not in allowed]
    return f"left out {', '.join(left_out)}" if left_out else None


def scored(case: Case, calls: list[tuple[str, str]], text: str, seconds: float) -> Outcome:
    """The first call scored; ``calls``: (name, arguments as JSON text)."""
    if not calls:
        return Outcome(case, "no call", text.strip()[:100], seconds)
    name, raw = calls[0]
    try:
        arguments = json.loads(raw)
    except ValueError:
        return Outcome(case, "arguments are not JSON", f"{name}({raw[:80]})", seconds)
    more = f" (+{len(calls) - 1} more)" if len(calls) > 1 else ""
    return Outcome(case, check(case, name, arguments), f"{name}({json.dumps(arguments, ensure_ascii=False)}){more}",
                   seconds)


# --- the three ways of asking ---

def tools_of(case: Case) -> list[dict[str, Any]]:
    return [{"type": "function", "function": f} for f in case.functions]


async def ask_server(client: Any, case: Case) -> Outcome:
    started = time.perf_counter()
    reply = await client.chat.completions.create(model="local", tools=tools_of(case),
                                                 messages=[{"role": "user", "content": case.question}])
    seconds = time.perf_counter() - started
    message = reply.choices[0].message
    calls = [(c.function.name, c.function.arguments) for c in message.tool_calls or [] if c.type == "function"]
    return scored(case, calls, message.content or "", seconds)


def brain_client(base: str, key: str) -> tuple[Any, str]:
    """The Brain's LLM client as `pincer up` configures it for the local model, and the Brain's instructions."""
    from brain.config import BrainSettings
    from brain.worker import default_llm

    settings = BrainSettings(model="openai/local", api_base=base, api_key=key, llm_timeout_s=300)
    return default_llm(settings), settings.instructions


async def ask_pincer(llm: Any, instructions: str, case: Case) -> Outcome:
    from brain.prompt import system_prompt
    from bus.protocol import ToolSpec

    specs = [ToolSpec(name=f["name"], description=f.get("description", ""), parameters=f["parameters"])
             for f in case.functions]
    messages = [{"role": "system", "content": system_prompt(instructions, [], [])},
                {"role": "user", "content": case.question}]

    async def ignore(_text: str) -> None:
        return None

    started = time.perf_counter()
    completion = await llm.complete(messages, specs, ignore)
    seconds = time.perf_counter() - started
    return scored(case, [(c.name, c.arguments) for c in completion.tool_calls], completion.text, seconds)


# --- running it ---

def serve(model: Path, port: int, threads: int | None) -> None:
    """What `python -m localmodel serve` runs, with llama.cpp's threads chosen: on a busy 2-core machine
    one thread was 2.5x faster than two (221 s against 90 s for one reply, `nice`d beside others' tests)."""
    import logging

    import uvicorn

    from localmodel.llama import LlamaGenerator
    from localmodel.server import LocalModelServer

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    server = LocalModelServer(LlamaGenerator(model, threads=threads), key=os.environ.pop(KEY_VARIABLE))
    uvicorn.run(server.app(), host="127.0.0.1", port=port, log_level="warning")


def start_server(model: Path, key: str, log: Path, threads: int | None) -> tuple[subprocess.Popen[bytes], str]:
    import httpx

    from bus.redis_server import free_port

    port = free_port()
    argv = [sys.executable, "-m", "localmodel", "serve", "--model", str(model), "--port", str(port)]
    if threads:
        argv = [sys.executable, __file__, "--model", str(model), "--serve", str(port), "--threads", str(threads)]
    server = subprocess.Popen(argv, cwd=ROOT, env={**os.environ, KEY_VARIABLE: key}, stdout=subprocess.DEVNULL,
                              stderr=log.open("wb"))
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and server.poll() is None:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v1/models", headers={"Authorization": f"Bearer {key}"},
                         timeout=1).status_code == 200:
                return server, f"http://127.0.0.1:{port}/v1"
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    server.kill()
    raise SystemExit(f"the model server did not start: {log.read_text()[-2000:]}")


async def through_server(cases: list[Case], model: Path, threads: int | None) -> dict[str, list[Outcome]]:
    import openai

    key = secrets.token_urlsafe(32)
    with tempfile.TemporaryDirectory(prefix="pincer-bench-bfcl-") as tmp:
        log = Path(tmp) / "server.log"
        server, base = start_server(model, key, log, threads)
        found: dict[str, list[Outcome]] = {"server": [], "pincer": []}
        raw = openai.AsyncOpenAI(base_url=base, api_key=key, max_retries=0, timeout=300)
        llm, instructions = brain_client(base, key)
        asks: dict[str, Callable[[Case], Awaitable[Outcome]]] = {
            "server": functools.partial(ask_server, raw), "pincer": functools.partial(ask_pincer, llm, instructions)}
        try:
            for case in cases:  # both ways in turn: the pairs stay whole however far a run gets
                for arm, ask in asks.items():
                    before = log.read_text().count("asking again")
                    try:
                        outcome = await ask(case)
                    except Exception as exc:  # a failed request is a miss, said as such
                        outcome = Outcome(case, f"request failed: {type(exc).__name__}", str(exc)[:100], 0.0)
                    outcome.asked_again = log.read_text().count("asking again") - before
                    found[arm].append(outcome)
                    print(f"  {arm:6} {case.id:11} {'ok ' if outcome.wrong is None else 'MISS'} "
                          f"{outcome.seconds:5.1f} s  {outcome.said}", flush=True)
        finally:
            server.terminate()
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:  # a generation under way holds the graceful stop
                server.kill()
                server.wait(30)
    return found


def summary(arm: str, outcomes: list[Outcome]) -> str:
    right = [o for o in outcomes if o.wrong is None]
    by = {c: [o for o in outcomes if o.case.category == c] for c in ("simple", "multiple")}
    parts = ", ".join(f"{c} {sum(o.wrong is None for o in os_)}/{len(os_)}" for c, os_ in by.items() if os_)
    times = sorted(o.seconds for o in outcomes)
    p90 = statistics.quantiles(times, n=10)[8] if len(times) > 1 else times[0]
    again = sum(o.asked_again > 0 for o in outcomes)
    return (f"| {arm} | {len(right)}/{len(outcomes)} ({len(right) / len(outcomes):.0%}) | {parts} | "
            f"{statistics.median(times):.2f} s | {p90:.2f} s | {again} |")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--threads", type=int, help="llama.cpp's threads (default: one per CPU, as the product)")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)  # the server child: its port
    parser.add_argument("--limit", type=int, help="only the first N cases of each category (a quick look)")
    args = parser.parse_args()
    cases = load()
    if args.limit:
        cases = [c for c in cases if int(c.id.rsplit("_", 1)[1]) < args.limit]
    if args.serve:
        return serve(args.model, args.serve, args.threads)
    found = asyncio.run(through_server(cases, args.model, args.threads))
    print(f"# {time.strftime('%Y-%m-%d')} {platform.node()}, {os.cpu_count()} cpu, Python {platform.python_version()}, "
          f"{len(cases)} cases")
    print("| path | right | by category | p50 | p90 | asked again |\n|---|---|---|---|---|---|")
    for arm, outcomes in found.items():
        print(summary(arm, outcomes))
    arms = list(found)
    for index, case in enumerate(cases):
        verdicts = {arm: found[arm][index] for arm in arms}
        if len({o.wrong is None for o in verdicts.values()}) > 1 or any(o.wrong for o in verdicts.values()):
            print(f"{case.id}: {case.question}")
            for arm, outcome in verdicts.items():
                print(f"    {arm:6} {'right' if outcome.wrong is None else 'wrong: ' + outcome.wrong}; "
                      f"{outcome.said}{' [asked again]' if outcome.asked_again else ''}")


if __name__ == "__main__":
    main()
