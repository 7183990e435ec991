"""Whose session a name means: each identity's names are its own; another owner's only for operators."""

from __future__ import annotations

import pytest

from gateway.server.errors import Refused
from gateway.server.session_names import name_of, owner_of, path_of, qualify, shown_to
from gateway.tokens import Identity

ALICE = Identity(name="alice")
OPS = Identity(name="ops", scope="operator")


@pytest.mark.parametrize("identity", [ALICE, OPS])
def test_a_bare_name_is_always_the_callers_own(identity: Identity) -> None:
    assert qualify(identity, "main") == f"{identity.name}/main"
    assert qualify(identity, "main", identity.name) == f"{identity.name}/main"
    assert qualify(identity, "main", "") == f"{identity.name}/main"


@pytest.mark.parametrize("owner", ["ops", "bob", "telegram:42", "owner"])
def test_a_chat_token_never_names_another_owner(owner: str) -> None:
    with pytest.raises(Refused) as refused:
        qualify(ALICE, "main", owner)
    assert refused.value.status == 403 and "operator" in refused.value.message


def test_an_operator_names_another_owner_on_purpose() -> None:
    assert qualify(OPS, "main", "alice") == "alice/main"
    assert qualify(OPS, "chat-7", "telegram:42") == "telegram:42/chat-7"
    for bad_owner in ("../x", "a/b", " ", "x" * 200, "*"):
        with pytest.raises(Refused) as refused:
            qualify(OPS, "main", bad_owner)
        assert refused.value.status == 400


@pytest.mark.parametrize("name", ["", "a/b", "../etc", "x" * 129, "-lead", "sp ace", "ümlaut"])
def test_a_bad_name_is_refused_for_everyone(name: str) -> None:
    for identity in (ALICE, OPS):
        with pytest.raises(Refused) as refused:
            qualify(identity, name)
        assert refused.value.status == 400


def test_what_a_client_is_shown() -> None:
    assert (owner_of("alice/main"), name_of("alice/main")) == ("alice", "main")
    assert shown_to(ALICE, "alice/main") == "main"
    assert shown_to(OPS, "alice/main") == "alice/main"
    assert path_of(ALICE, "alice/main", "/events") == "/v1/sessions/main/events"
    assert path_of(OPS, "alice/main", "/events") == "/v1/sessions/main/events?owner=alice"
