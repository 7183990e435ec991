"""How well the local model calls tools: 32 prompts written for it, each needing one call.

For each prompt the model gets Pincer's built-in tools (all of them, as a
Brain offers them from a default pool) through `localmodel/server.py` and the Brain's own client. A case counts
as right on the first try when the first reply calls the expected tool with
arguments that pass the check, and the reply after the tool's (canned) result
is an answer in words that uses it, not another call. Latency is per reply.
Run (after the [local] extra and the model are in place):
    .venv/bin/python bench/local_tools.py --model /path/to/model.gguf
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bus.protocol import ToolSpec  # noqa: E402


def builtin_tools() -> list[ToolSpec]:
    """The tools a Brain offers from a default Hands pool: Pincer's built-ins, as the model sees them."""
    from hands.worker import build_registry

    return build_registry().brain_view()




@dataclass
class Case:
    prompt: str
    tool: str
    check: Callable[[dict[str, Any]], bool]
    result: str  # what the tool "returned"
    expect: str  # a word the answer must contain (from the result)


def has(key: str, *words: str) -> Callable[[dict[str, Any]], bool]:
    return lambda args: isinstance(args.get(key), str) and all(w.lower() in args[key].lower() for w in words)


CASES = [
    Case("What does notes.txt say?", "read_file", has("path", "notes.txt"), "buy milk", "milk"),
    Case("Show me the contents of src/main.py", "read_file", has("path", "main.py"), "print('hi')", "print"),
    Case("Read todo.md and tell me the first item.", "read_file", has("path", "todo.md"), "1. call Ana", "Ana"),
    Case("Open config/settings.yaml", "read_file", has("path", "settings.yaml"), "debug: true", "debug"),
    Case("What is written in README.md?", "read_file", has("path", "README.md"), "Pincer runs agents", "Pincer"),
    Case("Check what's inside data/report.csv", "read_file", has("path", "report.csv"), "q1,42", "42"),
    Case("Save the text 'hello world' to greeting.txt", "write_file", lambda a: has("path", "greeting.txt")(a)
         and has("content", "hello world")(a), "wrote 11 bytes", "greeting"),
    Case("Create a file named plan.md containing '# Plan'", "write_file", has("path", "plan.md"), "wrote 6 bytes",
         "plan"),
    Case("Write 'done' into status.txt", "write_file", lambda a: has("path", "status.txt")(a)
         and has("content", "done")(a), "wrote 4 bytes", "status"),
    Case("Put the line 'x=1' in vars.env", "write_file", has("content", "x=1"), "wrote 3 bytes", "vars"),
    Case("What files are in the src directory?", "list_directory", has("path", "src"), "main.py\nutil.py", "main.py"),
    Case("List the workspace's top folder.", "list_directory", lambda a: isinstance(a.get("path"), str), "docs\nsrc",
         "docs"),
    Case("Which files does the docs folder have?", "list_directory", has("path", "docs"), "index.md", "index"),
    Case("Show me what's in the tests directory", "list_directory", has("path", "tests"), "test_a.py", "test_a"),
    Case("Run `uname -a` and tell me the kernel.", "exec", has("command", "uname"), "Linux vm 6.1.0", "Linux"),
    Case("How much disk space is free? Use df -h.", "exec", has("command", "df"), "/dev/vda 40G 12G", "40G"),
    Case("Run the command `python3 --version`", "exec", has("command", "python3", "version"), "Python 3.11.7",
         "3.11"),
    Case("Count the lines of main.py with wc -l", "exec", has("command", "wc"), "12 main.py", "12"),
    Case("Execute `date` and tell me today's date.", "exec", has("command", "date"), "Tue Dec  1 2026", "Dec"),
    Case("Use git to show the current branch (git branch --show-current).", "exec", has("command", "git"), "main",
         "main"),
    Case("Fetch https://example.com and summarise it.", "web_fetch", has("url", "example.com"),
         "Example Domain. This domain is for use in examples.", "example"),
    Case("What does the page https://pincer.dev/docs say?", "web_fetch", has("url", "pincer.dev"),
         "Pincer docs: install with pipx", "pipx"),
    Case("Get the text of https://news.ycombinator.com", "web_fetch", has("url", "ycombinator"), "Hacker News top",
         "Hacker"),
    Case("Download https://httpbin.org/json and tell me the slideshow title.", "web_fetch", has("url", "httpbin"),
         '{"slideshow": {"title": "Sample Slide Show"}}', "Sample"),
    Case("Remember that my favourite colour is green (key: colour).", "memory_write",
         lambda a: has("content", "green")(a), "saved", "colour"),
    Case("Please note for later under 'meeting': Friday 10am.", "memory_write", has("content", "friday"), "saved",
         "meeting"),
    Case("Store the note 'deploy on Monday' with key deploy.", "memory_write", has("content", "monday"), "saved",
         "deploy"),
    Case("What did I ask you to remember under 'colour'?", "memory_read", has("key", "colo"), "green", "green"),
    Case("Recall my note called meeting.", "memory_read", has("key", "meeting"), "Friday 10am", "Friday"),
    Case("Look up the note with key 'deploy'.", "memory_read", has("key", "deploy"), "deploy on Monday", "Monday"),
    Case("Read the file a.txt", "read_file", has("path", "a.txt"), "alpha", "alpha"),
    Case("Run ls -la in the workspace", "exec", has("command", "ls"), "total 8\n-rw-r--r-- a.txt", "a.txt"),
]


