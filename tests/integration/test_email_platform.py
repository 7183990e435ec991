"""The email channel's platform calls against real servers: the system's Dovecot (IMAP, IDLE, TLS) and
aiosmtpd (SMTP, STARTTLS and implicit TLS), with the thread book in a real Redis."""

from __future__ import annotations

from pathlib import Path

import pytest

from bus.streams import Bus
from gateway.channels.config import EmailSettings
from gateway.channels.errors import PlatformAway, PlatformRefused
from gateway.channels.mail import Email
from tests.conftest import wait_until
from tests.mailservers import AGENT, PASSWORD, RECEIVER, Dovecot, SmtpSink, mail

ALICE = "alice@example.com"


def settings(dovecot: Dovecot, smtp: SmtpSink, **changes: object) -> EmailSettings:
    return EmailSettings.model_validate({
        "enabled": True, "imap_host": "127.0.0.1", "imap_port": dovecot.port, "smtp_host": "127.0.0.1",
        "smtp_port": smtp.port, "username": AGENT, "password": PASSWORD, "tls": "none", "address": AGENT,
        "allow_from": [ALICE], "poll_timeout_s": 2, "authserv_id": RECEIVER, **changes})


async def test_new_mail_becomes_an_update_and_the_answer_goes_back_in_its_thread(
        dovecot: Dovecot, smtp: SmtpSink, bus: Bus) -> None:
    dovecot.deliver(mail(ALICE, "old mail, before the channel started"))
    email = Email(settings(dovecot, smtp), bus)
    await email.start()
    try:
        offset, updates = await email.poll("")
        assert updates == [] and offset.endswith(":1")  # mail already there is not answered
        sent = mail("Alice <Alice@Example.com>", "What is the time?\n\nOn Monday, Bob wrote:\n> quoted history",
                    subject="A question")
        dovecot.deliver(sent)
        offset, updates = await email.poll(offset)
        assert offset.endswith(":2") and len(updates) == 1
        update = updates[0]
        assert update.user == ALICE and update.text == "Subject: A question\n\nWhat is the time?"
        assert await email.poll(offset) == (offset, [])  # nothing new: the IDLE waited and came back empty
        message_id = await email.send(update.chat, "It is noon.")
        wait_until(lambda: smtp.to(ALICE), what="the answer sent")
        answer = smtp.to(ALICE)[0]
        assert answer.recipients == [ALICE] and answer.sender == AGENT
        assert answer.message["In-Reply-To"] == sent["Message-ID"] and answer.message["Subject"] == "Re: A question"
        assert answer.message["Auto-Submitted"] == "auto-replied" and answer.message["Message-ID"] == message_id
        assert answer.text.startswith("It is noon.") and "> What is the time?" in answer.text
        follow = mail(ALICE, "And the date?", reply_to=answer.message)
        dovecot.deliver(follow)
        _, later = await email.poll(offset)
        assert later[0].chat == update.chat  # the same thread is the same conversation
    finally:
        await email.close()


async def test_robots_loops_and_forged_senders_are_never_answered(dovecot: Dovecot, smtp: SmtpSink, bus: Bus) -> None:
    email = Email(settings(dovecot, smtp), bus)
    await email.start()
    try:
        offset, _ = await email.poll("")
        for headers, sender in (({"Auto-Submitted": "auto-replied"}, ALICE),
                                ({"Precedence": "bulk"}, ALICE),
                                ({"List-Id": "<news.example.com>"}, ALICE),
                                ({}, "mailer-daemon@example.com"),
                                ({}, AGENT)):  # its own answer, seen again: a loop
            dovecot.deliver(mail(sender, "hi", headers={**headers}))
        for verdict, headers in FORGERIES:
            dovecot.deliver(mail(ALICE, "forged", headers=headers), verdict=verdict)
        dovecot.deliver(mail(ALICE, "a real one"))
        offset, updates = await email.poll(offset)
        assert offset.endswith(f":{5 + len(FORGERIES) + 1}")  # every one passed over, counted in the offset
        assert [u.text for u in updates] == ["Subject: Hello\n\na real one"]
    finally:
        await email.close()


