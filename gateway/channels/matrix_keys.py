"""The Matrix channel's end-to-end encryption: the device's keys at rest (a store encrypted with a key of
this install's own), held by one process at a time (a device lease in Redis), exchanged after each sync,
and the messages whose room key has not come yet, kept in Redis until it does."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import secrets
import time
from pathlib import Path
from typing import Any

import nio

from bus.lease import Lease
from bus.presence import alive
from bus.private_file import open_private
from bus.redis_client import RedisAway
from bus.streams import Bus
from gateway.channels.config import MatrixSettings
from gateway.channels.errors import PlatformRefused
from gateway.channels.intake import ROLE as CHANNEL_ROLE
from gateway.channels.matrix_calls import checked, translated

log = logging.getLogger("gateway.channels.matrix")

DEVICE_TTL_MS = 30_000  # the device lease; renewed every third of it
DEVICE_WAIT_S = 60.0  # how long a second process waits for the device's holder to go
UNDECRYPTED_KEEP_S = 3600.0  # a message whose room key never came is given up after this
LEGACY_STORE_KEY = "pincer-matrix"  # the fixed key stores made before a key of their own was


def store_key(settings: MatrixSettings, store_dir: Path) -> str:
    """The key the device's store is encrypted with at rest: ``store_key`` when set, else one made at random for
    this install and kept beside the store, ``<store_dir>.key`` (``<data_dir>/matrix.key``), 0600: a copy of the
    store alone does not open it. A store made with the old fixed key keeps it (written to the file, warned)."""
    configured = settings.store_key.get_secret_value()
    if configured:
        return configured
    store_dir.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = open_private(store_dir.with_name(f"{store_dir.name}.key"), os.O_RDWR)
    with os.fdopen(fd, "r+", encoding="utf-8") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # two processes starting at once make one key, not two
        key = handle.read().strip()
        if not key:
            legacy = store_dir.is_dir() and any(store_dir.glob("*.db"))
            key = LEGACY_STORE_KEY if legacy else secrets.token_urlsafe(32)
            handle.write(key)
            if legacy:
                log.warning("Matrix: the device's store in %s is encrypted with the old fixed key; set store_key "
                            "(or move the store aside for a new device) to have a key of its own", store_dir)
    return key


class DeviceKeys:
    """One account's device keys, in nio's store at ``store_dir``, used by this process alone."""

    def __init__(self, client: nio.AsyncClient, bus: Bus, settings: MatrixSettings, *, channel: str,
                 store_dir: Path, instance_id: str) -> None:
        self.client, self.bus, self.settings = client, bus, settings
        self.channel, self.store_dir, self.instance_id = channel, store_dir, instance_id
        self.waiting = bus.keys.channel_thread(channel, f"undecrypted:{settings.user_id}")
        self.lease: Lease | None = None
        self.holding: asyncio.Task[None] | None = None
        self.lost = ""  # why this process may no longer use the device's keys
        self._read_late: list[str] = []  # waiting messages the last read returned (the bus has them now)

    async def open(self, device_id: str) -> None:
        """Hold the device, then load its keys from the store."""
        if not device_id:
            raise PlatformRefused("the access token has no device, and encryption needs one: make the token by "
                                  "logging in (docs/channels/matrix.md), or set encryption: false")
        if self.lease is None:  # the channel's start is tried again while the homeserver is away
            await self.hold(device_id)
        await asyncio.to_thread(self.store_dir.mkdir, mode=0o700, parents=True, exist_ok=True)
        self.client.load_store()
        log.info("Matrix: end-to-end encryption on, device %s, keys in %s", device_id, self.store_dir)

    async def hold(self, device_id: str) -> None:
        """The device lease: two processes using one device's keys would break each other's sessions. A
        holder that stopped (cleanly or killed) has no heartbeat, and its lease is taken at once."""
        key = self.bus.keys.channel_thread(self.channel, f"device:{self.settings.user_id}:{device_id}")
        self.lease = lease = Lease(self.bus.redis, key, self.instance_id or f"matrix-{id(self)}",
                                   ttl_ms=DEVICE_TTL_MS)
        deadline = time.monotonic() + DEVICE_WAIT_S
        while not await lease.take():
            holder: bytes | None = await self.bus.redis.get(key)  # type: ignore[assignment]  # bytes
            if holder is not None and holder.decode() not in await alive(self.bus, CHANNEL_ROLE):
                await self.bus.redis.delete(key)  # its process is gone (killed): no heartbeat
                continue
            if time.monotonic() > deadline:
                raise PlatformRefused(f"another Matrix channel process ({holder.decode() if holder else '?'}) holds "
                                      f"device {device_id}'s encryption keys; run one Matrix channel with "
                                      "encryption, or give each its own access token")
            await asyncio.sleep(2.0)
        self.holding = asyncio.create_task(self._keep(lease))

    async def _keep(self, lease: Lease) -> None:
        while True:
            await asyncio.sleep(lease.ttl_ms / 3000)
            try:
                if not await lease.take():
                    self.lost = (f"another process took device {self.client.device_id}'s encryption keys "
                                 "(its lease lapsed while Redis was away?); restart this channel")
                    log.error("Matrix: %s", self.lost)
                    return
            except RedisAway as exc:  # Redis away: the lease is retaken when it is back
                log.warning("Matrix: device lease not renewed (%s)", exc)

    async def exchange(self) -> None:
        """What nio learnt it owes after a sync: its keys uploaded, others' fetched, room keys sent."""
        client = self.client
        async with translated("keys"):
            if client.should_upload_keys:
                checked(await client.keys_upload(), "keys upload")
            if client.should_query_keys:
                checked(await client.keys_query(), "keys query")
            if client.should_claim_keys:
                checked(await client.keys_claim(client.get_users_for_key_claiming()), "keys claim")
            for sent in await client.send_to_device_messages():
                checked(sent, "to-device")

    async def wait_for_key(self, room_id: str, event: nio.MegolmEvent) -> None:
        """A message whose room key has not come yet: kept (in Redis, so a restart keeps it) and the key
        asked of the sender's devices."""
        await self.bus.redis.hset(self.waiting, event.event_id, json.dumps({"room": room_id, "at": time.time(),
                                                                            "source": event.source}))
        log.info("Matrix: message %s in %s waits for its room key", event.event_id, room_id)
        with contextlib.suppress(nio.LocalProtocolError):  # already asked for this session
            async with translated("key request"):
                checked(await self.client.request_room_key(event), "key request")

    async def readable(self) -> list[tuple[str, dict[str, Any]]]:
        """The waiting messages whose keys have come since, as (room, decrypted event); those never readable
        after UNDECRYPTED_KEEP_S are given up."""
        if self._read_late:
            await self.bus.redis.hdel(self.waiting, *self._read_late)
        self._read_late = []
        found = []
        kept: dict[bytes, bytes] = await self.bus.redis.hgetall(self.waiting)  # type: ignore[assignment]  # bytes
        for event_id, raw in kept.items():
            entry = json.loads(raw)
            event = nio.Event.parse_encrypted_event(entry["source"])
            if not isinstance(event, nio.MegolmEvent):
                await self.bus.redis.hdel(self.waiting, event_id)
                continue
            event.room_id = entry["room"]
            try:
                decrypted = self.client.decrypt_event(event)
            except nio.EncryptionError:
                if time.time() - float(entry["at"]) > UNDECRYPTED_KEEP_S:
                    log.warning("Matrix: message %s in %s never became readable (its room key did not come); "
                                "given up", event.event_id, entry["room"])
                    await self.bus.redis.hdel(self.waiting, event_id)
                continue
            self._read_late.append(event_id.decode())
            if isinstance(decrypted, nio.Event):
                found.append((entry["room"], decrypted.source))
        return found
