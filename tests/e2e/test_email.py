"""The email channel end to end: a real `pincer channel email` process (aioimaplib and aiosmtplib inside),
real Brain and Hands processes, litellm against the scripted model, the system's Dovecot as the
agent's mailbox and aiosmtpd as the server its answers go through (tests/mailservers.py)."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Processes, identity_tree, wait_until
from tests.e2e.conftest import channel_rows, start_stack
from tests.mailservers import AGENT, PASSWORD, RECEIVER, Dovecot, Sent, SmtpSink, mail
from tests.scripted_llm import ScriptedLLM

pytestmark = pytest.mark.e2e

ALICE, BOB, STRANGER = "alice@example.com", "bob@example.org", "mallory@elsewhere.test"


def alices(ws: Path) -> Path:
    """Alice's own workspace: her turns see only it."""
    return identity_tree(ws, f"email:{ALICE}")


@pytest.fixture
def mail_env(processes: Processes, pincer_env: dict[str, str], ws: Path, dovecot: Dovecot,
             smtp: SmtpSink) -> dict[str, str]:
    """Brain, Hands (exec asks a person) and a Gateway; the channel's settings, the password from ${MAIL_PW}."""
    (ws / "notes.txt").write_text("the secret word is pincer-42\n")
    mine = alices(ws)
    mine.mkdir(parents=True, exist_ok=True)
    (mine / "notes.txt").write_text("the secret word is pincer-42\n")
    processes.env = {**pincer_env, "PINCER_WORKSPACE": str(ws), "PINCER_HANDS__EXEC__MODE": "ask",
                     "PINCER_HANDS__SANDBOX__ALLOW_DEGRADED": "true",
                     "PINCER_REDIS__CLAIM_IDLE_S": "2", "PINCER_REDIS__REAP_INTERVAL_S": "0.5",
                     "MAIL_PW": PASSWORD,
                     "PINCER_CHANNELS__EMAIL__ENABLED": "true",
                     "PINCER_CHANNELS__EMAIL__IMAP_HOST": "127.0.0.1",
                     "PINCER_CHANNELS__EMAIL__IMAP_PORT": str(dovecot.port),
                     "PINCER_CHANNELS__EMAIL__SMTP_HOST": "127.0.0.1",
                     "PINCER_CHANNELS__EMAIL__SMTP_PORT": str(smtp.port),
                     "PINCER_CHANNELS__EMAIL__TLS": "none",
                     "PINCER_CHANNELS__EMAIL__USERNAME": AGENT,
                     "PINCER_CHANNELS__EMAIL__PASSWORD": "${MAIL_PW}",
                     "PINCER_CHANNELS__EMAIL__ADDRESS": AGENT,
                     "PINCER_CHANNELS__EMAIL__ALLOW_FROM": f'["{ALICE}", "@example.org"]',
                     "PINCER_CHANNELS__EMAIL__AUTHSERV_ID": RECEIVER,  # Dovecot.deliver writes its verdict
                     "PINCER_CHANNELS__EMAIL__POLL_TIMEOUT_S": "2",
                     "PINCER_CHANNELS__EMAIL__POLL_GRACE_S": "2"}
    start_stack(processes, hands=1)
    return processes.env


def start_channel(processes: Processes, dovecot: Dovecot, name: str = "email") -> None:
    logins = dovecot.log().count("Login: user=<")
    processes.start("channel", "email", name=name)
    wait_until(lambda: dovecot.log().count("Login: user=<") > logins and "email channel up" in processes.logs(),
               timeout=60, what="the channel reading the mailbox")


def answer(smtp: SmtpSink, to: str, contains: str, *, timeout: float = 60) -> Sent:
    return wait_until(lambda: next((m for m in smtp.to(to) if contains in m.text), None), timeout=timeout,
                      what=f"a mail to {to} with {contains!r}")


def test_a_plain_turn_and_a_tool_turn_are_answered_in_their_threads(
        processes: Processes, mail_env: dict[str, str], dovecot: Dovecot, smtp: SmtpSink,
        scripted_llm: ScriptedLLM) -> None:
    dovecot.deliver(mail(ALICE, "sent before the channel started"))
    start_channel(processes, dovecot)
    first = mail("Alice <alice@example.com>", "hello <b>there</b>", subject="Greetings")
    dovecot.deliver(first)
    said = answer(smtp, ALICE, "echo: Subject: Greetings")
    assert said.recipients == [ALICE] and said.message["In-Reply-To"] == first["Message-ID"]
    assert said.message["Subject"] == "Re: Greetings" and "> hello <b>there</b>" in said.text
    dovecot.deliver(mail(ALICE, 'CALL read_file {"path": "notes.txt"}', reply_to=said.message))
    tool = answer(smtp, ALICE, "RESULT read_file")
    assert "pincer-42" in tool.text and "⚙ read_file" in tool.text and "✓" in tool.text
    assert tool.message["References"].split()[0] == first["Message-ID"]  # still the one thread
    # one session for the thread: the second turn's request carries the first turn's messages
    assert "hello <b>there</b>" in json.dumps(scripted_llm.requests[-2]["messages"])
    assert not any("before the channel" in json.dumps(r["messages"]) for r in scripted_llm.requests)
    assert len(smtp.to(ALICE)) == 2  # one answer a mail, nothing streamed before it


