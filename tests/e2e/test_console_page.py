"""The console's spend, channels, tokens, hooks and memory views in a real headless Chromium, against real
pincer processes: what an operator sees and does, what a chat token sees (its own, no operator tabs), and
outside text (a stranger's handle, a hook's message, a note) drawn inert.

``PINCER_SCREENSHOTS=1`` writes each view at a desktop width (1280) and a phone's (390) to docs/console/.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from brain.config import BrainSettings
from brain.spend import Governor
from bus.metrics import Meter
from bus.presence import Presence
from bus.settings import RedisSettings
from bus.streams import Bus
from gateway.channels.access import Access
from memory.longterm import SHARED, LongTermMemory
from memory.sessions import SessionStore, TranscriptEntry
from tests.conftest import ROOT, Processes, gateway_client, wait_until
from tests.e2e.conftest import create_token, signed_in, start_stack

pytestmark = pytest.mark.e2e

HOSTILE = '<img src=x onerror="window.pwned=1"><b id="text">bold</b>'
MODEL = "fake/priced"
PRICES = {MODEL: {"input_per_mtok": 1000.0, "output_per_mtok": 3000.0}}  # a prompt token costs $0.001
DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}


@pytest.fixture
def console_stack(processes: Processes, pincer_env: dict[str, str]) -> Iterator[dict[str, str]]:
    """A Gateway, a Brain (whose agents the pickers list) and a Hands worker, with budgets to spend against."""
    processes.env = {**pincer_env, "PINCER_BRAIN__BUDGET__DAILY_USD": "1", "PINCER_BRAIN__BUDGET__MONTHLY_USD": "20",
                     "PINCER_BRAIN__BUDGET__IDENTITIES": json.dumps({"alice": {"daily_usd": 0.05}}),
                     "PINCER_BRAIN__BUDGET__ALERTS": "[0.8]"}
    start_stack(processes, hands=1)
    yield processes.env


def seeded(env: dict[str, str], work: Any) -> None:
    """Run ``work(bus)`` on the stack's own Redis, as another process of the pool would write (in a thread of
    its own: Playwright's loop runs in this one)."""
    async def run() -> None:
        bus = Bus.from_settings(RedisSettings(prefix=env["PINCER_REDIS__PREFIX"]), env["PINCER_REDIS_URL"])
        try:
            await work(bus)
        finally:
            await bus.close()
    with ThreadPoolExecutor(1) as thread:
        thread.submit(asyncio.run, run()).result(timeout=60)


async def spent(bus: Bus) -> None:
    """A month of model calls for alice and bob, settled by the Brain's own governor (alice's today: an alert)."""
    budget = {"daily_usd": 1, "monthly_usd": 20, "identities": {"alice": {"daily_usd": 0.05}}, "alerts": [0.8]}
    for days_ago in range(0, 30, 3):
        governor = Governor(bus, BrainSettings(model=MODEL, prices=PRICES, budget=budget), Meter(),
                            clock=lambda back=days_ago: time.time() - back * 86_400)
        await governor.settle(None, "main", "alice", MODEL, {"prompt_tokens": 50 if days_ago == 0 else 20 + days_ago,
                                                             "completion_tokens": 0})
        await governor.settle(None, "main", "bob", MODEL, {"prompt_tokens": 60 - days_ago, "completion_tokens": 0})


async def channel_and_stranger(bus: Bus) -> None:
    """Telegram's poller alive (a heartbeat good for half an hour) and a stranger, with a hostile handle, waiting."""
    heartbeat = {"channel": "telegram", "polling": 1, "last_progress": time.time(), "stall_s": 90,
                 "username": "pincer_bot", "in": 12, "out": 9, "errors": 1, "last_error": f"getUpdates: {HOSTILE}"}
    await Presence(bus, "channel", "channel-tg-1", interval_s=600, details=lambda: heartbeat).beat()
    await Access(bus, "telegram", allow_from=[], agent="main", pairing_ttl_s=600).code_for("42", HOSTILE)


async def notes(bus: Bus) -> None:
    memory = LongTermMemory(bus.redis, bus.keys)
    await memory.write("main", "gift", "a red scarf for Bob's birthday", owner="owner")
    await memory.write("main", "plants", HOSTILE, owner="owner")
    await memory.write("main", "house-rules", "no wet scarf indoors\nshoes off", owner=SHARED)
    await memory.write("main", "diary", "alice's own scarf, blue", owner="alice")


