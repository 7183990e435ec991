"""A chat channel under a day's traffic, compressed: its memory must stay flat and every message be answered
exactly once through outages. ``--platform`` picks the channel: telegram, slack, discord (the tests' local
servers speaking each platform's protocol), email (the system's Dovecot and aiosmtpd) or matrix (Synapse).

A private redis-server, the tests' scripted model in its own process, real `pincer brain`, `pincer hands`
and `pincer channel NAME` processes, and ``--users`` people who send ``--updates`` messages in waves
(saying /new every ``--new-every``, as people start fresh conversations: a session hundreds of turns
long measures the model's context, not the channel; an email is a thread of its own anyway). Every
``--outage-every`` messages the platform fails the way it does (below, per platform); every third
outage is the harder kind. The channel's resident memory is read from /proc after a warm-up (the
first tenth answered) and at the end. Run: .venv/bin/python bench/channel_soak.py --platform slack
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.gateway_turns import ScriptedModel  # noqa: E402
from bus.redis_server import EmbeddedRedis  # noqa: E402

if TYPE_CHECKING:
    from tests.matrix_server import Person


def placed(url: str, platform: str) -> bool:
    """Whether a polled channel has stored its first offset: its first poll only learns where "now" is,
    so what is sent before it is history, never answered (Slack and Discord push: no offset)."""
    if platform in ("slack", "discord"):
        return True
    import redis

    client = redis.Redis.from_url(url)
    try:
        return any(client.scan_iter(match=f"pincer:channel:{platform}:*:offset", count=1000))
    finally:
        client.close()


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def tally(texts: list[str], prefix: str) -> dict[str, int]:
    """How often each message's echo was shown (a message edited to its final text counts once)."""
    seen: dict[str, int] = {}
    for text in texts:
        found = text.find(prefix)
        if found >= 0:
            key = text[found + len(prefix):].split()[0]
            seen[key] = seen.get(key, 0) + 1
    return seen


class Side(Protocol):
    """The people's side of one platform: its server, its people, their messages and its outages."""

    outages: str  # what an outage is, for the results

    def env(self, users: int) -> dict[str, str]: ...
    def ready(self) -> bool: ...
    def say(self, user: int, text: str) -> None: ...
    def answered(self) -> dict[str, int]: ...
    def outage(self, hard: bool) -> None: ...
    def close(self) -> None: ...


class TelegramSide:
    outages = "three 502s on getUpdates and a 429 (retry_after 1) on sendMessage; hard: polls hang 3 s"

    def __init__(self) -> None:
        from tests.fake_telegram import FakeTelegram

        self.fake = FakeTelegram().start()
        self.users: list[int] = []

    def env(self, users: int) -> dict[str, str]:
        from tests.fake_telegram import TOKEN

        self.users = [100_000 + n for n in range(users)]
        return {"PINCER_CHANNELS__TELEGRAM__BOT_TOKEN": TOKEN, "PINCER_CHANNELS__TELEGRAM__API_URL": self.fake.api_url,
                "PINCER_CHANNELS__TELEGRAM__ALLOW_FROM": json.dumps([str(u) for u in self.users]),
                "PINCER_CHANNELS__TELEGRAM__POLL_TIMEOUT_S": "1", "PINCER_CHANNELS__TELEGRAM__POLL_GRACE_S": "2",
                "PINCER_CHANNELS__TELEGRAM__EDIT_INTERVAL_S": "0.5"}

    def ready(self) -> bool:
        return bool(self.fake.calls_of("getUpdates"))

    def say(self, user: int, text: str) -> None:
        self.fake.say(self.users[user], text)

    def answered(self) -> dict[str, int]:
        return tally([s.text for u in self.users for s in self.fake.to(u)], "echo: ")

    def outage(self, hard: bool) -> None:
        if hard:
            self.fake.hang(3)
        else:
            self.fake.fail("getUpdates", 502, times=3)
            self.fake.fail("sendMessage", 429, times=1, retry_after=1)

    def close(self) -> None:
        self.fake.stop()


