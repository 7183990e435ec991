"""The Telegram channel under a day's traffic, compressed: its memory must stay flat and every message be
answered exactly once through outages.

A private redis-server, the tests' scripted model in its own process, real `pincer brain`, `pincer hands`
and `pincer channel telegram` processes, and the tests' local Bot API server (tests/fake_telegram.py)
playing ``--users`` people who send ``--updates`` messages in waves (saying /new every ``--new-every``,
as people start fresh conversations: a session hundreds of turns long measures the model's context,
not the channel). Every ``--outage-every`` messages
the API fails: three 502s on getUpdates and a 429 (retry_after 1) on sendMessage; every third outage
the polls hang for 3 s instead. The channel's resident memory is read from /proc after a warm-up
(the first tenth answered) and at the end. Run: .venv/bin/python bench/channel_soak.py
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
from bus.redis_server import EmbeddedRedis  # noqa: E402
from tests.fake_telegram import TOKEN, FakeTelegram  # noqa: E402


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def answered(telegram: FakeTelegram, users: list[int]) -> dict[str, int]:
    """How often each message's echo was shown (a message edited to its final text counts once)."""
    seen: dict[str, int] = {}
    for user in users:
        for sent in telegram.to(user):
            if sent.text.startswith("echo: m"):
                key = sent.text.removeprefix("echo: ")
                seen[key] = seen.get(key, 0) + 1
    return seen


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--updates", type=int, default=3000)
    parser.add_argument("--users", type=int, default=20)
    parser.add_argument("--wave", type=int, default=40, help="messages sent at once")
    parser.add_argument("--outage-every", type=int, default=250)
    parser.add_argument("--new-every", type=int, default=20, help="each person says /new after this many messages")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="pincer-soak-"))
    redis = EmbeddedRedis(tmp / "redis")
    url = redis.start()
    llm = ScriptedModel()
    telegram = FakeTelegram().start()
    users = [100_000 + n for n in range(args.users)]
    (tmp / "workspace").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PINCER_")}
    env.update({
        "PINCER_REDIS_URL": url, "PINCER_MODEL": "openai/scripted", "PINCER_LLM_API_BASE": llm.api_base,
        "PINCER_LLM_API_KEY": "sk-scripted", "PINCER_BRAIN__LLM_RETRIES": "0",
        "PINCER_WORKSPACE": str(tmp / "workspace"), "PINCER_DATA_DIR": str(tmp / "data"),
        "PINCER_RUNTIME__LOG_LEVEL": "WARNING",
        "PYTHONPATH": str(ROOT), "PINCER_HANDS__SKILL_DIRS": f'["{ROOT / "skills"}"]',
        "PINCER_BRAIN__MAX_TURNS": "64", "PINCER_BRAIN__MAX_WAITING": "256",
        "PINCER_GATEWAY__LIMITS__MESSAGES_PER_MINUTE": "100000", "PINCER_GATEWAY__LIMITS__BURST": "10000",
        "PINCER_CHANNELS__TELEGRAM__BOT_TOKEN": TOKEN, "PINCER_CHANNELS__TELEGRAM__API_URL": telegram.api_url,
        "PINCER_CHANNELS__TELEGRAM__ALLOW_FROM": "[" + ",".join(f'"{u}"' for u in users) + "]",
        "PINCER_CHANNELS__TELEGRAM__POLL_TIMEOUT_S": "1", "PINCER_CHANNELS__TELEGRAM__POLL_GRACE_S": "2",
        "PINCER_CHANNELS__TELEGRAM__EDIT_INTERVAL_S": "0.5",
    })
    procs = [subprocess.Popen([sys.executable, "-m", "gateway", *role], env=env, cwd=tmp, stdout=subprocess.DEVNULL,
                              stderr=(tmp / f"{role[0]}.log").open("wb"))
             for role in (["brain"], ["hands"], ["channel", "telegram"])]
    channel = procs[-1]
    try:
        deadline = time.monotonic() + 60
        while not telegram.calls_of("getUpdates"):
            if time.monotonic() > deadline:
                raise SystemExit(f"the channel did not start polling (logs in {tmp})")
            time.sleep(0.1)
        started = time.monotonic()
        warm = None
        outages = 0
        for n in range(args.updates):
            user = users[n % len(users)]
            if n // len(users) % args.new_every == args.new_every - 1 and n % len(users) == 0:
                for person in users:  # people start fresh conversations now and then: sessions stay short
                    telegram.say(person, "/new")
            telegram.say(user, f"m{n}")
            if n and n % args.outage_every == 0:
                outages += 1
                if outages % 3 == 0:
                    telegram.hang(3)
                else:
                    telegram.fail("getUpdates", 502, times=3)
                    telegram.fail("sendMessage", 429, times=1, retry_after=1)
            if (n + 1) % args.wave == 0:
                while len(answered(telegram, users)) < n + 1 - args.wave:  # at most two waves in flight
                    time.sleep(0.25)  # the count reads every message sent: not too often, or it starves the server
            if warm is None and len(answered(telegram, users)) >= args.updates // 10:
                warm = rss_mb(channel.pid)
        while len(answered(telegram, users)) < args.updates:
            if time.monotonic() - started > 3600:
                raise SystemExit("not every message was answered within an hour")
            time.sleep(0.2)
        elapsed = time.monotonic() - started
        end = rss_mb(channel.pid)
        seen = answered(telegram, users)
        twice = sum(1 for count in seen.values() if count > 1)
        print(f"{platform.node()} · {os.cpu_count()} CPUs · Python {platform.python_version()} · "
              f"{time.strftime('%Y-%m-%d')}")
        print(f"{args.updates} messages from {args.users} people in {elapsed:.0f} s "
              f"({args.updates / elapsed:.1f}/s), {outages} outages")
        print(f"answered: {len(seen)}, more than once: {twice}")
        print(f"channel RSS: {warm:.1f} MB after warm-up, {end:.1f} MB at the end "
              f"({(end - (warm or end)) / (warm or end) * 100:+.1f}%)")
        print(f"getUpdates calls: {len(telegram.calls_of('getUpdates'))}, most at once: {telegram.most_polls_at_once}")
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(30)
        telegram.stop()
        llm.stop()
        redis.stop()


if __name__ == "__main__":
    main()