def shoot(page: Any, name: str, tmp_path: Path) -> None:
    """The view as the test left it; with ``PINCER_SCREENSHOTS=1`` into docs/console/ (the docs' copies)."""
    folder = ROOT / "docs" / "console" if os.environ.get("PINCER_SCREENSHOTS") == "1" else tmp_path
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"{name}.png"
    page.screenshot(path=str(target), full_page=True)
    assert target.stat().st_size > 5_000  # a page, not a blank


def both_widths(page: Any, name: str, tmp_path: Path) -> None:
    """The view at a desktop's width and a phone's: on the phone nothing is wider than the screen."""
    shoot(page, f"{name}-desktop", tmp_path)
    page.set_viewport_size(PHONE)
    page.wait_for_function("document.documentElement.scrollWidth <= window.innerWidth")
    shoot(page, f"{name}-phone", tmp_path)
    page.set_viewport_size(DESKTOP)


def paste_in(browser: Any, env: dict[str, str], token: str) -> Any:
    """A new context signed in with a pasted token."""
    from playwright.sync_api import expect

    context = browser.new_context(viewport=DESKTOP)
    page = context.new_page()
    page.goto(f"http://127.0.0.1:{env['PINCER_GATEWAY_PORT']}/")
    page.locator("#token").fill(token)
    page.locator("#signin button").click()
    expect(page.locator("#app")).to_be_visible()
    return context, page