def as_pincer_returns(case: Case, args: dict[str, Any]) -> str:
    """The canned result shaped as Pincer's built-in tool returns it (JSON, as the Brain passes it on)."""
    shaped: dict[str, Any] = {
        "read_file": {"path": args.get("path"), "content": case.result},
        "write_file": {"path": args.get("path"), "written": case.result},
        "list_directory": {"path": args.get("path"), "entries": case.result.split("\n")},
        "exec": {"exit_code": 0, "stdout": case.result, "stderr": ""},
        "web_fetch": {"url": args.get("url"), "status": 200, "text": case.result},
        "memory_write": {"key": args.get("key"), "saved": True},
        "memory_read": {"key": args.get("key"), "content": case.result},
    }[case.tool]
    return json.dumps(shaped, ensure_ascii=False)


async def run(api_base: str) -> dict[str, Any]:
    from brain.llm import LiteLLMClient

    tools = builtin_tools()
    client = LiteLLMClient(model="openai/local", api_base=api_base, api_key="local", timeout_s=300, retries=0,
                           openai_direct=True)

    async def ignore(_text: str) -> None:
        return None

    right, latencies, failures = 0, [], []
    for case in CASES:
        messages: list[dict[str, Any]] = [{"role": "user", "content": case.prompt}]
        started = time.perf_counter()
        first = await client.complete(messages, tools, ignore)
        latencies.append(time.perf_counter() - started)
        calls = first.tool_calls
        ok = len(calls) >= 1 and calls[0].name == case.tool and case.check(json.loads(calls[0].arguments))
        if ok:
            messages += [{"role": "assistant", "content": None, "tool_calls": [calls[0].to_openai()]},
                         {"role": "tool", "tool_call_id": calls[0].id,
                          "content": as_pincer_returns(case, json.loads(calls[0].arguments))}]
            started = time.perf_counter()
            second = await client.complete(messages, tools, ignore)
            latencies.append(time.perf_counter() - started)
            ok = not second.tool_calls and case.expect.lower() in second.text.lower()
            detail = second.text[:80]
        else:
            detail = f"{[(c.name, c.arguments) for c in calls]} {first.text[:60]!r}"
        right += ok
        if not ok:
            failures.append(f"{case.prompt!r}: {detail}")
    ordered = sorted(latencies)
    return {"right": right, "cases": len(CASES), "p50_s": statistics.median(ordered),
            "p90_s": ordered[int(len(ordered) * 0.9) - 1], "first_s": latencies[0], "failures": failures}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--api-base", help="a running local model server (else --model starts one)")
    parser.add_argument("--model", type=Path)
    args = parser.parse_args()
    if args.api_base:
        found = asyncio.run(run(args.api_base))
    else:
        import subprocess

        from bus.redis_server import free_port

        port = free_port()
        server = subprocess.Popen([sys.executable, "-m", "localmodel", "serve", "--model", str(args.model),
                                   "--port", str(port)], cwd=ROOT)
        try:
            import httpx

            for _ in range(600):
                try:
                    httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=1)
                    break
                except httpx.HTTPError:
                    time.sleep(0.5)
            found = asyncio.run(run(f"http://127.0.0.1:{port}/v1"))
        finally:
            server.terminate()
            server.wait(30)
    print(f"# {time.strftime('%Y-%m-%d')} {platform.node()} {os.cpu_count()} cpu, Python {platform.python_version()}")
    print(f"right on the first try: {found['right']}/{found['cases']} "
          f"({found['right'] / found['cases']:.0%}); latency per reply p50 {found['p50_s']:.2f} s, "
          f"p90 {found['p90_s']:.2f} s; the first reply (the whole prompt read afresh) {found['first_s']:.1f} s")
    for failure in found["failures"]:
        print("  missed:", failure)


if __name__ == "__main__":
    main()