class SlackSide:
    outages = "a 429 (Retry-After 1) on chat.postMessage and Slack's disconnect refresh; hard: connections cut 3 s"

    def __init__(self) -> None:
        from tests.fake_slack import FakeSlack

        self.fake = FakeSlack().start()
        self.users: list[str] = []

    def env(self, users: int) -> dict[str, str]:
        from tests.fake_slack import APP_TOKEN, BOT_TOKEN

        self.users = [f"U{n:08d}" for n in range(users)]
        return {"PINCER_CHANNELS__SLACK__BOT_TOKEN": BOT_TOKEN, "PINCER_CHANNELS__SLACK__APP_TOKEN": APP_TOKEN,
                "PINCER_CHANNELS__SLACK__API_URL": self.fake.api_url,
                "PINCER_CHANNELS__SLACK__ALLOW_FROM": json.dumps(self.users),
                "PINCER_CHANNELS__SLACK__EDIT_INTERVAL_S": "0.5"}

    def ready(self) -> bool:
        return self.fake.connections_opened > 0

    def say(self, user: int, text: str) -> None:
        self.fake.say(self.users[user], text)

    def answered(self) -> dict[str, int]:
        return tally([p.text for p in list(self.fake.posted)], "echo: ")

    def outage(self, hard: bool) -> None:
        if hard:
            self.fake.cut(3)
        else:
            self.fake.fail("chat.postMessage", status=429, error="ratelimited", retry_after=1)
            self.fake.disconnect()

    def close(self) -> None:
        self.fake.stop()


class DiscordSide:
    outages = "Discord's RECONNECT (the session resumed); hard: connections cut 3 s"

    def __init__(self) -> None:
        from tests.fake_discord import FakeDiscord

        self.fake = FakeDiscord().start()
        self.users: list[str] = []

    def env(self, users: int) -> dict[str, str]:
        from tests.fake_discord import TOKEN

        self.users = [str(3_000_000_000_000_000_000 + n) for n in range(users)]
        return {"PINCER_CHANNELS__DISCORD__BOT_TOKEN": TOKEN, "PINCER_CHANNELS__DISCORD__API_URL": self.fake.api_url,
                "PINCER_CHANNELS__DISCORD__ALLOW_FROM": json.dumps(self.users),
                "PINCER_CHANNELS__DISCORD__EDIT_INTERVAL_S": "0.5"}

    def ready(self) -> bool:
        return self.fake.identifies > 0

    def say(self, user: int, text: str) -> None:
        self.fake.say(self.users[user], text)

    def answered(self) -> dict[str, int]:
        return tally([s.content for s in list(self.fake.sent)], "echo: ")

    def outage(self, hard: bool) -> None:
        if hard:
            self.fake.cut(3)
        else:
            self.fake.reconnect()

    def close(self) -> None:
        self.fake.stop()


class EmailSide:
    outages = "two 451s from the SMTP server; hard: Dovecot restarted"

    def __init__(self) -> None:
        from tests.mailservers import Dovecot, SmtpSink

        self.dovecot, self.smtp = Dovecot().start(), SmtpSink().start()
        self.users: list[str] = []
        self._read, self._seen = 0, {}  # sent mail already tallied (each is parsed once)

    def env(self, users: int) -> dict[str, str]:
        from tests.mailservers import AGENT, PASSWORD

        self.users = [f"person{n}@example.com" for n in range(users)]
        prefix = "PINCER_CHANNELS__EMAIL__"
        return {f"{prefix}IMAP_HOST": "127.0.0.1", f"{prefix}IMAP_PORT": str(self.dovecot.port),
                f"{prefix}SMTP_HOST": "127.0.0.1", f"{prefix}SMTP_PORT": str(self.smtp.port),
                f"{prefix}TLS": "none", f"{prefix}USERNAME": AGENT, f"{prefix}PASSWORD": PASSWORD,
                f"{prefix}ADDRESS": AGENT, f"{prefix}ALLOW_FROM": json.dumps(self.users),
                f"{prefix}POLL_TIMEOUT_S": "2", f"{prefix}POLL_GRACE_S": "3"}

    def ready(self) -> bool:
        return "Login: user=<" in self.dovecot.log()

    def say(self, user: int, text: str) -> None:
        from tests.mailservers import mail

        if text != "/new":  # a new mail is a new thread, a session of its own
            self.dovecot.deliver(mail(self.users[user], text))

    def answered(self) -> dict[str, int]:
        new = list(self.smtp.messages[self._read:])
        self._read += len(new)
        for key, count in tally([m.text for m in new], "Subject: Hello\n\n").items():
            self._seen[key] = self._seen.get(key, 0) + count
        return dict(self._seen)

    def outage(self, hard: bool) -> None:
        if hard:
            self.dovecot.stop()
            self.dovecot.start()
        else:
            self.smtp.fail(times=2)

    def close(self) -> None:
        self.smtp.stop()
        self.dovecot.close()


