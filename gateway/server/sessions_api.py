"""``/v1/sessions``: an identity's sessions listed (with their titles, sizes and spend; archived ones too),
read, renamed, forked, deleted, and an archived one restored. A chat token reaches only its own; an operator
names another identity's (``?owner=NAME``, ``?owner=*`` for every one's). A session idle past retention has
left Redis for a file (memory/archive.py): it is still listed, read, deleted and restored here."""

from __future__ import annotations

import logging

from pydantic import BaseModel, ConfigDict, Field, field_validator
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from bus.log import kv
from bus.protocol import ErrorCode
from bus.streams import Bus
from gateway.server.handling import caller, listed_owner, read_json, session_id_of
from gateway.tokens import Identity
from gateway.turns.refusal import Refused, not_found
from gateway.turns.runner import TurnRunner
from gateway.turns.session_names import check_session_name, shown_to
from memory.archive import Archived
from memory.flight import KEEP_DAYS, FlightRecorder
from memory.retention import Archiver
from memory.session_ids import SEPARATOR, owner_in
from memory.sessions import TITLE_CHARS, ForkRefused, SessionStore

log = logging.getLogger("gateway.http")
# What a list shows of an archived session, read from its file's header (memory/archive.py).
ARCHIVED_SHOWN = ("title", "named", "messages", "updated_at", "spend_usd", "archived_at")


class Rename(BaseModel):
    model_config = ConfigDict(extra="forbid")

    title: str = Field(min_length=1, max_length=TITLE_CHARS)

    @field_validator("title")
    @classmethod
    def _one_line(cls, value: str) -> str:
        line = " ".join(value.split())
        if not line:
            raise ValueError("a title needs some text")
        return line


class Fork(BaseModel):
    model_config = ConfigDict(extra="forbid")

    at: int = Field(ge=1)  # the message (1 is the first) whose answer the new session ends with
    name: str


