"""Whose session a name means: each identity's names are its own; another owner's only for operators."""

from __future__ import annotations

import json

import pytest
from starlette.requests import Request

from bus.protocol import ErrorCode
from gateway.server.errors import refusal_response
from gateway.server.handling import listed_owner
from gateway.tokens import Identity
from gateway.turns.refusal import Refused
from gateway.turns.session_names import owner_meant, path_of, qualify, shown_to
from memory.session_ids import name_in, owner_in

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
    assert refused.value.code == ErrorCode.FORBIDDEN and "operator" in refused.value.message


def test_an_operator_names_another_owner_on_purpose() -> None:
    assert qualify(OPS, "main", "alice") == "alice/main"
    assert qualify(OPS, "chat-7", "telegram:42") == "telegram:42/chat-7"
    for bad_owner in ("../x", "a/b", " ", "x" * 200, "*", "alice\n"):  # `$` alone would pass the newline
        with pytest.raises(Refused) as refused:
            qualify(OPS, "main", bad_owner)
        assert refused.value.code == ErrorCode.BAD_REQUEST


def _listing(identity: Identity, query: bytes) -> Request:
    request = Request({"type": "http", "query_string": query, "headers": [], "state": {}})
    request.state.identity = identity
    return request


def test_one_owner_check_for_acting_and_listing() -> None:
    assert owner_meant(ALICE, None, "act on another identity's job") == "alice"
    with pytest.raises(Refused) as refused:
        owner_meant(ALICE, "bob", "act on another identity's job")
    assert refused.value.message.startswith("only an operator token may act on another identity's job;")
    assert listed_owner(_listing(ALICE, b""), "jobs") == "alice"
    assert listed_owner(_listing(OPS, b"owner=alice"), "jobs") == "alice"
    assert listed_owner(_listing(OPS, b"owner=*"), "jobs") is None  # every one's
    for identity, query, code in ((ALICE, b"owner=*", ErrorCode.FORBIDDEN), (ALICE, b"owner=bob", ErrorCode.FORBIDDEN),
                                  (OPS, b"owner=a%2Fb", ErrorCode.BAD_REQUEST)):  # a list's owner is checked too
        with pytest.raises(Refused) as refused:
            listed_owner(_listing(identity, query), "sessions")
        assert refused.value.code == code, (identity, query)


@pytest.mark.parametrize("name", ["", "a/b", "../etc", "x" * 129, "-lead", "sp ace", "ümlaut", "main\n"])
def test_a_bad_name_is_refused_for_everyone(name: str) -> None:
    for identity in (ALICE, OPS):
        with pytest.raises(Refused) as refused:
            qualify(identity, name)
        assert refused.value.code == ErrorCode.BAD_REQUEST


def test_what_a_client_is_shown() -> None:
    assert (owner_in("alice/main"), name_in("alice/main")) == ("alice", "main")
    assert shown_to(ALICE, "alice/main") == "main"
    assert shown_to(OPS, "alice/main") == "alice/main"
    assert path_of(ALICE, "alice/main", "/events") == "/v1/sessions/main/events"
    assert path_of(OPS, "alice/main", "/events") == "/v1/sessions/main/events?owner=alice"


@pytest.mark.parametrize(("code", "status"), [(ErrorCode.UNAUTHENTICATED, 401), (ErrorCode.FORBIDDEN, 403),
                                              (ErrorCode.NOT_FOUND, 404), (ErrorCode.CONFLICT, 409),
                                              (ErrorCode.RATE_LIMITED, 429), (ErrorCode.SERVICE_UNAVAILABLE, 503),
                                              (ErrorCode.BAD_REQUEST, 400), (ErrorCode.INVALID_ARGUMENTS, 400)])
def test_a_refusal_is_one_http_answer_decided_by_its_code(code: ErrorCode, status: int) -> None:
    response = refusal_response(Refused(code, "why, and what to do", retry_after=0 if status == 429 else None))
    body = json.loads(bytes(response.body))
    assert response.status_code == status and body["error"]["code"] == code.value
    assert body["error"]["message"] == "why, and what to do"
    assert ("Retry-After" in response.headers) == (status == 429)  # a wait of 0 is said as 1 s
    assert response.headers.get("Retry-After", "1") == "1"
    assert ("WWW-Authenticate" in response.headers) == (status == 401)
