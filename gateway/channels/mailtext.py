"""Mail as the email channel reads and writes it: what a person said in a message, and an answer to it.

Pure functions over the standard library's ``email`` package (no I/O), so the hostile cases are
unit-tested on their own: forged or missing headers, HTML with scripts, quoted history, a subject
that tries to smuggle a header in, automated mail that must never be answered (or mail loops).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from email import policy
from email.message import EmailMessage
from email.parser import BytesParser
from email.utils import formatdate, getaddresses, make_msgid, parseaddr

import authres
import authres.core
from bs4 import BeautifulSoup

from bus.errors import PincerError

MESSAGE_ID = re.compile(r"<[^<>\s]{1,250}>")
QUOTE_INTRO = re.compile(r"^(On .{0,300}wrote:|-{2,}\s*Original Message\s*-{2,}|_{10,})\s*$", re.I)
ROBOTS = ("mailer-daemon", "postmaster", "noreply", "no-reply", "donotreply", "do-not-reply")
HTML_READ = 1_000_000  # characters of an HTML body parsed: past them no mail says more in 60,000 of text
BLOCKS = ["p", "div", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "blockquote", "pre", "table", "ul", "ol"]
QUOTED_KEEP = 4_000  # characters of the person's message quoted under an answer


@dataclass
class Attachment:
    index: int  # its place in the message's walk(): how it is found again
    name: str
    size: int
    mime: str


@dataclass
class Incoming:
    message_id: str
    sender: str  # the From address, lowercased ("" if there is none)
    subject: str
    references: list[str]  # the thread so far, oldest first, this message last
    replied_to: str  # In-Reply-To
    text: str  # what the person wrote, quoted history left out
    date: str
    attachments: list[Attachment] = field(default_factory=list)
    automated: str = ""  # why no person wrote this (never answered), else ""

    @property
    def root(self) -> str:
        """The thread's first message: the same for every message of the conversation."""
        return self.references[0]


def read(raw: bytes, *, own_address: str) -> Incoming:
    message = BytesParser(policy=policy.default).parsebytes(raw)
    sender = _sender(message)
    message_id = _ids(str(message.get("Message-ID", "")))[:1]
    own_id = message_id[0] if message_id else f"<{hashlib.sha256(raw).hexdigest()[:32]}@pincer.invalid>"
    references = _ids(str(message.get("References", "")))
    replied_to = (_ids(str(message.get("In-Reply-To", ""))) or [""])[0]
    if not references and replied_to:
        references = [replied_to]
    return Incoming(message_id=own_id, sender=sender, subject=one_line(str(message.get("Subject", ""))),
                    references=[*references[-20:], own_id], replied_to=replied_to, text=_text(message),
                    date=one_line(str(message.get("Date", ""))), attachments=_attachments(message),
                    automated=_automated(message, sender, own_address))


def attachment_bytes(raw: bytes, index: int) -> bytes:
    """The decoded content of the attachment at ``index`` of the message's walk()."""
    message = BytesParser(policy=policy.default).parsebytes(raw)
    for at, part in enumerate(message.walk()):
        if at == index:
            payload = part.get_payload(decode=True)
            return payload if isinstance(payload, bytes) else b""
    raise KeyError(f"the message has no part {index}")


def chat_of(root: str, sender: str) -> str:
    """A conversation's id: its thread and the person (two people in one thread are two conversations)."""
    return hashlib.sha256(f"{root}\n{sender}".encode()).hexdigest()[:24]


def one_line(value: str, limit: int = 200) -> str:
    """A header value safe to write back: no line breaks or control characters, bounded."""
    return re.sub(r"[\x00-\x1f\x7f]+", " ", value).strip()[:limit]


