"""A session's id is its owner's name, ``/``, the name the owner gave it (``alice/main``).

Neither an identity's name nor a session's name holds ``/``, so the split is
unambiguous. An id without ``/`` is from before owners (or a raw bus client's):
it has no owner, and its name is the whole id.
"""

from __future__ import annotations

SEPARATOR = "/"


def owner_in(session_id: str) -> str:
    """The owner named by the id (``alice`` of ``alice/main``); "" for an id without one."""
    owner, separator, _ = session_id.partition(SEPARATOR)
    return owner if separator else ""


def name_in(session_id: str) -> str:
    """The name the owner gave the session (``main`` of ``alice/main``); the whole id without an owner."""
    owner, separator, name = session_id.partition(SEPARATOR)
    return name if separator else owner