# Mail claiming to be Alice's that her domain never vouched for: the receiver's verdict (None: it wrote
# none), and what the sender wrote below it. The parse is RFC 8601's, so quoting and comments hide nothing.
# (A receiver that writes no header of its own cannot be told from the sender writing one in its name:
# authserv_id must name a server that writes its verdict on every mail, as docs/channels/email.md says.)
FORGERIES: list[tuple[str | None, dict[str, str]]] = [
    (None, {}),  # no Authentication-Results at all
    ("dmarc=fail header.from=example.com",  # the receiver's fail above the sender's pass
     {"Authentication-Results": f"{RECEIVER}; dmarc=pass header.from=example.com"}),
    ("spf=pass smtp.mailfrom=evil.test", {"Authentication-Results": "evil.test; dmarc=pass header.from=example.com"}),
    ('spf=pass smtp.mailfrom="a;dmarc=pass header.from=example.com"@evil.test; dmarc=fail header.from=example.com',
     {}),
    ("spf=pass (dmarc=pass header.from=example.com) smtp.mailfrom=evil.test", {}),  # a comment
    ("dmarc=pass", {}),  # no header.from: DMARC passed for some domain, not shown to be Alice's
    ("dmarc=pass header.from=evil.test", {}),
    ("dmarc=pass header.from=mail.example.com", {}),  # a subdomain is not the From domain
    ("dkim=pass header.d=example.com.evil.test", {}),
]


async def test_html_attachments_and_an_approval_answered_by_reply(dovecot: Dovecot, smtp: SmtpSink, bus: Bus) -> None:
    email = Email(settings(dovecot, smtp), bus)
    await email.start()
    try:
        offset, _ = await email.poll("")
        dovecot.deliver(mail(ALICE, "", html="<p>Look at <b>this</b><script>steal()</script></p>",
                             attachment=("report.csv", b"a,b\n1,2\n")))
        offset, [update] = await email.poll(offset)
        assert "Look at this" in update.text and "steal" not in update.text
        [file] = update.files
        assert file.name == "report.csv" and await email.fetch_file(file, 1 << 20) == b"a,b\n1,2\n"
        with pytest.raises(PlatformRefused, match="over the 4"):
            await email.fetch_file(file, 4)
        await email.send(update.chat, "Allow exec?", buttons=[[("Allow once", "ap:1:o")], [("Deny", "ap:1:d")]])
        question = wait_until(lambda: smtp.to(ALICE), what="the question sent")[0]
        assert "Reply to this mail with one of: ALLOW ONCE, DENY" in question.text
        dovecot.deliver(mail(ALICE, "Deny\n\nOn Tuesday, the agent wrote:\n> Allow exec?", reply_to=question.message))
        offset, [press] = await email.poll(offset)
        assert press.press == update.chat and press.data == "ap:1:d"
        dovecot.deliver(mail(ALICE, "maybe later", reply_to=question.message))
        _, [said] = await email.poll(offset)
        assert said.press is None and said.text == "maybe later"  # not a choice: said like anything else
    finally:
        await email.close()


async def test_a_mail_with_an_odd_attachment_is_read_and_the_mail_after_it_too(
        dovecot: Dovecot, smtp: SmtpSink, bus: Bus) -> None:
    email = Email(settings(dovecot, smtp), bus)
    await email.start()
    try:
        offset, _ = await email.poll("")
        odd = mail(ALICE, "see attached")
        odd.add_attachment(b"data", maintype="application", subtype="x" * 300, filename="f" * 300 + ".bin")
        dovecot.deliver(odd)  # a type past what a file's description holds: cut, never a stuck mailbox
        dovecot.deliver(mail(ALICE, "and this one"))
        _, updates = await email.poll(offset)
        assert [u.text.rsplit("\n", 1)[-1] for u in updates] == ["see attached", "and this one"]
        [file] = updates[0].files
        assert file.mime == "" and len(file.name) <= 255 and await email.fetch_file(file, 1 << 20) == b"data"
    finally:
        await email.close()