class SessionRoutes:
    def __init__(self, bus: Bus, sessions: SessionStore, turns: TurnRunner, archiver: Archiver | None) -> None:
        self.bus, self.sessions, self.turns, self.archiver = bus, sessions, turns, archiver

    def routes(self) -> list[Route]:
        return [
            Route("/v1/sessions/{session_id}/fork", self.fork_session, methods=["POST"]),
            Route("/v1/sessions/{session_id}/restore", self.restore_session, methods=["POST"]),
            Route("/v1/sessions/{session_id}", self.get_session, methods=["GET"]),
            Route("/v1/sessions/{session_id}", self.delete_session, methods=["DELETE"]),
            Route("/v1/sessions/{session_id}", self.rename_session, methods=["PATCH"]),
            Route("/v1/sessions", self.list_sessions, methods=["GET"]),
        ]

    async def get_session(self, request: Request) -> Response:
        session_id = session_id_of(request)
        identity = caller(request)
        archived = await self._archived(identity, session_id)
        if archived is not None:  # idle past runtime.retention.transcript_days: read from its file
            return JSONResponse({"session_id": shown_to(identity, session_id), "archived": True,
                                 "entries": [e.model_dump(mode="json", exclude_none=True) for e in archived.entries],
                                 "record": archived.record})
        await self.turns.own_session(identity, session_id, existing=True)
        entries = await self.sessions.load(session_id)
        return JSONResponse({"session_id": shown_to(identity, session_id),
                             "entries": [e.model_dump(mode="json", exclude_none=True) for e in entries]})

    async def _archived(self, identity: Identity, session_id: str) -> Archived | None:
        """The caller's archived session of that id, when it has left Redis. The archive is looked up under
        the session's owner as its id says (checked in the file too): another's is never found."""
        if self.archiver is None or await self.sessions.exists(session_id):
            return None
        owner = owner_in(session_id)
        if not identity.may_see(owner):
            return None
        found = self.archiver.read(owner, session_id)
        if found is None and identity.operator:  # a session from before owners is the operators'
            found = self.archiver.read("", session_id)
        return found

    async def restore_session(self, request: Request) -> Response:
        """An archived session back in Redis, to go on with it."""
        session_id = session_id_of(request)
        identity = caller(request)
        archived = await self._archived(identity, session_id)
        if archived is None or self.archiver is None:
            raise not_found(f"no archived session {shown_to(identity, session_id)!r}")
        async def charge(size: int) -> None:  # what it puts back in Redis counts as a message and its text
            await self.turns.limits.take_message(identity.name, size=size)

        if not await self.archiver.restore(archived.owner, session_id, charge=charge):
            raise Refused(ErrorCode.CONFLICT, "a session of that name exists again: it was not restored")
        log.info("session restored %s", kv(session=session_id, by=identity.name))
        return JSONResponse({"session_id": shown_to(identity, session_id), "restored": True})

    async def delete_session(self, request: Request) -> Response:
        session_id = session_id_of(request)
        identity = caller(request)
        archived = await self._archived(identity, session_id)
        if archived is not None and self.archiver is not None:  # deleting an archived one deletes its file
            self.archiver.archive.remove(archived.owner, session_id)
            log.info("archived session deleted %s", kv(session=session_id, by=identity.name))
            return JSONResponse({"session_id": shown_to(identity, session_id), "deleted": True})
        await self.turns.own_session(identity, session_id, existing=True)
        await self.sessions.delete(session_id)
        log.info("session deleted %s", kv(session=session_id, by=identity.name))
        return JSONResponse({"session_id": shown_to(identity, session_id), "deleted": True})

    async def fork_session(self, request: Request) -> Response:
        """A new session with this one's first ``at`` messages and what answered them (and their flight record):
        no model is asked for any of it. It is the same owner's, named ``name``."""
        session_id = session_id_of(request)
        identity = caller(request)
        body = await read_json(request, Fork, example='{"at": 3, "name": "main-retry"}')
        await self.turns.own_session(identity, session_id, existing=True)
        target = f"{owner_in(session_id)}{SEPARATOR}{body.name}"
        check_session_name(body.name)
        if await self.sessions.exists(target):  # before it is charged: the page tries the next name on a 409
            raise Refused(ErrorCode.CONFLICT, "a session of that name exists already: choose another name")
        # Copying messages costs what sending them did (at most a burst), and their text counts in the day's
        # (one take: both or neither): a fork is no cheaper way to fill Redis.
        async def charge(size: int) -> None:
            await self.turns.limits.take_message(identity.name, messages=body.at, size=size)

        try:
            kept = await self.sessions.fork(session_id, target, at=body.at, charge=charge)
        except ForkRefused as exc:
            raise Refused(ErrorCode.CONFLICT if exc.taken else ErrorCode.INVALID_ARGUMENTS, str(exc)) from None
        ids = {str(entry.metadata.get("message_id")) for entry in kept if entry.metadata.get("message_id")}
        recorder = FlightRecorder(self.bus.redis, self.bus.keys, keep_s=int(KEEP_DAYS * 86_400))
        steps = await recorder.copy(session_id, target, ids)
        log.info("session forked %s", kv(session=session_id, to=target, at=body.at, by=identity.name))
        return JSONResponse({"session_id": shown_to(identity, target), "from": shown_to(identity, session_id),
                             "at": body.at, "entries": len(kept), "record_steps": steps}, status_code=201)

    async def list_sessions(self, request: Request) -> Response:
        """The caller's sessions by name; an operator's ``?owner=NAME`` lists that identity's, ``?owner=*`` all."""
        identity = caller(request)
        owner = listed_owner(request, "sessions")
        found = await self.sessions.list_sessions(owner=owner)
        about = await self.sessions.about(found)
        if self.archiver is not None:  # archived ones too, marked (their ids are not in Redis any more)
            live = set(found)
            about += [{**{k: v for k, v in header.items() if k in ARCHIVED_SHOWN}, "id": header["session_id"],
                       "archived": True}
                      for header in self.archiver.archive.listed(owner)
                      if header.get("session_id") not in live]
        query = (request.query_params.get("q") or "").casefold()
        for entry in about:
            entry["id"] = shown_to(identity, entry["id"]) if owner is not None else entry["id"]
        if query:  # search: the name or the title holds it
            about = [e for e in about if query in e["id"].casefold() or query in e["title"].casefold()]
        # "sessions": the names, as before; "details": each one's title, messages, last change and spend
        return JSONResponse({"sessions": [e["id"] for e in about], "details": about})

    async def rename_session(self, request: Request) -> Response:
        """A session's title, as a person names it (it was its first message)."""
        session_id = session_id_of(request)
        identity = caller(request)
        body = await read_json(request, Rename, example='{"title": "trip to Lisbon"}')
        await self.turns.own_session(identity, session_id, existing=True)
        await self.sessions.rename(session_id, body.title)
        return JSONResponse({"session_id": shown_to(identity, session_id), "title": body.title})