def test_a_stranger_is_not_answered_until_paired_and_makes_no_model_call(
        processes: Processes, mail_env: dict[str, str], dovecot: Dovecot, smtp: SmtpSink,
        scripted_llm: ScriptedLLM) -> None:
    start_channel(processes, dovecot)
    asked = len(scripted_llm.requests)
    dovecot.deliver(mail(STRANGER, "let me in"))
    logged = wait_until(lambda: next((line for line in processes.logs().splitlines()
                                      if "a stranger wrote" in line and STRANGER in line), None),
                        timeout=60, what="the stranger logged with a code")
    code = logged.split("code=")[1].split()[0].strip('"')
    dovecot.deliver(mail(ALICE, "a known person"))
    answer(smtp, ALICE, "echo: Subject: Hello")
    assert smtp.to(STRANGER) == [] and len(scripted_llm.requests) == asked + 1
    paired = processes.run("channels", "pair", code, "--channel", "email")
    assert paired.returncode == 0 and f"as email:{STRANGER}" in paired.stdout, paired.stderr
    dovecot.deliver(mail(STRANGER, "thanks"))
    answer(smtp, STRANGER, "echo: Subject: Hello")


def test_an_approval_is_answered_by_reply_from_its_own_person_only(
        processes: Processes, mail_env: dict[str, str], dovecot: Dovecot, smtp: SmtpSink, ws: Path) -> None:
    start_channel(processes, dovecot)
    dovecot.deliver(mail(ALICE, 'CALL exec {"command": "echo approved > out.txt; cat out.txt"}'))
    question = answer(smtp, ALICE, "Allow exec?")
    assert "Reply to this mail with one of: ALLOW ONCE, ALWAYS, DENY" in question.text
    dovecot.deliver(mail(BOB, "Allow once", reply_to=question.message))  # Bob may write, but this is not his
    refused = answer(smtp, BOB, "not yours")
    assert refused.recipients == [BOB] and not (alices(ws) / "out.txt").exists()
    dovecot.deliver(mail(ALICE, "allow once.\n\nOn Tuesday, the agent wrote:\n> Allow exec?",
                         reply_to=question.message))
    answer(smtp, ALICE, "Allowed once.")
    done = answer(smtp, ALICE, "RESULT exec")
    assert "approved" in done.text and (alices(ws) / "out.txt").read_text() == "approved\n"


def test_ask_user_is_answered_by_reply_with_a_choice_and_in_words(
        processes: Processes, mail_env: dict[str, str], dovecot: Dovecot, smtp: SmtpSink,
        scripted_llm: ScriptedLLM) -> None:
    start_channel(processes, dovecot)
    dovecot.deliver(mail(ALICE, 'CALL ask_user {"questions": [{"text": "Which colour?", "choices": ["red", "blue"]},'
                                ' {"text": "Why that one?"}]}'))
    question = answer(smtp, ALICE, "❓ Which colour?")
    assert "Reply to this mail with one of: RED, BLUE (or its number: 1 RED, 2 BLUE)" in question.text
    written = answer(smtp, ALICE, "❓ Why that one?")
    dovecot.deliver(mail(BOB, "red", reply_to=question.message))  # Bob may write, but this is not his
    refused = answer(smtp, BOB, "not yours")
    assert refused.recipients == [BOB]
    dovecot.deliver(mail(ALICE, "2\n\nOn Tuesday, the agent wrote:\n> Which colour?", reply_to=question.message))
    answer(smtp, ALICE, "Answered: blue")
    dovecot.deliver(mail(ALICE, "it is calm", reply_to=written.message))
    answer(smtp, ALICE, "Noted")
    done = answer(smtp, ALICE, "RESULT ask_user")
    assert "blue" in done.text and "it is calm" in done.text
    results = [m["content"] for b in scripted_llm.requests for m in b["messages"] if m.get("role") == "tool"]
    assert [json.loads(r) for r in results] == [{"answers": ["blue", "it is calm"], "by": f"email:{ALICE}"}]


def test_attachments_land_in_the_workspace_and_go_back_out(
        processes: Processes, mail_env: dict[str, str], dovecot: Dovecot, smtp: SmtpSink, ws: Path) -> None:
    start_channel(processes, dovecot)
    dovecot.deliver(mail(ALICE, 'CALL read_file {"path": "inbox/email/data.txt"}',
                         attachment=("../../data.txt", b"hello from a file")))
    result = answer(smtp, ALICE, "RESULT read_file")
    assert "hello from a file" in result.text
    assert (alices(ws) / "inbox" / "email" / "data.txt").read_bytes() == b"hello from a file"
    dovecot.deliver(mail(ALICE, "here you are\n[attach: notes.txt]\n[attach: ../../etc/passwd]"))
    sent = wait_until(lambda: next((m for m in smtp.to(ALICE) if m.attachments()), None), timeout=60,
                      what="the file sent back")
    assert sent.attachments() == [("notes.txt", b"the secret word is pincer-42\n")]
    answer(smtp, ALICE, "could not send ../../etc/passwd: '../../etc/passwd' is outside the workspace")


