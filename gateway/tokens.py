"""Gateway tokens: who a caller is.

A token is an identity: a name, a scope (``chat`` or ``operator``) and
optionally the agents it may use. Redis keeps only each token's SHA-256
(every Gateway of a pool accepts the same tokens); the token itself is shown
once, when it is made. A lookup goes by digest, so no comparison ever runs
over the secret, and the one token from the configuration
(``gateway.token``, named ``owner``) is compared in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from bus.errors import PincerError
from bus.keys import Keys
from bus.protocol import ANY_AGENT
from bus.scripts import lua
from bus.text import text
from memory.standing import remove_and_withdraw

if TYPE_CHECKING:  # only named: `pincer up` makes the owner's token and supervises no Redis client
    from bus.streams import Bus

Scope = Literal["chat", "operator"]
TOKEN_PREFIX = "pcr_"
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$"
# A chat platform's user is an identity too, named by platform and user id ("telegram:12345"); no token
# can take such a name, so no token can reach a platform user's sessions by naming itself after them.
IDENTITY_PATTERN = r"^(?:[a-z]{2,16}:)?[A-Za-z0-9][A-Za-z0-9_.@+-]{0,63}$"
OWNER = "owner"  # the configured token's name; no stored token may take it
OWNER_TOKEN_FILE = "gateway.token"
CACHE_S = 2.0  # a revoked token still works this long on a Gateway that used it just before
CACHE_MAX = 4096

# Each token keeps this many sign-in codes, and this many browser sessions, at most: a new one ends the
# oldest (a token holder signing in over and over must not fill Redis with week-long keys).
MOST_CODES = 20
MOST_BROWSERS = 20

# Name unique, then the record: one step, so a crash leaves neither half.
CREATE = lua("gateway.tokens.create", """
if redis.call('hsetnx', KEYS[2], ARGV[1], ARGV[2]) == 0 then return 0 end
redis.call('hset', KEYS[1], ARGV[2], ARGV[3])
return 1
""")

# KEYS: the new sign-in's key, its token's index (Keys.sign_ins_of). ARGV: record, life in s, how many of
# this kind the token keeps, the kind's key prefix, and a key to drop from the index (the code a session
# was made from) or "". Stored and indexed in one step, scored by when each lapses in µs (so two made in
# one second keep their order); returns the keys of the oldest of that kind past the bound, taken out of
# the index (the caller deletes them).
KEEP_SIGN_IN = lua("gateway.tokens.keep_sign_in", """
local life = tonumber(ARGV[2])
redis.call('set', KEYS[1], ARGV[1], 'EX', life)
local t = redis.call('time')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
if ARGV[5] ~= '' then redis.call('zrem', KEYS[2], ARGV[5]) end
redis.call('zremrangebyscore', KEYS[2], '-inf', now)
redis.call('zadd', KEYS[2], now + life * 1000000, KEYS[1])
if redis.call('ttl', KEYS[2]) < life then redis.call('expire', KEYS[2], life) end
local kind, mine = ARGV[4], {}
for _, key in ipairs(redis.call('zrange', KEYS[2], 0, -1)) do
  if string.sub(key, 1, #kind) == kind then mine[#mine + 1] = key end
end
local over = #mine - tonumber(ARGV[3])
local ended = {}
for i = 1, over do
  redis.call('zrem', KEYS[2], mine[i])
  ended[i] = mine[i]
end
return ended
""")


class TokenError(PincerError):
    """A token cannot be made or revoked as asked; the message says why."""


class Identity(BaseModel):
    """Who sent a request, as its token says."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=IDENTITY_PATTERN)
    scope: Scope = "chat"
    agents: tuple[str, ...] | None = None  # None: every agent
    created: int = 0

    @property
    def operator(self) -> bool:
        return self.scope == "operator"

    def may_use(self, agent_id: str) -> bool:
        return self.agents is None or agent_id in self.agents

    def agents_stamp(self) -> list[str]:
        """What this identity's turns carry (``ChatMessage.agents``): checked at every agent switch."""
        return [ANY_AGENT] if self.agents is None else list(self.agents)

    def may_see(self, owner: str | None) -> bool:
        """A session is the business of its owner and of operators."""
        return self.operator or owner == self.name


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class TokenStore:
    def __init__(self, redis: Any, keys: Keys, *, static: str | None = None) -> None:
        self.redis, self.keys = redis, keys
        self._static = digest(static) if static else None
        self._create = redis.register_script(CREATE)
        self._cache: dict[str, tuple[float, Identity | None]] = {}

    async def create(self, name: str, *, scope: Scope = "chat", agents: list[str] | None = None) -> str:
        """A new token for ``name``, returned once; ``TokenError`` if the name is taken or bad."""
        if name == OWNER:
            raise TokenError(f"the name {OWNER!r} is the configured token's (gateway.token); pick another")
        if not re.match(NAME_PATTERN, name):
            raise TokenError(f"token names are 1-64 letters, digits and _ . @ - ({NAME_PATTERN}); "
                             f"{name!r} is not one (names with ':' are chat platforms' users)")
        identity = Identity(name=name, scope=scope, agents=tuple(agents) if agents else None,
                            created=int(time.time()))
        token = new_token()
        record = identity.model_dump_json()
        if not await self._create(keys=[self.keys.tokens, self.keys.token_names], args=[name, digest(token), record]):
            raise TokenError(f"a token named {name!r} exists; revoke it first (`pincer token revoke {name}`)")
        return token

    async def list(self) -> list[Identity]:
        raw = await self.redis.hvals(self.keys.tokens)
        return sorted((Identity.model_validate_json(r) for r in raw), key=lambda i: i.name)

    async def exists(self, name: str) -> bool:
        """Whether a stored token has this name (the configured one is not stored)."""
        return bool(await self.redis.hexists(self.keys.token_names, name))

    async def revoke(self, name: str) -> bool:
        """Revoke the token named ``name`` and end its sign-in codes and browser sessions."""
        found = await self.redis.hget(self.keys.token_names, name)
        if found is None:
            return False
        token_digest = text(found)
        signed_in = await self.redis.zrange(self.keys.sign_ins_of(token_digest), 0, -1)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hdel(self.keys.token_names, name)
            pipe.hdel(self.keys.tokens, found)
            pipe.delete(self.keys.sign_ins_of(token_digest), *signed_in)
            await pipe.execute()
        return True

    async def configured(self) -> bool:
        """Whether any token would be accepted (the Gateway refuses a public bind without one)."""
        return self._static is not None or bool(await self.redis.hlen(self.keys.tokens))

    async def valid_digest(self, token_digest: str) -> bool:
        """Whether the token with this digest is still accepted (not revoked)."""
        if self._static is not None and hmac.compare_digest(token_digest, self._static):
            return True
        return bool(await self.redis.hexists(self.keys.tokens, token_digest))

    async def valid_digests(self, digests: Sequence[str]) -> Sequence[bool]:
        """Whether each token digest is still accepted, in one round trip ("" is never)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for token_digest in digests:
                pipe.hexists(self.keys.tokens, token_digest)
            found = await pipe.execute()
        return [bool(d) and (bool(f) or (self._static is not None and hmac.compare_digest(d, self._static)))
                for d, f in zip(digests, found, strict=True)]

    async def identify(self, token: str) -> Identity | None:
        """The identity a presented token stands for, or None."""
        if not token or len(token) > 512:
            return None
        key = digest(token)
        if self._static is not None and hmac.compare_digest(key, self._static):
            return Identity(name=OWNER, scope="operator")
        now = time.monotonic()
        cached = self._cache.get(key)
        if cached is not None and cached[0] > now:
            return cached[1]
        raw = await self.redis.hget(self.keys.tokens, key)
        identity = Identity.model_validate_json(raw) if raw else None
        if identity is not None:  # misses are not kept: a flood of wrong tokens must not fill memory
            if len(self._cache) >= CACHE_MAX:
                self._cache.clear()
            self._cache[key] = (now + CACHE_S, identity)
        return identity


async def revoke_and_forget(bus: Bus, store: TokenStore, name: str) -> list[str] | None:
    """Revoke the token named ``name`` and withdraw its identity's jobs and allow-always rules
    (memory/standing.py); the jobs removed, or None when no token has that name."""
    return await remove_and_withdraw(bus, name, exists=lambda: store.exists(name), remove=lambda: store.revoke(name))


class WebSessions:
    """Browser sign-ins: a one-time link's code becomes an HttpOnly cookie's session, which lasts as
    long as the token it came from (revoke the token and its browser sessions end with it). A token keeps
    at most ``MOST_CODES`` codes and ``MOST_BROWSERS`` sessions; a new one ends the oldest."""

    def __init__(self, redis: Any, keys: Keys, tokens: TokenStore, *, link_s: int = 120,
                 session_s: int = 7 * 86_400) -> None:
        self.redis, self.keys, self.tokens = redis, keys, tokens
        self.link_s, self.session_s = link_s, session_s
        self._keep = redis.register_script(KEEP_SIGN_IN)

    async def link(self, token: str) -> str | None:
        """A one-time code for the bearer of ``token`` (None if the token is not valid)."""
        identity = await self.tokens.identify(token)
        if identity is None:
            return None
        code = secrets.token_urlsafe(24)
        record = json.dumps({"identity": identity.model_dump(mode="json"), "token": digest(token)})
        await self._kept(self.keys.login_code(digest(code)), digest(token), record, self.link_s, MOST_CODES)
        return code

    async def redeem(self, code: str) -> str | None:
        """The cookie value for a code used for the first time within its life; None otherwise."""
        if not code or len(code) > 128:
            return None
        used = self.keys.login_code(digest(code))
        record = await self.redis.getdel(used)
        if record is None:
            return None
        session = secrets.token_urlsafe(32)
        await self._kept(self.keys.web_session(digest(session)), json.loads(record)["token"], record,
                         self.session_s, MOST_BROWSERS, used=used)
        return session

    async def sign_in(self, token: str) -> str | None:
        """A cookie value straight from a pasted token (the page's other way in)."""
        code = await self.link(token)
        return await self.redeem(code) if code else None

    async def identify(self, session: str) -> tuple[Identity, str] | None:
        """The identity a cookie's session stands for and its token's digest, or None."""
        if not session or len(session) > 128:
            return None
        raw = await self.redis.get(self.keys.web_session(digest(session)))
        if raw is None:
            return None
        record = json.loads(raw)
        if not await self.tokens.valid_digest(record["token"]):
            await self.redis.delete(self.keys.web_session(digest(session)))
            return None
        return Identity.model_validate(record["identity"]), str(record["token"])

    async def alive(self, sessions: list[str]) -> list[bool]:
        """Whether each cookie's session still stands (not signed out, not past its week), in one round trip."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for session in sessions:
                pipe.exists(self.keys.web_session(digest(session)))
            found = await pipe.execute()
        return [bool(f) for f in found]

    async def end(self, session: str) -> None:
        """Sign a browser out (its place among its token's sessions goes to the next)."""
        key = self.keys.web_session(digest(session))
        record = await self.redis.getdel(key)
        if record is not None:
            await self.redis.zrem(self.keys.sign_ins_of(json.loads(record)["token"]), key)

    async def _kept(self, key: str, token_digest: str, record: str | bytes, life_s: int, most: int, *,
                    used: str = "") -> None:
        """Store a code or a session for its token, ending the token's oldest of that kind past ``most``."""
        kind = key[:key.rindex(":") + 1]
        ended = await self._keep(keys=[key, self.keys.sign_ins_of(token_digest)],
                                 args=[record, life_s, most, kind, used])
        if ended:
            await self.redis.delete(*ended)


def owner_token_path(data_dir: Path) -> Path:
    return Path(data_dir).expanduser() / OWNER_TOKEN_FILE


def read_owner_token(data_dir: Path) -> str | None:
    """The token `pincer up` made, if there is one (never read through a link)."""
    try:
        fd = os.open(owner_token_path(data_dir), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, encoding="ascii") as file:
        return file.read().strip() or None


def ensure_owner_token(data_dir: Path) -> str:
    """The owner token of this data dir, made on first use: mode 0600, never through a link."""
    existing = read_owner_token(data_dir)
    if existing:
        return existing
    path = owner_token_path(data_dir)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    token = new_token()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileExistsError:  # another `pincer up` made it first, or it is a link we will not follow
        existing = read_owner_token(data_dir)
        if existing:
            return existing
        raise TokenError(f"{path} exists but is not a token file (a link, or empty); remove it and start "
                         "again") from None
    with os.fdopen(fd, "w", encoding="ascii") as file:
        file.write(token + "\n")
    return token
