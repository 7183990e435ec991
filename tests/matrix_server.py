"""A real Matrix homeserver on loopback for the Matrix channel's tests: Synapse from PyPI (pinned), installed
once per machine in a venv of its own (its dependencies are not Pincer's), run with SQLite and no
federation. The people's side talks to it over the client-server API with httpx.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import itertools
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import nio  # the person's side of encrypted rooms, with the e2e extra the channel's encryption uses
from nio.crypto.attachments import decrypt_attachment

from bus.redis_server import free_port

CACHE = Path("/var/tmp/pincer-test-synapse")
SYNAPSE = ("matrix-synapse", "1.163.2")
SECRET = "pincer-test-registration-secret"
LIMITS = {"per_second": 1000, "burst_count": 1000}
ENCRYPTION = {"type": "m.room.encryption", "state_key": "", "content": {"algorithm": "m.megolm.v1.aes-sha2"}}


def synapse_python() -> Path:
    """The python of a venv holding Synapse, made (once) with uv from the package registry."""
    name, version = SYNAPSE
    venv = CACHE / f"synapse-{version}"
    python = venv / "bin" / "python"
    if not (venv / ".complete").exists():
        shutil.rmtree(venv, ignore_errors=True)
        uv = shutil.which("uv") or str(Path(os.environ.get("VIRTUAL_ENV", ".venv")) / "bin" / "uv")
        subprocess.run([uv, "venv", "--quiet", "--python", "3.11", str(venv)], check=True, timeout=300)
        subprocess.run([uv, "pip", "install", "--quiet", "--python", str(python), f"{name}=={version}"], check=True,
                       timeout=900)
        (venv / ".complete").write_text(version)
    return python


class Synapse:
    """One homeserver named ``localhost``, its data in a folder of its own."""

    def __init__(self, *, default_message_limits: bool = False) -> None:
        """``default_message_limits``: Synapse's own rc_message (0.2 a second, bursts of 10) for every account
        but those ``unlimit`` frees; else none that a test would meet."""
        self.default_message_limits = default_message_limits
        self.root = Path(tempfile.mkdtemp(prefix="pincer-synapse-"))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None
        self._names = itertools.count(1)

    def start(self) -> Synapse:
        python = synapse_python()
        config = self.root / "homeserver.yaml"
        limits = "{per_second: 1000, burst_count: 1000}"
        config.write_text(f"""
server_name: localhost
pid_file: {self.root}/homeserver.pid
listeners:
  - port: {self.port}
    bind_addresses: ['127.0.0.1']
    type: http
    tls: false
    x_forwarded: false
    resources: [{{names: [client], compress: false}}]
