"""Pincer's own eval corpus (evals/): the conversations, the scripted model that answers them, and the
workspace they run in. ``python -m tests.eval_corpus`` records them again (after a deliberate change to
what the model is sent: the instructions, a tool's schema, the context's layout); tests/integration/
test_eval_corpus.py replays them offline through `pincer eval` on every test run.

Each conversation runs through a real Brain and a real Hands worker on a real Redis, configured by the
repository's config.yaml (no environment), as the owner; the model is a script keyed by the person's
message, answering each step of the turn in order, its usage a function of the request's length.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from brain.config import BrainSettings
from brain.llm import Completion, ToolCall
from brain.testing import FunctionModel
from brain.worker import BrainWorker
from bus.config import Config, load_config
from bus.protocol import ChatError, ChatMessage, ChatReply
from bus.redis_server import EmbeddedRedis
from bus.replies import ReplyInbox
from bus.streams import Bus
from hands.config import HandsSettings
from hands.worker import HandsWorker
from memory.flight import FlightRecorder

ROOT = Path(__file__).resolve().parent.parent
EVALS = ROOT / "evals"
SENDER = "owner"

FILES = {
    "notes.txt": "Buy milk. Call Ana at 5. The boiler code is 4471.\n",
    "todo.md": "# Todo\n- renew passport\n- book dentist\n",
    "data/prices.csv": "item,price\ntea,3.20\ncoffee,4.10\n",
}

Step = list[tuple[str, dict[str, Any]]] | str  # tool calls to make, or the answer ("{result}": the last result)

# Each conversation: its session name and its messages; each message's turn: its steps, in order.
CONVERSATIONS: dict[str, list[tuple[str, list[Step]]]] = {
    "greeting": [("hello", ["Hello! I am Pincer. What can I do for you?"])],
    "reads-a-note": [("what does notes.txt say?", [[("read_file", {"path": "notes.txt"})],
                                                   "notes.txt says: {result}"])],
    "lists-then-reads": [("what is in data/, and what does tea cost?", [
        [("list_directory", {"path": "data"}), ("read_file", {"path": "data/prices.csv"})],
        "data/ holds prices.csv; tea costs 3.20."])],
    "writes-then-checks": [("add 'water plants' to todo.md", [
        [("read_file", {"path": "todo.md"})],
        [("write_file", {"path": "todo.md", "content": "# Todo\n- renew passport\n- book dentist\n- water plants\n"})],
        [("read_file", {"path": "todo.md"})],
        "Added: todo.md now ends with 'water plants'."])],
    "missing-file": [("open plans.txt", [[("read_file", {"path": "plans.txt"})],
                                         "plans.txt does not exist in the workspace."])],
    "two-turns": [("what is the boiler code?", [[("read_file", {"path": "notes.txt"})],
                                                "The boiler code is 4471."]),
                  ("and who do I call at 5?", ["Ana, at 5."])],
}


def script(messages: list[dict[str, Any]], _tools: Any) -> Completion:
    """The step of the asked message's turn that the messages since it have reached."""
    asked = max(i for i, m in enumerate(messages) if m["role"] == "user")
    text = messages[asked]["content"]
    steps = next(turn for conversation in CONVERSATIONS.values() for said, turn in conversation if said == text)
    step = steps[sum(m["role"] == "assistant" for m in messages[asked + 1:])]
    prompt = sum(len(str(m.get("content") or "")) for m in messages) // 4 + 20 * len(messages)
    usage = {"prompt_tokens": prompt, "completion_tokens": 12, "cached_tokens": prompt * 3 // 4 if asked > 1 else 0}
    if isinstance(step, str):
        last = messages[-1]
        result = json.loads(last["content"]).get("content", "") if last["role"] == "tool" else ""
        return Completion(text=step.replace("{result}", str(result).strip()), model="scripted", usage=usage)
    calls = [ToolCall(id=f"call_{len(messages)}_{n}", name=name, arguments=json.dumps(args))
             for n, (name, args) in enumerate(step)]
    return Completion(tool_calls=calls, model="scripted", usage=usage)


def corpus_config() -> Config:
    return load_config(ROOT / "config.yaml", env={})


def fill(workspace: Path) -> None:
    for name, text in FILES.items():
        (workspace / name).parent.mkdir(parents=True, exist_ok=True)
        (workspace / name).write_text(text)


@asynccontextmanager
async def hands(bus: Bus, workspace: Path) -> AsyncIterator[HandsWorker]:
    """A Hands worker as the corpus was recorded with: config.yaml's, in ``workspace`` (filled)."""
    fill(workspace)
    settings = corpus_config().section("hands", HandsSettings).model_copy(update={"workspace": workspace})
    worker = HandsWorker(bus, settings, worker_id="hands-corpus", heartbeat_s=0.5)
    stop = asyncio.Event()
    running = asyncio.create_task(worker.run(stop))
    try:
        yield worker
    finally:
        stop.set()
        await running


async def record(bus: Bus, workspace: Path) -> dict[str, list[str]]:
    """Every conversation, run and exported: session name -> the lines of its recording."""
    settings = corpus_config().section("brain", BrainSettings)
    inbox = ReplyInbox(bus, "corpus-client", block_ms=200)
    await inbox.start()
    brain = BrainWorker(bus, settings, instance_id="brain-corpus", llm=FunctionModel(script), heartbeat_s=0.5)
    stop = asyncio.Event()
    async with hands(bus, workspace):
        running = asyncio.create_task(brain.run(stop))
        try:
            for name, conversation in CONVERSATIONS.items():
                for text, _ in conversation:
                    message = ChatMessage(session_id=f"{SENDER}/{name}", text=text, reply_to=inbox.stream,
                                          sender=SENDER)
                    async with inbox.expect(message.message_id) as queue:
                        await bus.publish(bus.keys.brain_inbox, message)
                        while not isinstance(event := await queue.get(), (ChatReply, ChatError)):
                            pass
                    if isinstance(event, ChatError):
                        raise RuntimeError(f"{name}: {event.code.value}: {event.message}")
        finally:
            stop.set()
            await running
            await inbox.close()
    recorder = FlightRecorder(bus.redis, bus.keys, keep_s=600)
    return {name: await recorder.export(f"{SENDER}/{name}") for name in CONVERSATIONS}


async def _record_all(url: str, workspace: Path) -> None:
    bus = Bus.from_settings(corpus_config().redis, url)
    try:
        for name, lines in (await record(bus, workspace)).items():
            header = json.loads(lines[0])
            header.pop("exported_at", None)  # a recording made again differs only where something changed
            (EVALS / "recordings" / f"{name}.jsonl").write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
            print(f"recorded {name}: {len(lines) - 1} lines")
    finally:
        await bus.close()


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "ws").mkdir()
        redis = EmbeddedRedis(Path(tmp) / "redis")
        url = redis.start()
        try:
            asyncio.run(_record_all(url, Path(tmp) / "ws"))
        finally:
            redis.stop()


if __name__ == "__main__":
    sys.exit(main())
