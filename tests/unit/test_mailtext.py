"""The email channel's reading and writing of mail, against hostile and broken messages."""

from __future__ import annotations

from email import policy
from email.parser import BytesParser

import pytest

from gateway.channels import mailtext
from tests.mailservers import AGENT, mail

ALICE = "alice@example.com"


def raw(text: str) -> bytes:
    return text.replace("\n", "\r\n").encode()


def test_a_reply_keeps_its_thread_and_drops_the_quoted_history() -> None:
    first = mail(ALICE, "start")
    reply = mail("Alice <ALICE@example.com>", "new words\n\nOn Mon, 1 Dec 2026, Agent wrote:\n> old words\n> more",
                 reply_to=first)
    read = mailtext.read(reply.as_bytes(), own_address=AGENT)
    assert read.sender == ALICE and read.text == "new words"
    assert read.root == first["Message-ID"] and read.replied_to == first["Message-ID"]
    assert mailtext.chat_of(read.root, read.sender) == mailtext.chat_of(first["Message-ID"], ALICE)
    assert mailtext.chat_of(read.root, "bob@example.org") != mailtext.chat_of(read.root, ALICE)


@pytest.mark.parametrize(("headers", "reason"), [
    ("From: a@example.com, b@example.com", "no single sender"),
    ("From: not an address", "no single sender"),
    ("From: <>", "no single sender"),
    ("From: agent@pincer.test", "own address"),
    ("From: a@example.com\nAuto-Submitted: auto-generated", "Auto-Submitted"),
    ("From: a@example.com\nPrecedence: junk", "Precedence"),
    ("From: a@example.com\nList-Unsubscribe: <mailto:x@example.com>", "mailing list"),
    ("From: MAILER-DAEMON@example.com", "robot"),
    ("From: a@example.com\nReturn-Path: <>", "bounce"),
])
def test_mail_no_person_wrote_is_never_answered(headers: str, reason: str) -> None:
    read = mailtext.read(raw(f"{headers}\nSubject: x\n\nbody\n"), own_address=AGENT)
    assert reason in read.automated


def test_a_person_writing_with_auto_submitted_no_is_answered() -> None:
    read = mailtext.read(raw(f"From: {ALICE}\nAuto-Submitted: no\nSubject: x\n\nbody\n"), own_address=AGENT)
    assert read.automated == "" and read.text == "body"


def test_an_answer_cannot_be_made_to_carry_a_header_or_go_elsewhere() -> None:
    sneaky = mailtext.read(raw(f"From: {ALICE}\nReply-To: evil@attacker.test\nCc: other@example.com\n"
                               "Subject: =?utf-8?q?hi=0D=0ABcc=3A_evil=40attacker.test?=\n\nbody\n"), own_address=AGENT)
    assert "\n" not in sneaky.subject and "\r" not in sneaky.subject
    message = mailtext.answer(own=AGENT, to=sneaky.sender, subject=sneaky.subject, references=sneaky.references,
                              body="ok")
    parsed = BytesParser(policy=policy.default).parsebytes(message.as_bytes())
    assert parsed["To"] == ALICE and parsed.get("Bcc") is None and parsed.get("Cc") is None
    assert parsed["Subject"].startswith("Re: hi") and parsed["Auto-Submitted"] == "auto-replied"


def test_html_is_text_without_scripts_styles_or_quoted_history() -> None:
    html = ("<html><head><style>p{}</style><title>t</title></head><body><p>Hi <b>you</b></p>"
            "<script>fetch('https://x')</script><img src='https://tracker.test/p.gif'>"
            "<a href='https://example.com/doc'>the doc</a><div class='gmail_quote'>old thread</div></body></html>")
    text = mailtext.text_of_html(html)
    assert text.startswith("Hi you") and "fetch" not in text and "p{}" not in text and "tracker" not in text
    assert "the doc (https://example.com/doc)" in text and "old thread" not in text


def test_html_blocks_and_breaks_are_lines_however_many_there_are() -> None:
    text = mailtext.text_of_html("<div><p>one</p><p>two<br>three</p></div>" + "<p>x</p>" * 5000 + "end<br>")
    lines = text.split("\n")
    assert lines[:5] == ["one", "", "two", "three", ""] and lines.count("x") == 5000 and lines[-1] == "end"
    assert len(mailtext.text_of_html("<p>" + "y" * (mailtext.HTML_READ + 10) + "</p>")) == mailtext.HTML_READ - 3


def test_broken_charsets_and_encodings_still_read() -> None:
    broken = raw(f"From: {ALICE}\nSubject: x\nContent-Type: text/plain; charset=no-such-charset\n"
                 "Content-Transfer-Encoding: base64\n\naGVsbG8gd29ybGQ=\n")
    assert mailtext.read(broken, own_address=AGENT).text == "hello world"
    no_id = mailtext.read(raw(f"From: {ALICE}\n\nno headers to speak of\n"), own_address=AGENT)
    assert no_id.message_id.endswith("@pincer.invalid>") and no_id.root == no_id.message_id


