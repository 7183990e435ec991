"""Real mail servers on loopback for the email channel's tests: the system's Dovecot for IMAP (the
mailbox the agent reads) and aiosmtpd for SMTP (where its answers go). No internet, no fakes.

The test side plays the people: ``Dovecot.deliver`` puts a mail in the agent's mailbox as a mail
server's delivery does (IMAP APPEND, which wakes an IDLE), its receiving server RECEIVER's verdict on
the sender prepended (``Authentication-Results``, DMARC passed unless told), ``SmtpSink.sent`` reads what the agent
sent, and ``SmtpSink.fail`` makes the next messages answer a temporary error (a 451).
"""

from __future__ import annotations

import contextlib
import email.message
import imaplib
import os
import pwd
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from email import policy
from email.parser import BytesParser
from email.utils import formatdate, make_msgid
from pathlib import Path
from typing import Any

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword

from bus.redis_server import free_port

AGENT = "agent@pincer.test"
PASSWORD = "mail-secret-1"
RECEIVER = "mx.pincer.test"  # the authserv-id of the server that received the agent's mail


class Dovecot:
    """One Dovecot with its own config, users and maildirs in a folder of its own; plain IMAP on ``port``, and
    with ``certs`` (server.crt/server.key) STARTTLS on it and IMAPS on ``tls_port``."""

    def __init__(self, certs: Path | None = None) -> None:
        # Not under pytest's tmp_path: Dovecot's own users must be able to reach it (pytest's is 0700).
        self.root = Path(tempfile.mkdtemp(prefix="pincer-dovecot-"))
        self.root.chmod(0o755)
        self.certs = certs
        self.port, self.tls_port = free_port(), free_port() if certs else 0
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Dovecot:
        if shutil.which("dovecot") is None:
            raise RuntimeError("the email tests need the system's Dovecot: apt-get install dovecot-imapd "
                               "(.ci/run installs it)")
        for folder in ("run", "state", "home"):
            (self.root / folder).mkdir(parents=True, exist_ok=True)
        (self.root / "passwd").write_text(f"{AGENT}:{{PLAIN}}{PASSWORD}\n")
        if os.geteuid() == 0:  # Dovecot's login processes refuse root; its own users come with the package
            login, internal, mail_user = "dovenull", "dovecot", pwd.getpwnam("dovecot")
            shutil.chown(self.root / "home", mail_user.pw_uid, mail_user.pw_gid)
        else:
            me = pwd.getpwuid(os.geteuid())
            login, internal, mail_user = me.pw_name, me.pw_name, me
        tls = (f"ssl = yes\nssl_cert = <{self.certs}/server.crt\nssl_key = <{self.certs}/server.key\n"
               if self.certs else "ssl = no\n")
        (self.root / "dovecot.conf").write_text(f"""
base_dir = {self.root}/run
state_dir = {self.root}/state
log_path = {self.root}/dovecot.log
protocols = imap
listen = 127.0.0.1
{tls}disable_plaintext_auth = no
auth_mechanisms = plain login
default_internal_user = {internal}
default_internal_group = {internal}
default_login_user = {login}
first_valid_uid = {mail_user.pw_uid}
service imap-login {{
  inet_listener imap {{
    port = {self.port}
  }}
  inet_listener imaps {{
    port = {self.tls_port}
  }}
  chroot =
}}
service anvil {{
  chroot =
}}
passdb {{
  driver = passwd-file
  args = scheme=PLAIN username_format=%u {self.root}/passwd
}}
userdb {{
  driver = static
  args = uid={mail_user.pw_uid} gid={mail_user.pw_gid} home={self.root}/home/%u
}}
mail_location = maildir:~/Maildir
""")
        self.process = subprocess.Popen(["dovecot", "-F", "-c", str(self.root / "dovecot.conf")],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, imaplib.IMAP4.error), self.client() as imap:
                imap.select("INBOX")
                return self
            if self.process.poll() is not None:
                said = self.process.stderr.read().decode() if self.process.stderr else ""
                raise RuntimeError(f"dovecot exited: {said}{self.log()}")
            time.sleep(0.1)
        raise RuntimeError(f"dovecot did not answer on {self.port}: {self.log()}")

    def log(self) -> str:
        path = self.root / "dovecot.log"
        return path.read_text() if path.exists() else ""

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(10)
            if self.process.poll() is None:
                self.process.kill()

    def close(self) -> None:
        """Stopped, its mailboxes gone (``stop`` alone keeps them, as a restarted server does)."""
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    @contextlib.contextmanager
    def client(self) -> Iterator[imaplib.IMAP4]:
        imap = imaplib.IMAP4("127.0.0.1", self.port, timeout=10)
        try:
            imap.login(AGENT, PASSWORD)
            yield imap
        finally:
            with contextlib.suppress(Exception):
                imap.logout()

    def deliver(self, message: email.message.EmailMessage | bytes, *, verdict: str | None = "") -> None:
        """``verdict``: what RECEIVER's Authentication-Results says above the sender's headers ("": DMARC
        passed for the From domain; None: no header of its own, as from a server that checks nothing)."""
        raw = message if isinstance(message, bytes) else message.as_bytes(policy=policy.SMTP)
        if verdict is not None:
            sender = BytesParser(policy=policy.default).parsebytes(raw, headersonly=True).get("From", "")
            verdict = verdict or f"dmarc=pass header.from={str(sender).rpartition('@')[2].strip('> ').lower()}"
            raw = f"Authentication-Results: {RECEIVER}; {verdict}\r\n".encode() + raw
        with self.client() as imap:
            result, said = imap.append("INBOX", None, None, raw)
            assert result == "OK", said

    def count(self) -> int:
        with self.client() as imap:
            _, found = imap.select("INBOX")
            return int(found[0] or 0)