def answer(*, own: str, to: str, subject: str, references: list[str], body: str, quoted: str = "",
           quoted_from: str = "", quoted_date: str = "", domain: str = "") -> EmailMessage:
    """An answer in the thread ``references`` (the message answered last), to ``to`` alone."""
    message = EmailMessage(policy=policy.SMTP)
    message["From"] = own
    message["To"] = to
    subject = one_line(subject) or "(no subject)"
    message["Subject"] = subject if subject.lower().startswith("re:") else f"Re: {subject}"
    message["Date"] = formatdate(usegmt=True)
    message["Message-ID"] = make_msgid(domain=domain or own.rpartition("@")[2] or None)
    if references:
        message["In-Reply-To"] = references[-1]
        message["References"] = " ".join(references[-20:])
    # RFC 3834: the answer is not a person's, so other robots (vacation replies) leave it alone.
    message["Auto-Submitted"] = "auto-replied"
    text = body
    if quoted.strip():
        intro = f"On {quoted_date}, {quoted_from} wrote:" if quoted_date else f"{quoted_from} wrote:"
        lines = quoted[:QUOTED_KEEP].splitlines()
        text += "\n\n" + intro + "\n" + "\n".join(f"> {line}" if line else ">" for line in lines)
    message.set_content(text + "\n")
    return message


def text_of_html(html: str) -> str:
    """HTML mail as plain text: scripts, styles and head dropped, nothing fetched, links' targets shown."""
    soup = BeautifulSoup(html[:HTML_READ], "html.parser")
    for element in soup(["script", "style", "head", "title", "template", "noscript"]):
        element.decompose()
    for link in soup.find_all("a", href=True):
        href = str(link.get("href", ""))
        if href.startswith(("http://", "https://", "mailto:")) and href not in link.get_text():
            link.append(f" ({href})")
    # The history a mail client quotes under a reply (Thunderbird, Apple Mail, Gmail).
    for quoted in soup.select('blockquote[type="cite"], div.gmail_quote, div.moz-cite-prefix'):
        quoted.decompose()
    # Line breaks go inside each element, at its start and end: insert_before and replace_with look the
    # element up among its siblings, which made a mail of many short paragraphs quadratic (20,000: 43 s).
    for br in soup.find_all("br"):
        br.append("\n")
    for block in soup.find_all(BLOCKS):
        block.insert(0, "\n")
        block.append("\n")
    text = soup.get_text()
    text = re.sub(r"[ \t]+", " ", text)
    return re.sub(r"\n[ \t]*(\n[ \t]*)+", "\n\n", text).strip()


def without_quotes(text: str) -> str:
    """What the person wrote, without the history their client quoted under it."""
    kept: list[str] = []
    for line in text.splitlines():
        if QUOTE_INTRO.match(line.strip()):
            break
        if not line.lstrip().startswith(">"):
            kept.append(line.rstrip())
    return "\n".join(kept).strip()


def _sender(message: EmailMessage) -> str:
    found = [address for _, address in getaddresses([str(v) for v in message.get_all("From", [])]) if address]
    if len(found) != 1:  # none, or several: no one to answer
        return ""
    address = found[0].strip().lower()
    return address if re.match(r"^[^@\s<>\"',;]{1,64}@[a-z0-9.-]{1,190}\.[a-z0-9-]{2,63}$", address) else ""


def _ids(value: str) -> list[str]:
    return MESSAGE_ID.findall(value)


def _text(message: EmailMessage) -> str:
    for kind in ("plain", "html"):  # the plain part, unless it is empty (some clients send it so)
        body = message.get_body(preferencelist=(kind,))
        if body is None:
            continue
        try:
            content = body.get_content()
        except (LookupError, ValueError, AssertionError):  # an unknown charset or a broken encoding
            payload = body.get_payload(decode=True)
            content = payload.decode("utf-8", "replace") if isinstance(payload, bytes) else ""
        if isinstance(content, str) and content.strip():
            return without_quotes(text_of_html(content) if kind == "html" else content)[:60_000]
    return ""


def _attachments(message: EmailMessage) -> list[Attachment]:
    found = []
    for index, part in enumerate(message.walk()):
        if part.is_multipart():
            continue
        name = part.get_filename()
        if not name and part.get_content_disposition() != "attachment":
            continue
        payload = part.get_payload(decode=True)
        found.append(Attachment(index=index, name=one_line(name or f"part-{index}", 200),
                                size=len(payload) if isinstance(payload, bytes) else 0, mime=part.get_content_type()))
    return found[:10]


