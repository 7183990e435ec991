"""Whose session a name means: every identity has its own names.

A client names a session (``main``, ``work``, a chat id); the session's id on
the wire is its owner's identity, ``/``, that name (``alice/main``). A
``chat`` token's names are always its own, so no one can take another
identity's ``main`` by sending to it first. An operator reaches another
identity's session only on purpose, by naming that owner (``?owner=bob`` on
HTTP, ``"owner": "bob"`` in a WebSocket frame); ``/`` never appears in an
identity's name nor in a session's name, so the split is unambiguous.
"""

from __future__ import annotations

import re

from bus.protocol import ErrorCode
from gateway.tokens import Identity
from gateway.turns.refusal import Refused

SESSION_ID = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$"
# A token's name, or a channel's identity (``telegram:12345``).
OWNER_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.@+:-]{0,127}$"
SEPARATOR = "/"
ALL_OWNERS = "*"


def check_session_name(name: str) -> None:
    if not isinstance(name, str) or not re.match(SESSION_ID, name):
        raise Refused(ErrorCode.BAD_REQUEST, "session ids are 1-128 characters: letters, digits and _ . : - "
                      "(starting with a letter or digit)")


def qualify(identity: Identity, name: str, owner: str | None = None) -> str:
    """The wire id of the session ``identity`` means by ``name`` (another ``owner``'s: operators only)."""
    check_session_name(name)
    if owner is None or owner == "" or owner == identity.name:
        return f"{identity.name}{SEPARATOR}{name}"
    if not identity.operator:
        raise Refused(ErrorCode.FORBIDDEN, "only an operator token may act on another identity's session; "
                      "leave out `owner` to use your own")
    if not re.match(OWNER_NAME, owner):
        raise Refused(ErrorCode.BAD_REQUEST, f"owner {owner[:64]!r} is not an identity's name")
    return f"{owner}{SEPARATOR}{name}"


def owner_of(session_id: str) -> str:
    return session_id.partition(SEPARATOR)[0]


def name_of(session_id: str) -> str:
    """The name a session's owner gave it (what clients see of their own sessions)."""
    owner, separator, name = session_id.partition(SEPARATOR)
    return name if separator else owner


def shown_to(identity: Identity, session_id: str) -> str:
    """A session id as ``identity`` names it: its own by name, another owner's in full."""
    return name_of(session_id) if owner_of(session_id) == identity.name else session_id


def path_of(identity: Identity, session_id: str, suffix: str = "") -> str:
    """The HTTP path by which ``identity`` reaches the session (with ``?owner=`` when it is another's)."""
    owner = owner_of(session_id)
    query = "" if owner == identity.name else f"?owner={owner}"
    return f"/v1/sessions/{name_of(session_id)}{suffix}{query}"