class MatrixSide:
    outages = "none but the hard kind: Synapse restarted"

    def __init__(self) -> None:
        from tests.matrix_server import Synapse

        self.synapse = Synapse().start()
        self.bot = self.synapse.register("pincer")
        self.people: list[tuple[Person, str]] = []

    def env(self, users: int) -> dict[str, str]:
        self._users = users
        return {"PINCER_CHANNELS__MATRIX__HOMESERVER": self.synapse.url,
                "PINCER_CHANNELS__MATRIX__USER_ID": self.bot.user_id,
                "PINCER_CHANNELS__MATRIX__ACCESS_TOKEN": self.bot.token,
                "PINCER_CHANNELS__MATRIX__ALLOW_FROM": json.dumps(
                    [f"@person{n}:localhost" for n in range(users)]),
                "PINCER_CHANNELS__MATRIX__POLL_TIMEOUT_S": "2", "PINCER_CHANNELS__MATRIX__POLL_GRACE_S": "3",
                "PINCER_CHANNELS__MATRIX__EDIT_INTERVAL_S": "0.5"}

    def ready(self) -> bool:
        if not self.people:
            people = [self.synapse.register(f"person{n}") for n in range(self._users)]
            self.people = [(p, p.room(self.bot.user_id)) for p in people]
        return all(self.bot.user_id in p.joined(room) for p, room in self.people)

    def say(self, user: int, text: str) -> None:
        person, room = self.people[user]
        person.say(room, text)

    def answered(self) -> dict[str, int]:
        texts: list[str] = []
        for person, room in self.people:
            texts += person.texts(room)
        return tally(texts, "echo: ")

    def outage(self, hard: bool) -> None:
        if hard:
            self.synapse.stop()
            self.synapse.start()

    def close(self) -> None:
        self.synapse.close()


SIDES = {"telegram": TelegramSide, "slack": SlackSide, "discord": DiscordSide, "email": EmailSide,
         "matrix": MatrixSide}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--platform", choices=sorted(SIDES), default="telegram")
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
    side: Side = SIDES[args.platform]()
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
        **side.env(args.users),
    })
    procs = [subprocess.Popen([sys.executable, "-m", "gateway", *role], env=env, cwd=tmp, stdout=subprocess.DEVNULL,
                              stderr=(tmp / f"{role[0]}.log").open("wb"))
             for role in (["brain"], ["hands"], ["channel", args.platform])]
    channel = procs[-1]
    try:
        deadline = time.monotonic() + 120
        while not side.ready() or not placed(url, args.platform):
            if time.monotonic() > deadline:
                raise SystemExit(f"the channel did not start (logs in {tmp})")
            time.sleep(0.2)
        started = time.monotonic()
        warm = None
        outages = 0
        for n in range(args.updates):
            user = n % args.users
            if n // args.users % args.new_every == args.new_every - 1 and user == 0:
                for person in range(args.users):  # people start fresh conversations now and then
                    side.say(person, "/new")
            side.say(user, f"m{n}")
            if n and n % args.outage_every == 0:
                outages += 1
                side.outage(hard=outages % 3 == 0)
            if (n + 1) % args.wave == 0:
                while len(side.answered()) < n + 1 - args.wave:  # at most two waves in flight
                    time.sleep(0.25)
            if warm is None and len(side.answered()) >= args.updates // 10:
                warm = rss_mb(channel.pid)
        while len(side.answered()) < args.updates:
            if time.monotonic() - started > 3600:
                raise SystemExit(f"not every message was answered within an hour (logs in {tmp})")
            time.sleep(0.5)
        elapsed = time.monotonic() - started
        end = rss_mb(channel.pid)
        seen = side.answered()
        twice = sum(1 for count in seen.values() if count > 1)
        print(f"{args.platform} · {platform.node()} · {os.cpu_count()} CPUs · Python {platform.python_version()} · "
              f"{time.strftime('%Y-%m-%d')}")
        print(f"{args.updates} messages from {args.users} people in {elapsed:.0f} s "
              f"({args.updates / elapsed:.1f}/s), {outages} outages ({side.outages})")
        print(f"answered: {len(seen)}, more than once: {twice}")
        print(f"channel RSS: {warm:.1f} MB after warm-up, {end:.1f} MB at the end "
              f"({(end - (warm or end)) / (warm or end) * 100:+.1f}%)")
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(30)
        side.close()
        llm.stop()
        redis.stop()


if __name__ == "__main__":
    main()
