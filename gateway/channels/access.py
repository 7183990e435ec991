"""Who on a chat platform may talk to the agent: the configured ``allow_from``, and strangers paired by code.

A platform user is an identity named by platform and user id (``telegram:12345``), a chat-scoped
one limited to the channel's agent: the same session, policy (``sender``) and budget rules as a
token's. A stranger is told a one-time code and nothing else (no model call is ever made for
them); `pincer channels pair CODE`, run by whoever runs Pincer, lets them in for good.
"""

from __future__ import annotations

import secrets
import time

from bus.streams import Bus
from gateway.tokens import Identity
from memory.standing import withdraw

CODE_ALPHABET = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"  # no 0/O, 1/I: read out loud or typed on a phone
CODE_LENGTH = 8


def identity_name(channel: str, user: str) -> str:
    return f"{channel}:{user}"


class Access:
    def __init__(self, bus: Bus, channel: str, *, allow_from: list[str], agent: str, pairing_ttl_s: int) -> None:
        self.bus, self.channel, self.agent = bus, channel, agent
        # Ids match ids, as the platform names users (a Matrix id, an email address); "@name" entries match
        # handles only, and only their first holder (a handle can be changed and taken; an id cannot).
        self.allowed_ids = {a.lower() for a in allow_from}
        self.allowed_names = {a[1:].lower() for a in allow_from if a.startswith("@")}
        self.pairing_ttl_s = pairing_ttl_s

    async def identity(self, user: str, username: str = "") -> Identity | None:
        """The identity of a platform user who may talk to the agent; None for a stranger."""
        allowed = user.lower() in self.allowed_ids or await self._named(user, username.lower())
        if not allowed and not await self.bus.redis.hexists(self.bus.keys.channel_paired(self.channel), user):
            return None
        return Identity(name=identity_name(self.channel, user), scope="chat", agents=(self.agent,))

    async def _named(self, user: str, handle: str) -> bool:
        """Whether an ``@`` entry lets the user in: an email domain its address is at, or a handle bound to
        this user id (the first one seen with the handle is bound to it for good)."""
        if not self.allowed_names:
            return False
        if "@" in handle:  # an address (no platform's handle holds "@"): "@example.com" names its domain
            return handle.rpartition("@")[2] in self.allowed_names
        key = self.bus.keys.channel_handles(self.channel)
        async with self.bus.redis.pipeline(transaction=True) as pipe:
            if handle in self.allowed_names:
                pipe.hsetnx(key, handle, user)
            pipe.hmget(key, sorted(self.allowed_names))
            bound = (await pipe.execute())[-1]
        return user.encode() in bound  # its own handle now, or one it held when first seen

    async def code_for(self, user: str, username: str) -> tuple[str, bool]:
        """The stranger's pairing code, and whether it is new (a stranger is told their code once)."""
        redis, keys = self.bus.redis, self.bus.keys
        given: bytes | None = await redis.get(keys.channel_stranger(self.channel, user))  # type: ignore[assignment]
        if given is not None and await redis.exists(keys.channel_pairing(self.channel, given.decode())):
            return given.decode(), False
        code = "".join(secrets.choice(CODE_ALPHABET) for _ in range(CODE_LENGTH))
        async with redis.pipeline(transaction=True) as pipe:
            pipe.hset(keys.channel_pairing(self.channel, code), mapping={"user": user, "username": username,
                                                                         "asked": int(time.time())})
            pipe.expire(keys.channel_pairing(self.channel, code), self.pairing_ttl_s)
            pipe.set(keys.channel_stranger(self.channel, user), code, ex=self.pairing_ttl_s)
            await pipe.execute()
        return code, True


async def pair(bus: Bus, channel: str, code: str, *, by: str) -> dict[str, str] | None:
    """Let in the stranger who was given ``code`` (once: the code is spent); who it was, or None."""
    key = bus.keys.channel_pairing(channel, code.strip().upper())
    async with bus.redis.pipeline(transaction=True) as pipe:
        pipe.hgetall(key)
        pipe.delete(key)
        found, _ = await pipe.execute()
    if not found:
        return None
    who = {k.decode(): v.decode() for k, v in found.items()}
    await bus.redis.hset(bus.keys.channel_paired(channel), who["user"],
                         f"{by} {int(time.time())} @{who.get('username', '')}")
    await bus.redis.delete(bus.keys.channel_stranger(channel, who["user"]))
    return who


async def paired(bus: Bus, channel: str) -> dict[str, str]:
    """Users let in by pairing: user id -> who let them in, when, and their handle then."""
    raw: dict[bytes, bytes] = await bus.redis.hgetall(bus.keys.channel_paired(channel))  # type: ignore[assignment]
    return {k.decode(): v.decode() for k, v in raw.items()}


async def unpair(bus: Bus, channel: str, user: str) -> bool:
    """Let the user out (a paired one, or one an ``@handle`` entry was bound to); ``@handle``: free the handle
    for whoever shows it next."""
    handles = bus.keys.channel_handles(channel)
    if user.startswith("@"):
        return bool(await bus.redis.hdel(handles, user[1:].lower()))
    bound: dict[bytes, bytes] = await bus.redis.hgetall(handles)  # type: ignore[assignment]
    held = [name for name, holder in bound.items() if holder == user.encode()]
    if held:
        await bus.redis.hdel(handles, *held)
    return bool(await bus.redis.hdel(bus.keys.channel_paired(channel), user)) or bool(held)


async def unpair_and_forget(bus: Bus, channel: str, user: str) -> list[str] | None:
    """Let the user out and withdraw their jobs and allow-always rules (memory/standing.py); the jobs removed,
    or None when the user was not let in."""
    if not await unpair(bus, channel, user):
        return None
    return await withdraw(bus, identity_name(channel, user))


async def pending(bus: Bus, channel: str) -> list[dict[str, str | int]]:
    """The strangers waiting for an operator to pair them, oldest first: code, user, username, when they
    asked and how many seconds their code has left."""
    prefix = bus.keys.channel_pairing(channel, "")
    keys = [key async for key in bus.redis.scan_iter(match=f"{prefix}*", count=500)]
    found: list[dict[str, str | int]] = []
    for key in keys:
        async with bus.redis.pipeline(transaction=False) as pipe:
            pipe.hgetall(key)
            pipe.ttl(key)
            raw, ttl = await pipe.execute()
        if raw:  # paired or lapsed since the scan
            who = {k.decode(): v.decode() for k, v in raw.items()}
            found.append({"code": key.decode().removeprefix(prefix), "user": who.get("user", ""),
                          "username": who.get("username", ""), "asked": int(who.get("asked") or 0),
                          "expires_in": max(int(ttl), 0)})
    return sorted(found, key=lambda w: (w["asked"], str(w["code"])))
