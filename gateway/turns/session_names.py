"""Whose session a name means: every identity has its own names.

A client names a session (``main``, ``work``, a chat id); the session's id on
the wire is its owner's identity, ``/``, that name (``alice/main``). A
``chat`` token's names are always its own, so no one can take another
identity's ``main`` by sending to it first. An operator reaches another
identity's session only on purpose, by naming that owner (``?owner=bob`` on
HTTP, ``"owner": "bob"`` in a WebSocket frame). memory/session_ids.py reads
an id's two parts.
"""

from __future__ import annotations

import re

from bus.protocol import ErrorCode
from gateway.tokens import Identity
from gateway.turns.refusal import Refused
from memory.session_ids import SEPARATOR, name_in, owner_in

SESSION_ID = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$"
# A token's name, or a channel's identity (``telegram:12345``).
OWNER_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.@+:-]{0,127}$"
ALL_OWNERS = "*"


def check_session_name(name: str) -> None:
    if not isinstance(name, str) or not re.fullmatch(SESSION_ID, name):
        raise Refused(ErrorCode.BAD_REQUEST, "session ids are 1-128 characters: letters, digits and _ . : - "
                      "(starting with a letter or digit)")


def owner_meant(identity: Identity, asked: str | None, doing: str) -> str:
    """Whose things a request means: the caller's own, unless an operator names another ``asked`` owner
    on purpose (``doing``, such as "act on another identity's job", says what was refused to others)."""
    if not asked or asked == identity.name:
        return identity.name
    if not identity.operator:
        raise Refused(ErrorCode.FORBIDDEN, f"only an operator token may {doing}; leave out `owner` to use your own")
    if not re.fullmatch(OWNER_NAME, asked):
        raise Refused(ErrorCode.BAD_REQUEST, f"owner {asked[:64]!r} is not an identity's name")
    return asked


def qualify(identity: Identity, name: str, owner: str | None = None) -> str:
    """The wire id of the session ``identity`` means by ``name`` (another ``owner``'s: operators only)."""
    check_session_name(name)
    return owner_meant(identity, owner, "act on another identity's session") + SEPARATOR + name


def shown_to(identity: Identity, session_id: str) -> str:
    """A session id as ``identity`` names it: its own by name, another owner's in full."""
    return name_in(session_id) if owner_in(session_id) == identity.name else session_id


def path_of(identity: Identity, session_id: str, suffix: str = "") -> str:
    """The HTTP path by which ``identity`` reaches the session (with ``?owner=`` when it is another's)."""
    owner = owner_in(session_id)
    query = "" if owner == identity.name else f"?owner={owner}"
    return f"/v1/sessions/{name_in(session_id)}{suffix}{query}"