database: {{name: sqlite3, args: {{database: {self.root}/homeserver.db}}}}
media_store_path: {self.root}/media
registration_shared_secret: "{SECRET}"
report_stats: false
macaroon_secret_key: "pincer-test-macaroon"
form_secret: "pincer-test-form"
signing_key_path: {self.root}/signing.key
trusted_key_servers: []
suppress_key_server_warning: true
encryption_enabled_by_default_for_room_type: "off"
{"" if self.default_message_limits else f"rc_message: {limits}"}
rc_login: {{address: {limits}, account: {limits}, failed_attempts: {limits}}}
rc_joins: {{local: {limits}, remote: {limits}}}
rc_invites: {{per_room: {limits}, per_user: {limits}, per_issuer: {limits}}}
rc_registration: {limits}
""")
        subprocess.run([str(python), "-m", "synapse.app.homeserver", "-c", str(config), "--generate-keys"],
                       check=True, capture_output=True, timeout=120)
        self.process = subprocess.Popen([str(python), "-m", "synapse.app.homeserver", "-c", str(config)],
                                        stdout=subprocess.DEVNULL, stderr=(self.root / "stderr.log").open("ab"))
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/_matrix/client/versions", timeout=2).status_code == 200:
                    return self
            if self.process.poll() is not None:
                raise RuntimeError(f"synapse exited: {(self.root / 'stderr.log').read_text()[-3000:]}")
            time.sleep(0.2)
        raise RuntimeError(f"synapse did not answer on {self.port}")

    def unlimit(self, admin: Person, user_id: str) -> None:
        """Free ``user_id`` from the message rate limit (Synapse's admin API): the people a test plays."""
        freed = httpx.post(f"{self.url}/_synapse/admin/v1/users/{quote(user_id)}/override_ratelimit", timeout=30,
                           headers={"Authorization": f"Bearer {admin.token}"},
                           json={"messages_per_second": 0, "burst_count": 0})
        freed.raise_for_status()

    def warnings(self, last: int = 30) -> str:
        """Its latest warnings and errors: what a failed test shows of the homeserver's side."""
        lines = (self.root / "stderr.log").read_text(errors="replace").splitlines()
        said = [line[:300] for line in lines if (" - WARNING - " in line or " - ERROR - " in line)
                and "synapse.config.logger" not in line]  # not its start-up banner
        return "\n".join(said[-last:])

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def register(self, name: str = "", *, admin: bool = False) -> Person:
        """A new account (by the shared-secret admin API), logged in."""
        name = name or f"user{next(self._names)}"
        password = f"pw-{name}"
        nonce = httpx.get(f"{self.url}/_synapse/admin/v1/register", timeout=10).json()["nonce"]
        mac = hmac.new(SECRET.encode(), b"\x00".join([nonce.encode(), name.encode(), password.encode(),
                                                      b"admin" if admin else b"notadmin"]),
                       hashlib.sha1).hexdigest()
        made = httpx.post(f"{self.url}/_synapse/admin/v1/register", timeout=30,
                          json={"nonce": nonce, "username": name, "password": password, "admin": admin, "mac": mac})
        made.raise_for_status()
        return Person(self.url, made.json()["user_id"], made.json()["access_token"], made.json()["device_id"])


class Person:
    """Someone on the homeserver, as their client would act: rooms, messages, reactions, files."""

    def __init__(self, url: str, user_id: str, token: str, device_id: str = "") -> None:
        self.url, self.user_id, self.token, self.device_id = url, user_id, token, device_id
        self._txn = itertools.count(1)
        self.since = ""

    def call(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        response = httpx.request(method, f"{self.url}/_matrix/client/v3{path}", timeout=30,
                                 headers={"Authorization": f"Bearer {self.token}"}, **kwargs)
        response.raise_for_status()
        body: dict[str, Any] = response.json()
        return body

    def room(self, *invite: str, encrypted: bool = False, name: str = "") -> str:
        state = [ENCRYPTION]
        made = self.call("POST", "/createRoom", json={"preset": "private_chat", "invite": list(invite),
                                                      "is_direct": len(invite) == 1 and not name,
                                                      "name": name, **({"initial_state": state} if encrypted else {})})
        return str(made["room_id"])

    def join(self, room_id: str) -> None:
        self.call("POST", f"/join/{quote(room_id)}", json={})

    def invite(self, room_id: str, user_id: str) -> None:
        self.call("POST", f"/rooms/{quote(room_id)}/invite", json={"user_id": user_id})

    def send(self, room_id: str, content: dict[str, Any], kind: str = "m.room.message") -> str:
        sent = self.call("PUT", f"/rooms/{quote(room_id)}/send/{kind}/{self.user_id}.{next(self._txn)}", json=content)
        return str(sent["event_id"])

    def say(self, room_id: str, text: str, *, mentions: list[str] | None = None, reply_to: str = "") -> str:
        content: dict[str, Any] = {"msgtype": "m.text", "body": text}
        if mentions is not None:
            content["m.mentions"] = {"user_ids": mentions}
        if reply_to:
            content["m.relates_to"] = {"m.in_reply_to": {"event_id": reply_to}}
        return self.send(room_id, content)

    def react(self, room_id: str, event_id: str, key: str) -> str:
        return self.send(room_id, {"m.relates_to": {"rel_type": "m.annotation", "event_id": event_id, "key": key}},
                         kind="m.reaction")

    def send_file(self, room_id: str, name: str, data: bytes) -> str:
        uploaded = httpx.post(f"{self.url}/_matrix/media/v3/upload", params={"filename": name}, content=data,
                              timeout=30, headers={"Authorization": f"Bearer {self.token}",
                                                   "Content-Type": "application/octet-stream"})
        uploaded.raise_for_status()
        return self.send(room_id, {"msgtype": "m.file", "body": name, "filename": name,
                                   "url": uploaded.json()["content_uri"], "info": {"size": len(data)}})

    def messages(self, room_id: str) -> list[dict[str, Any]]:
        """The room's messages by others, oldest first, each with its latest edit applied."""
        found = self.call("GET", f"/rooms/{quote(room_id)}/messages", params={"dir": "b", "limit": 500})
        events = list(reversed(found["chunk"]))
        shown: dict[str, dict[str, Any]] = {}
        for event in events:
            content = event.get("content") or {}
            relates = content.get("m.relates_to") or {}
            if event.get("sender") == self.user_id:
                continue
            if event["type"] == "m.room.message" and relates.get("rel_type") == "m.replace":
                original = shown.get(relates.get("event_id", ""))
                if original is not None:
                    original["content"] = content.get("m.new_content") or original["content"]
                    original["edits"] = original.get("edits", 0) + 1
            elif event["type"] in ("m.room.message", "m.reaction"):
                shown[event["event_id"]] = dict(event)
        return list(shown.values())

    def texts(self, room_id: str) -> list[str]:
        return [str(m["content"].get("body", "")) for m in self.messages(room_id) if m["type"] == "m.room.message"]

    def joined(self, room_id: str) -> list[str]:
        return list(self.call("GET", f"/rooms/{quote(room_id)}/joined_members")["joined"])

    def download(self, mxc: str) -> bytes:
        server, _, media = mxc.removeprefix("mxc://").partition("/")
        got = httpx.get(f"{self.url}/_matrix/client/v1/media/download/{server}/{media}", timeout=30,
                        headers={"Authorization": f"Bearer {self.token}"})
        got.raise_for_status()
        return got.content


class EncryptedPerson:
    """Someone whose client encrypts (matrix-nio with its e2e extra, as Element would): their own device keys,
    encrypted rooms, messages sealed for every device in the room, answers read by decrypting them."""

    def __init__(self, person: Person, store: Path) -> None:
        self.person, self.loop = person, asyncio.new_event_loop()
        config = nio.AsyncClientConfig(encryption_enabled=True, store_sync_tokens=True)
        store.mkdir(parents=True, exist_ok=True)
        self.client = nio.AsyncClient(person.url, person.user_id, store_path=str(store), config=config)
        self.client.restore_login(person.user_id, person.device_id, person.token)
        self.seen: dict[str, list[Any]] = {}  # room -> its events, decrypted where the keys came
        self._run(self._sync(first=True))

    def _run(self, work: Any) -> Any:
        return self.loop.run_until_complete(work)

    async def _sync(self, *, first: bool = False) -> None:
        client = self.client
        synced = await client.sync(timeout=0, full_state=first)
        assert isinstance(synced, nio.SyncResponse), synced
        for room_id, room in synced.rooms.join.items():
            self.seen.setdefault(room_id, []).extend(room.timeline.events)
        if client.should_upload_keys:
            await client.keys_upload()
        if client.should_query_keys:
            await client.keys_query()
        if client.should_claim_keys:
            await client.keys_claim(client.get_users_for_key_claiming())
        await client.send_to_device_messages()

    def room(self, *invite: str) -> str:
        made = self._run(self.client.room_create(is_direct=True, invite=list(invite), initial_state=[ENCRYPTION]))
        assert isinstance(made, nio.RoomCreateResponse), made
        return str(made.room_id)

    def say(self, room_id: str, text: str) -> str:
        self._run(self._sync())
        sent = self._run(self.client.room_send(room_id, "m.room.message", {"msgtype": "m.text", "body": text},
                                               ignore_unverified_devices=True))
        assert isinstance(sent, nio.RoomSendResponse), sent
        return str(sent.event_id)

    def send_file(self, room_id: str, name: str, data: bytes) -> None:
        uploaded, keys = self._run(self.client.upload(lambda *_: data, content_type="application/octet-stream",
                                                      filename=name, encrypt=True, filesize=len(data)))
        assert isinstance(uploaded, nio.UploadResponse), uploaded
        sent = self._run(self.client.room_send(room_id, "m.room.message", {
            "msgtype": "m.file", "body": name, "filename": name, "file": {"url": uploaded.content_uri, **keys},
            "info": {"size": len(data)}}, ignore_unverified_devices=True))
        assert isinstance(sent, nio.RoomSendResponse), sent

    def files(self, room_id: str) -> dict[str, bytes]:
        """The files others sent to the room, downloaded and decrypted."""
        self._run(self._sync())
        found = {}
        for event in self.seen.get(room_id, []):
            if isinstance(event, nio.RoomEncryptedFile) and event.sender != self.person.user_id:
                got = self._run(self.client.download(mxc=event.url))
                found[event.body] = decrypt_attachment(got.body, event.key["k"], event.hashes["sha256"], event.iv)
        return found

    def answers(self, room_id: str) -> list[str]:
        """What others said in the room that this person could decrypt, each with its latest edit applied."""
        self._run(self._sync())
        shown: dict[str, str] = {}
        for event in self.seen.get(room_id, []):
            if event.sender == self.person.user_id or not isinstance(event, nio.RoomMessage):
                continue
            content = event.source.get("content") or {}
            relates = content.get("m.relates_to") or {}
            if relates.get("rel_type") == "m.replace" and relates.get("event_id") in shown:
                shown[relates["event_id"]] = str((content.get("m.new_content") or content).get("body", ""))
            elif relates.get("rel_type") != "m.replace":
                shown[event.event_id] = str(content.get("body", ""))
        return list(shown.values())

    def undecrypted(self, room_id: str) -> int:
        return sum(isinstance(event, nio.MegolmEvent) for event in self.seen.get(room_id, []))

    def close(self) -> None:
        self._run(self.client.close())
        self.loop.close()