def test_an_operator_sees_the_pools_spend_chart_and_alerts(console_stack: dict, browser, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    seeded(console_stack, spent)
    context, page = signed_in(browser, console_stack, viewport=DESKTOP)
    errors: list[str] = []  # Chromium reports what the page's CSP stopped (an inline style, a script) here
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    for tab in ("channels", "tokens", "hooks", "pool"):
        expect(page.locator(f"#tab-{tab}")).to_be_visible()
    page.locator("#tab-spend").click()
    expect(page.locator("#spend-scope")).to_contain_text("The pool's spend")
    rows = page.locator("#spend-table tr")
    expect(rows.filter(has_text="the pool")).to_contain_text("of $1.00")
    expect(rows.filter(has_text="the pool")).to_contain_text("of $20.00")
    expect(rows.filter(has_text="identity alice")).to_contain_text("$0.05 of $0.05")
    expect(rows.filter(has_text="identity bob")).to_contain_text("$0.06 (no limit)")
    expect(page.locator("#spend-chart canvas")).to_have_count(1)
    expect(page.locator("#spend-chart .u-legend")).to_contain_text("identity bob")
    expect(page.locator("#spend-alerts")).to_contain_text("alice")
    both_widths(page, "spend", tmp_path)
    assert errors == []  # the chart drew within the policy: nothing refused
    context.close()


def test_a_chat_token_sees_only_its_own_spend_and_no_operator_tab(console_stack: dict, browser, processes: Processes,
                                                                  tmp_path: Path) -> None:
    from playwright.sync_api import expect

    seeded(console_stack, spent)
    context, page = paste_in(browser, console_stack, create_token(processes, "alice"))
    expect(page.locator("#whoami")).to_have_text("alice")
    for tab in ("channels", "tokens", "hooks", "pool"):
        expect(page.locator(f"#tab-{tab}")).to_be_hidden()
    page.locator("#tab-spend").click()
    expect(page.locator("#spend-scope")).to_contain_text("Your own spend (identity alice)")
    expect(page.locator("#spend-table tr")).to_have_count(2)  # the head, and alice's line
    expect(page.locator("#spend-table")).to_contain_text("$0.05 of $0.05")
    expect(page.locator("#spend-chart .u-legend")).to_contain_text("identity alice")
    expect(page.locator("#view-spend")).not_to_contain_text("bob")
    expect(page.locator("#view-spend")).not_to_contain_text("the pool")
    # The tabs are hidden; the API is the wall: the page's own credentials are refused the operator's calls.
    assert page.evaluate("fetch('/v1/tokens').then((r) => r.status)") == 403
    both_widths(page, "spend-own", tmp_path)
    context.close()


def test_channels_show_state_and_a_hostile_stranger_is_paired_and_unpaired_inert(console_stack: dict, browser,
                                                                                  tmp_path: Path) -> None:
    from playwright.sync_api import expect

    seeded(console_stack, channel_and_stranger)
    context, page = signed_in(browser, console_stack, viewport=DESKTOP)
    page.on("dialog", lambda dialog: dialog.accept())
    page.locator("#tab-channels").click()
    telegram = page.locator("#channel-table tr").filter(has_text="telegram")
    expect(telegram).to_contain_text("connected")
    expect(telegram).to_contain_text("pincer_bot")
    expect(telegram).to_contain_text("s ago")
    expect(telegram).to_contain_text(f"getUpdates: {HOSTILE}")  # the text itself, never markup
    waiting = page.locator("#pairing-rows > li")
    expect(waiting).to_have_count(1)
    expect(waiting.first.locator(".main")).to_have_text(f"telegram user 42 @{HOSTILE}")
    assert page.evaluate("window.pwned") is None
    expect(page.locator("#view-channels img")).to_have_count(0)
    both_widths(page, "channels", tmp_path)

    waiting.first.get_by_role("button", name="Approve").click()
    expect(page.locator("#status")).to_have_text("telegram user 42 is paired.")
    expect(waiting).to_have_text(["Nobody is waiting."])
    paired = page.locator("#paired-rows > li")
    expect(paired.first.locator(".title")).to_have_text("telegram:42")
    with gateway_client(console_stack) as client:
        assert [p["user"] for p in client.get("/v1/channels/paired").json()["paired"]] == ["42"]
    paired.first.get_by_role("button", name="Unpair").click()
    expect(paired).to_have_text(["Nobody was let in by pairing."])
    with gateway_client(console_stack) as client:
        assert client.get("/v1/channels/paired").json()["paired"] == []
    context.close()


def test_a_token_made_on_the_page_shows_its_secret_once_works_and_is_revoked(console_stack: dict, browser,
                                                                             tmp_path: Path) -> None:
    from playwright.sync_api import expect

    context, page = signed_in(browser, console_stack, viewport=DESKTOP)
    page.on("dialog", lambda dialog: dialog.accept())
    page.locator("#tab-tokens").click()
    expect(page.locator("#token-rows")).to_contain_text("the configured token")
    page.locator("#token-name").fill("carol")
    page.locator("#token-agents").fill("main")
    page.locator("#token-create").click()
    secret_box = page.locator("#token-secret .secret-value")
    expect(secret_box).to_have_value(re.compile(r"^pcr_"))
    secret = secret_box.input_value()
    assert page.evaluate("document.activeElement.id") == "token-create"  # the answer did not take the keyboard
    carol = page.locator("#token-rows > li").filter(has_text="carol")
    expect(carol).to_contain_text("agents: main")
    with gateway_client(console_stack, token=secret) as client:
        assert client.get("/v1/me").json()["name"] == "carol"  # the secret shown is the token
    both_widths(page, "tokens", tmp_path)

    page.locator("#tab-chat").click()
    page.locator("#tab-tokens").click()  # drawn again: the secret is gone, and no listing holds it
    expect(page.locator("#token-secret")).to_be_empty()
    assert secret not in page.content()
    with gateway_client(console_stack) as client:
        assert secret not in client.get("/v1/tokens").text

    carol.get_by_role("button", name="Revoke").click()
    expect(page.locator("#status")).to_have_text("Token carol is revoked.")
    expect(page.locator("#token-rows > li").filter(has_text="carol")).to_have_count(0)
    with gateway_client(console_stack, token=secret) as client:  # after the Gateway's short cache of it
        wait_until(lambda: client.get("/v1/me").status_code == 401, timeout=10, what="the revoked token refused")

    page.locator("#token-name").fill("owner")  # the API's refusal, in the status line
    page.locator("#token-create").click()
    expect(page.locator("#status")).to_have_class(re.compile(r"\berror\b"))
    context.close()


def test_a_hook_with_a_hostile_message_is_made_rotated_and_removed_inert(console_stack: dict, browser,
                                                                         tmp_path: Path) -> None:
    from playwright.sync_api import expect

    context, page = signed_in(browser, console_stack, viewport=DESKTOP)
    page.on("dialog", lambda dialog: dialog.accept())
    page.locator("#tab-hooks").click()
    expect(page.locator("#hook-rows")).to_have_text("No hooks yet.")
    page.locator("#hook-name").fill("ci")
    page.locator("#hook-template").fill(f"CI says {HOSTILE}: {{payload}}")
    page.locator("#hook-create").click()
    secret_box = page.locator("#hook-secret .secret-value")
    expect(secret_box).not_to_have_value("")
    first = secret_box.input_value()
    row = page.locator("#hook-rows > li").filter(has_text="ci")
    expect(row.locator(".message")).to_have_text(f"CI says {HOSTILE}: {{payload}}")
    expect(row).to_contain_text("POST /v1/hooks/ci")
    assert page.evaluate("window.pwned") is None
    expect(page.locator("#view-hooks img")).to_have_count(0)
    both_widths(page, "hooks", tmp_path)

    row.get_by_role("button", name="Rotate secret").click()
    expect(page.locator("#status")).to_have_text("Hook ci has a new secret.")
    expect(secret_box).not_to_have_value(first)
    expect(page.locator("#hook-secret")).to_contain_text("60 min")
    page.locator("#hook-secret").get_by_role("button", name="Done").click()
    expect(page.locator("#hook-secret")).to_be_empty()

    row.get_by_role("button", name="Remove").click()
    expect(page.locator("#hook-rows")).to_have_text("No hooks yet.")
    with gateway_client(console_stack) as client:
        assert client.get("/v1/admin/hooks").json() == {"hooks": []}
    context.close()


def test_memory_search_asks_the_api_and_recall_shows_what_the_agent_would_find(console_stack: dict, browser,
                                                                                processes: Processes,
                                                                                tmp_path: Path) -> None:
    from playwright.sync_api import expect

    seeded(console_stack, notes)
    context, page = signed_in(browser, console_stack, viewport=DESKTOP)
    page.locator("#tab-memory").click()
    rows = page.locator("#note-rows > li")
    expect(rows).to_have_count(3)  # the owner's two and the shared one; never alice's
    expect(rows.filter(has_text="plants").locator(".message")).to_have_text(HOSTILE)
    page.locator("#memory-search").fill("shoes")  # in the text, past the first line the list previews
    expect(rows).to_have_count(1)
    expect(rows.first.locator(".title")).to_have_text("house-rules")
    page.locator("#memory-search").fill("")
    expect(rows).to_have_count(3)

    page.locator("#recall-query").fill("which scarf for the birthday?")
    page.locator("#recall-ask").click()
    hits = page.locator("#recall-rows > li")
    expect(hits.first.locator(".title")).to_have_text("note gift (own)")
    expect(hits.first.locator(".message")).to_contain_text("scarf")
    expect(page.locator("#recall-rows")).not_to_contain_text("blue")  # alice's note is alice's
    assert page.evaluate("window.pwned") is None
    both_widths(page, "memory", tmp_path)
    context.close()

    context, page = paste_in(browser, console_stack, create_token(processes, "alice"))
    page.locator("#tab-memory").click()
    page.locator("#recall-query").fill("scarf")
    page.locator("#recall-ask").click()
    expect(page.locator("#recall-rows > li .title")).to_have_text(["note diary (own)", "note house-rules (shared)"])
    context.close()


def test_an_operator_sees_everyones_sessions_and_deletes_one_a_chat_token_sees_no_such_choice(
        console_stack: dict, browser, processes: Processes, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    carol = create_token(processes, "carol")

    async def conversation(bus: Bus) -> None:  # as a turn leaves it (the stack's budgets price no scripted turn)
        store = SessionStore(bus.redis, bus.keys)
        assert await store.claim_and_number("carol/plans", "carol") == 1
        await store.append("carol/plans", TranscriptEntry(role="user", content=HOSTILE),
                           TranscriptEntry(role="assistant", content="noted"))

    seeded(console_stack, conversation)
    context, page = signed_in(browser, console_stack)
    page.on("dialog", lambda dialog: dialog.accept())
    page.locator("#tab-sessions").click()
    expect(page.locator("#session-rows")).not_to_contain_text("carol/plans")  # its own, by default
    page.locator("#sessions-everyone").check()
    row = page.locator("#session-rows li", has_text="carol/plans")
    expect(row).to_contain_text(HOSTILE[:30])  # the title drawn as text
    assert page.evaluate("window.pwned") is None and page.locator("#session-rows b#text").count() == 0
    both_widths(page, "sessions", tmp_path)
    row.get_by_role("button", name="Delete").click()
    expect(row).to_have_count(0)
    with gateway_client(console_stack, carol) as client:
        wait_until(lambda: client.get("/v1/sessions").json()["sessions"] == [], timeout=10, what="carol's gone")
    context.close()
    context, page = paste_in(browser, console_stack, carol)
    page.locator("#tab-sessions").click()
    expect(page.locator("#sessions-everyone-label")).to_be_hidden()
    assert page.evaluate("fetch('/v1/sessions?owner=*').then((r) => r.status)") == 403
    context.close()


def test_the_jobs_and_pool_views_show_what_the_api_says(console_stack: dict, browser, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    with gateway_client(console_stack) as client:
        made = client.post("/v1/cron", json={"name": "standup", "cron": "0 9 * * 1-5", "message": HOSTILE})
        assert made.status_code == 201, made.text
    context, page = signed_in(browser, console_stack, viewport=DESKTOP)
    page.locator("#tab-jobs").click()
    row = page.locator("#job-rows li", has_text="standup")
    expect(row).to_contain_text(HOSTILE[:30])  # the job's message drawn as text
    assert page.evaluate("window.pwned") is None
    both_widths(page, "jobs", tmp_path)
    page.locator("#tab-pool").click()
    expect(page.locator("#view-pool")).to_contain_text("hands")
    both_widths(page, "pool", tmp_path)
    context.close()


def test_an_operator_sees_everyones_jobs_and_acts_on_one_a_chat_token_sees_no_such_choice(
        console_stack: dict, browser, processes: Processes, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    carol = create_token(processes, "carol")
    with gateway_client(console_stack, carol) as client:
        # New Year's morning: no scheduled fire comes between the test's own actions
        made = client.post("/v1/cron", json={"name": "carols-digest", "cron": "0 9 1 1 *", "message": HOSTILE})
        assert made.status_code == 201, made.text
    context, page = signed_in(browser, console_stack, viewport=DESKTOP)
    page.on("dialog", lambda dialog: dialog.accept())
    page.locator("#tab-jobs").click()
    expect(page.locator("#job-rows")).not_to_contain_text("carols-digest")  # its own, by default
    page.locator("#jobs-everyone").check()
    row = page.locator("#job-rows li", has_text="carols-digest")
    expect(row.locator(".facts").first).to_contain_text("carol · cron")  # whose job it is
    expect(row.locator(".message")).to_have_text(HOSTILE)  # drawn as text
    assert page.evaluate("window.pwned") is None and page.locator("#job-rows b#text").count() == 0
    both_widths(page, "jobs-everyone", tmp_path)

    row.get_by_role("button", name="Pause").click()
    expect(row.locator(".state")).to_have_text("paused")
    with gateway_client(console_stack, carol) as client:
        assert client.get("/v1/cron/carols-digest").json()["paused"] is True  # carol's own job, paused
    row.get_by_role("button", name="Run now").click()
    # fired (or failed by now: the stack prices no model), recorded in carol's job
    expect(row.locator(".runs li.run", has_text="run by hand")).to_have_count(1)
    with gateway_client(console_stack, carol) as client:
        assert [run["reason"] for run in client.get("/v1/cron/carols-digest/runs").json()["runs"]] == ["run by hand"]
    row.get_by_role("button", name="Remove").click()
    expect(row).to_have_count(0)
    with gateway_client(console_stack, carol) as client:
        assert client.get("/v1/cron").json()["jobs"] == []
    context.close()

    context, page = paste_in(browser, console_stack, carol)
    page.locator("#tab-jobs").click()
    expect(page.locator("#jobs-everyone-label")).to_be_hidden()
    assert page.evaluate("fetch('/v1/cron?owner=*').then((r) => r.status)") == 403
    context.close()


def test_an_operator_names_an_owner_to_see_recall_and_delete_its_notes_a_chat_token_cannot(
        console_stack: dict, browser, processes: Processes, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    seeded(console_stack, notes)
    alice = create_token(processes, "alice")
    context, page = signed_in(browser, console_stack, viewport=DESKTOP)
    page.on("dialog", lambda dialog: dialog.accept())
    page.locator("#tab-memory").click()
    rows = page.locator("#note-rows > li")
    expect(rows).to_have_count(3)  # the operator's own two and the shared one
    page.locator("#memory-owner").fill("alice")
    expect(rows.locator(".title")).to_have_text(["diary", "house-rules"])  # alice's and the shared one
    expect(rows.first.locator("small")).to_have_text("alice's")
    expect(rows.nth(1).locator("small")).to_have_text("shared")
    both_widths(page, "memory-owner", tmp_path)

    page.locator("#recall-query").fill("scarf")
    page.locator("#recall-ask").click()
    expect(page.locator("#recall-rows > li .title")).to_have_text(["note diary (own)", "note house-rules (shared)"])
    expect(page.locator("#recall-rows")).not_to_contain_text("Bob's birthday")  # the operator's own stay out

    rows.first.get_by_role("button", name="Delete").click()
    expect(rows.locator(".title")).to_have_text(["house-rules"])
    with gateway_client(console_stack, alice) as client:
        assert [n["key"] for n in client.get("/v1/memory").json()["notes"]] == ["house-rules"]
    context.close()

    context, page = paste_in(browser, console_stack, alice)
    page.locator("#tab-memory").click()
    expect(page.locator("#memory-owner-label")).to_be_hidden()
    assert page.evaluate("fetch('/v1/memory?owner=owner').then((r) => r.status)") == 403
    context.close()