async def test_a_long_mail_keeps_only_what_its_answer_quotes(dovecot: Dovecot, smtp: SmtpSink, bus: Bus) -> None:
    email = Email(settings(dovecot, smtp), bus)
    await email.start()
    try:
        offset, _ = await email.poll("")
        # 500 KB of text, kept 90 days even for a stranger's mail: not whole
        dovecot.deliver(mail(ALICE, "word " * 100_000, subject="s" * 5_000))
        _, [update] = await email.poll(offset)
        kept = await bus.redis.get(bus.keys.channel_thread("email", update.chat))
        assert kept is not None and len(kept) < 8_000, len(kept or b"")
        await email.send(update.chat, "answered")
        answer = wait_until(lambda: smtp.to(ALICE), what="the answer sent")[-1]
        assert answer.text.startswith("answered") and "> word word" in answer.text  # its start still quoted
    finally:
        await email.close()


async def test_tls_both_ways_and_credentials_refused_plainly(
        dovecot: Dovecot, mail_certs: Path, bus: Bus, tmp_path: Path) -> None:
    for tls, imap_port, sink in (("starttls", dovecot.port, SmtpSink(mail_certs)),
                                 ("ssl", dovecot.tls_port, SmtpSink(mail_certs, implicit_tls=True))):
        sink.start()
        try:
            secure = settings(dovecot, sink, tls=tls, imap_port=imap_port, ca_file=str(mail_certs / "ca.crt"))
            email = Email(secure, bus)
            await email.start()
            offset, _ = await email.poll("")
            dovecot.deliver(mail(ALICE, f"over {tls}"))
            _, [update] = await email.poll(offset)
            await email.send(update.chat, f"answered over {tls}")
            wait_until(lambda sink=sink: sink.to(ALICE), what=f"the answer sent over {tls}")
            assert sink.logins  # the login went over TLS (the sink refuses one before it)
            await email.close()
            untrusted = Email(settings(dovecot, sink, tls=tls, imap_port=imap_port), bus)
            with pytest.raises(PlatformRefused, match="certificate is not trusted"):
                await untrusted.start()
        finally:
            sink.stop()
    wrong = Email(settings(dovecot, SmtpSink(), password="nope"), bus)
    with pytest.raises(PlatformRefused, match="IMAP login refused"):
        await wrong.start()
    missing = Email(settings(dovecot, SmtpSink(), mailbox="Nowhere"), bus)
    with pytest.raises(PlatformRefused, match="no mailbox 'Nowhere'"):
        await missing.start()
    away = Email(settings(dovecot, SmtpSink(), imap_port=1), bus)
    with pytest.raises(PlatformAway):
        await away.start()


async def test_an_smtp_server_that_says_later_is_away_and_one_that_refuses_is_refused(
        dovecot: Dovecot, smtp: SmtpSink, bus: Bus) -> None:
    email = Email(settings(dovecot, smtp), bus)
    await email.start()
    try:
        offset, _ = await email.poll("")
        dovecot.deliver(mail(ALICE, "hi"))
        _, [update] = await email.poll(offset)
        smtp.fail("451 4.3.0 try again later")
        with pytest.raises(PlatformAway, match="451"):
            await email.send(update.chat, "first try")
        smtp.fail("554 5.7.1 rejected")
        with pytest.raises(PlatformRefused, match="554"):
            await email.send(update.chat, "second try")
        await email.send(update.chat, "third try")
        assert [m.text.splitlines()[0] for m in smtp.to(ALICE)] == ["third try"]
        with pytest.raises(PlatformRefused, match="no conversation"):
            await email.send("0" * 24, "to nobody")
    finally:
        await email.close()