def test_attachments_are_listed_and_read_back_by_their_place() -> None:
    message = mail(ALICE, "see attached", attachment=("../../../etc/passwd", b"root:x:0:0"))
    read = mailtext.read(message.as_bytes(), own_address=AGENT)
    [attachment] = read.attachments
    assert attachment.size == 10 and mailtext.attachment_bytes(message.as_bytes(), attachment.index) == b"root:x:0:0"


OURS = "mx.pincer.test"


def proven(*headers: str, sender: str = ALICE) -> str:
    """The proof for a mail with these Authentication-Results, topmost first (as each hop prepends its own)."""
    above = "".join(f"Authentication-Results: {h}\n" for h in headers)
    message = raw(f"Received: from mx by {OURS}\n{above}From: <{sender}>\nSubject: s\n\nx\n")
    return mailtext.proof(message, sender, authserv_id=OURS)


def test_the_receivers_topmost_header_proves_the_from_domain() -> None:
    assert proven(f"{OURS}; dmarc=pass (p=reject) header.from=example.com") == "dmarc=pass header.from=example.com"
    assert proven("MX.Pincer.Test 1;\n dkim=pass header.d=Example.com header.s=s1; spf=fail smtp.mailfrom=x.test") \
        == "dkim=pass header.d=example.com"  # folded, versioned, any case: RFC 8601 read whole
    # another hop's header above the receiver's (an internal relay) is passed over, not a reason to refuse
    assert proven("relay.internal; none", f"{OURS}; dmarc=pass header.from=example.com")
    # the receiver's policy record and reason are properties like any other
    assert proven(f"{OURS}; dmarc=pass policy.dmarc=reject header.from=example.com reason=\"ok\"")


FORGED = {
    "the sender's header below the receiver's fail": [
        f"{OURS}; dmarc=fail header.from=example.com", f"{OURS}; dmarc=pass header.from=example.com"],
    "the sender's header below the receiver's none": [f"{OURS}; none", f"{OURS}; dkim=pass header.d=example.com"],
    "another server's pass, the receiver's silence": [
        "mx.evil.test; dmarc=pass header.from=example.com", f"{OURS}; spf=pass smtp.mailfrom=example.com"],
    "another server's pass alone": ["evil.test; dmarc=pass header.from=example.com"],
    "a name that starts like the receiver's": [f"{OURS}.evil.test; dmarc=pass header.from=example.com"],
    "the receiver's name in a comment": ["(mx.pincer.test) evil.test; dmarc=pass header.from=example.com"],
    "a quoted local part carrying ;dmarc=pass": [
        f'{OURS}; spf=pass smtp.mailfrom="a;dmarc=pass header.from=example.com"@evil.test; '
        "dmarc=fail header.from=example.com"],
    "a quoted local part and no dmarc at all": [
        f'{OURS}; spf=pass smtp.mailfrom="x; dmarc=pass header.from=example.com; dkim=pass header.d=example.com"'
        "@evil.test"],
    "a comment carrying dmarc=pass": [
        f"{OURS} (dmarc=pass header.from=example.com); spf=pass (dkim=pass header.d=example.com) "
        "smtp.mailfrom=evil.test"],
    "dmarc=pass without header.from": [f"{OURS}; dmarc=pass"],
    "dmarc=pass for another domain": [f"{OURS}; dmarc=pass header.from=evil.test"],
    "dmarc=pass for a subdomain of the From domain": [f"{OURS}; dmarc=pass header.from=pincer.example.com"],
    "dmarc=pass naming two domains": [f"{OURS}; dmarc=pass header.from=example.com header.from=evil.test"],
    "dkim=pass of a look-alike domain": [f"{OURS}; dkim=pass header.d=example.com.evil.test"],
    "dkim=pass of a subdomain": [f"{OURS}; dkim=pass header.d=mail.example.com"],
    "dkim=pass under dmarc=fail": [f"{OURS}; dkim=pass header.d=example.com; dmarc=fail header.from=example.com"],
    "the receiver's header unreadable, a readable one below": [
        f"{OURS}; dmarc=pass header.from=\u00e9xample.com", f"{OURS}; dmarc=pass header.from=example.com"],
    "no header at all": [],
}


@pytest.mark.parametrize("headers", FORGED.values(), ids=FORGED.keys())
def test_forged_proofs_are_refused(headers: list[str]) -> None:
    with pytest.raises(mailtext.Unproven):
        proven(*headers)


def test_a_subdomain_sender_is_not_proven_by_its_parent_and_says_why() -> None:
    with pytest.raises(mailtext.Unproven, match=r"not the From domain mail\.example\.com"):
        proven(f"{OURS}; dmarc=pass header.from=example.com", sender="bob@mail.example.com")
    with pytest.raises(mailtext.Unproven, match=r"said dmarc=fail$"):
        proven(f"{OURS}; dmarc=fail header.from=example.com", f"{OURS}; dmarc=pass header.from=example.com")
    with pytest.raises(mailtext.Unproven, match=r"no Authentication-Results header from mx\.pincer\.test"):
        proven("mx.evil.test; dmarc=pass header.from=example.com")