def mail(sender: str, text: str, *, subject: str = "Hello", reply_to: Any = None, html: str | None = None,
         attachment: tuple[str, bytes] | None = None, headers: dict[str, str] | None = None,
         to: str = AGENT) -> email.message.EmailMessage:
    """A mail as a person's client writes it; ``reply_to`` (a sent EmailMessage) makes it a reply in its thread."""
    message = email.message.EmailMessage(policy=policy.SMTP)
    message["From"] = sender
    message["To"] = to
    message["Date"] = formatdate(usegmt=True)
    message["Message-ID"] = make_msgid(domain=sender.rpartition("@")[2].strip(">") or "example.test")
    if reply_to is not None:
        message["Subject"] = str(reply_to["Subject"])
        message["In-Reply-To"] = str(reply_to["Message-ID"])
        message["References"] = f"{reply_to.get('References', '')} {reply_to['Message-ID']}".strip()
    else:
        message["Subject"] = subject
    for name, value in (headers or {}).items():
        message[name] = value
    message.set_content(text + "\n")
    if html is not None:
        message.add_alternative(html, subtype="html")
    if attachment is not None:
        message.add_attachment(attachment[1], maintype="application", subtype="octet-stream", filename=attachment[0])
    return message


@dataclass
class Sent:
    sender: str
    recipients: list[str]
    message: email.message.EmailMessage

    @property
    def text(self) -> str:
        body = self.message.get_body(preferencelist=("plain",))
        return str(body.get_content()).replace("\r\n", "\n") if body is not None else ""

    def attachments(self) -> list[tuple[str, bytes]]:
        found = []
        for part in self.message.iter_attachments():
            payload = part.get_payload(decode=True)
            found.append((part.get_filename() or "", payload if isinstance(payload, bytes) else b""))
        return found


class SmtpSink:
    """aiosmtpd on loopback requiring a login (PLAIN/LOGIN): every message it takes, kept for the test.
    With ``certs``, TLS: implicit (``implicit_tls``) or by STARTTLS, required before the login."""

    def __init__(self, certs: Path | None = None, *, implicit_tls: bool = False) -> None:
        self.port = free_port()
        self.messages: list[Sent] = []
        self.failures: list[str] = []
        self.logins: list[str] = []
        self._lock = threading.Lock()
        context = None
        if certs is not None:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(certs / "server.crt", certs / "server.key")
        kwargs: dict[str, Any] = {"ssl_context": context} if implicit_tls else \
            {"tls_context": context, "require_starttls": context is not None}
        self.controller = Controller(self, hostname="127.0.0.1", port=self.port, authenticator=self._login,
                                     # aiosmtpd counts only STARTTLS as TLS; an implicit-TLS socket is TLS throughout
                                     auth_require_tls=context is not None and not implicit_tls, auth_required=True,
                                     server_hostname="127.0.0.1", **kwargs)
        self.implicit_tls = implicit_tls

    def _login(self, server: Any, session: Any, envelope: Any, mechanism: str, data: Any) -> AuthResult:
        if isinstance(data, LoginPassword) and data.login.decode() == AGENT and data.password.decode() == PASSWORD:
            self.logins.append(mechanism)
            return AuthResult(success=True)
        return AuthResult(success=False, handled=False)

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802  # aiosmtpd's name
        with self._lock:
            if self.failures:
                return self.failures.pop(0)
            parsed = BytesParser(policy=policy.default).parsebytes(envelope.content)
            assert isinstance(parsed, email.message.EmailMessage)
            self.messages.append(Sent(envelope.mail_from, list(envelope.rcpt_tos), parsed))
        return "250 OK"

    def fail(self, reply: str = "451 4.3.0 try again later", times: int = 1) -> None:
        with self._lock:
            self.failures.extend([reply] * times)

    def start(self) -> SmtpSink:
        if self.implicit_tls:  # Controller's own readiness check speaks plain SMTP: wait on the port instead
            self.controller.ready_timeout = 0.5
            with contextlib.suppress(TimeoutError):
                self.controller.start()
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), 1):
                    return self
                time.sleep(0.05)
        else:
            self.controller.start()
        return self

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.controller.stop()

    def to(self, address: str) -> list[Sent]:
        with self._lock:
            return [m for m in self.messages if address in m.recipients]