def _automated(message: EmailMessage, sender: str, own_address: str) -> str:
    """Why this mail must not be answered: robots answering robots is how mail loops start."""
    if not sender:
        return "no single sender address in From"
    if sender == own_address.lower():
        return "it is from the agent's own address"
    auto = str(message.get("Auto-Submitted", "no")).strip().lower()
    if auto and not auto.startswith("no"):
        return f"Auto-Submitted: {auto}"
    if str(message.get("Precedence", "")).strip().lower() in ("bulk", "list", "junk"):
        return "Precedence: " + str(message.get("Precedence")).strip().lower()
    if message.get("List-Id") or message.get("List-Unsubscribe"):
        return "it came through a mailing list"
    if sender.partition("@")[0] in ROBOTS:
        return f"{sender} is a robot's address"
    if parseaddr(str(message.get("Return-Path", "x")))[1] == "" and message.get("Return-Path") is not None:
        return "it is a bounce (empty Return-Path)"
    return ""


class Unproven(PincerError):
    """The receiving server did not prove the From domain: why, in words for the operator's log."""


def proof(raw: bytes, sender: str, *, authserv_id: str) -> str:
    """How the receiving server ``authserv_id`` proved the From domain (``dmarc=pass header.from=...`` or
    ``dkim=pass header.d=...``); raises ``Unproven`` saying why not.

    Each hop prepends its header, so only the topmost one bearing ``authserv_id`` is that server's: any
    below it, and any other server's, are the sender's to write. The value is parsed as RFC 8601 says
    (authres: comments, quoted strings), and a result counts only for the From domain itself."""
    domain = sender.rpartition("@")[2].lower()
    if not domain:
        raise Unproven("the mail has no single From address")
    results = _own_results(raw, authserv_id)
    dkim_signed = False
    for result in results:
        method, said = str(result.method).lower(), str(result.result).lower()
        if method == "dmarc":
            froms = _values(result, "header", "from")
            if said != "pass":
                raise Unproven(f"{authserv_id} said dmarc={one_line(said, 40)}")
            if froms and froms != {domain}:
                raise Unproven(f"{authserv_id} passed DMARC for header.from={one_line(','.join(sorted(froms)), 200)},"
                               f" not the From domain {domain}")
            if froms:
                return f"dmarc=pass header.from={domain}"
        elif method == "dkim" and said == "pass" and _values(result, "header", "d") == {domain}:
            dkim_signed = True
    if dkim_signed:
        return f"dkim=pass header.d={domain}"
    raise Unproven(f"{authserv_id} passed neither DMARC with header.from={domain} nor a DKIM signature of {domain}")


def _own_results(raw: bytes, authserv_id: str) -> list[authres.core.AuthenticationResult]:
    """The results in the topmost Authentication-Results header ``authserv_id`` wrote."""
    wanted = authserv_id.strip().lower()
    message = BytesParser(policy=policy.default).parsebytes(raw, headersonly=True)
    for name, value in message.raw_items():
        if name.strip().lower() != "authentication-results":
            continue
        text = re.sub(r"\r?\n(?=[ \t])", "", str(value)).strip()
        try:
            header = authres.parse_value(text)
        except authres.AuthResError:
            # Skipping an unreadable header that may be the server's would promote the sender's below it.
            if wanted in text.lower():
                raise Unproven(f"the topmost Authentication-Results naming {authserv_id} is not RFC 8601") from None
            continue
        if str(header.authserv_id).lower() == wanted:
            return list(header.results)
    raise Unproven(f"no Authentication-Results header from {authserv_id}")


def _values(result: authres.core.AuthenticationResult, kind: str, name: str) -> set[str]:
    return {str(p.value).lower().rstrip(".") for p in result.properties
            if str(p.type).lower() == kind and str(p.name).lower() == name}