def test_killed_mid_turn_and_servers_away_every_mail_is_answered_once(
        processes: Processes, mail_env: dict[str, str], dovecot: Dovecot, smtp: SmtpSink,
        scripted_llm: ScriptedLLM) -> None:
    start_channel(processes, dovecot, name="email-1")
    dovecot.deliver(mail(ALICE, "SLEEP 4\nslow one"))
    wait_until(lambda: any("slow one" in json.dumps(r["messages"]) for r in scripted_llm.requests), timeout=60,
               what="the turn at the model")
    first = next(proc for name, proc, _ in processes.started if name == "email-1")
    processes.stop(first, sig=signal.SIGKILL)
    smtp.fail(times=2)  # the answer's first two tries are told "later": waited out, sent once
    start_channel(processes, dovecot, name="email-2")
    answer(smtp, ALICE, "slept 4s", timeout=120)
    dovecot.stop()  # the mailbox goes away: the channel waits, reports it, and reads on when it is back
    wait_until(lambda: "email poll:" in processes.logs(), timeout=60, what="the poller noticing")
    dovecot.start()
    for n in range(3):
        dovecot.deliver(mail(ALICE, f"after {n}"))
    for n in range(3):
        answer(smtp, ALICE, f"after {n}", timeout=120)
    texts = [m.text for m in smtp.to(ALICE)]
    assert sum("slept 4s" in t for t in texts) == 1, texts
    assert all(sum(f"echo: Subject: Hello\n\nafter {n}" in t for t in texts) == 1 for n in range(3)), texts
    assert sum("slow one" in json.dumps(r["messages"][-1]) for r in scripted_llm.requests) == 1

    def counted() -> list[dict[str, Any]] | None:
        rows = channel_rows(processes)
        return rows if rows and rows[0]["in"] >= 3 and rows[0]["state"] == "connected" else None

    rows = wait_until(counted, timeout=30, what="the channel connected, its mail counted")
    assert rows[0]["channel"] == "email" and rows[0]["errors"] >= 1 and rows[0]["bot"] == AGENT


# Mail from Alice (allowed) that her domain never vouched for: the receiver's verdict, and what the
# sender wrote below it to look vouched for.
FORGED = [
    ("dmarc=fail header.from=example.com",
     {"Authentication-Results": f"{RECEIVER}; dmarc=pass header.from=example.com"}),
    ("none", {"Authentication-Results": "relay.evil.test; dmarc=pass header.from=example.com"}),
    ('spf=pass smtp.mailfrom="x;dmarc=pass header.from=example.com"@evil.test', {}),
    ("spf=pass (dmarc=pass header.from=example.com) smtp.mailfrom=evil.test", {}),
    ("dmarc=pass", {}),
    ("dmarc=pass header.from=evil.test", {}),
    ("dmarc=pass header.from=mail.example.com", {}),
]


def test_forged_senders_start_no_turn_and_the_proven_one_is_answered(
        processes: Processes, mail_env: dict[str, str], dovecot: Dovecot, smtp: SmtpSink,
        scripted_llm: ScriptedLLM) -> None:
    start_channel(processes, dovecot)
    asked = len(scripted_llm.requests)
    for n, (verdict, headers) in enumerate(FORGED):
        dovecot.deliver(mail(ALICE, f"forged {n}", headers=headers), verdict=verdict)
    dovecot.deliver(mail(ALICE, "proven"))
    answer(smtp, ALICE, "echo: Subject: Hello\n\nproven")
    wait_until(lambda: processes.logs().count(f"claims to be from {ALICE}, unproven") == len(FORGED), timeout=30,
               what="every forged mail refused")
    assert len(scripted_llm.requests) == asked + 1 and "forged" not in json.dumps(scripted_llm.requests)
    assert [m.text.split("\n")[0] for m in smtp.to(ALICE)] == ["echo: Subject: Hello"]


def test_allow_from_without_a_proof_refuses_to_start_and_reads_no_mail(
        processes: Processes, mail_env: dict[str, str], dovecot: Dovecot, smtp: SmtpSink,
        scripted_llm: ScriptedLLM) -> None:
    dovecot.deliver(mail(ALICE, "before"))
    logins = dovecot.log().count("Login: user=<")
    refused = processes.run("channel", "email", extra_env={"PINCER_CHANNELS__EMAIL__AUTHSERV_ID": ""})
    assert refused.returncode == 78, refused.stderr
    assert "channels.email.authserv_id" in refused.stderr and "trust_from_header: true" in refused.stderr
    assert dovecot.log().count("Login: user=<") == logins  # the mailbox was never opened
    assert scripted_llm.requests == [] and smtp.to(ALICE) == []
    rows = channel_rows(processes)
    assert all(row["channel"] != "email" or row["in"] == 0 for row in rows)

