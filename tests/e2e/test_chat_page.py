"""The chat page in a real headless Chromium (the system's package), against real pincer processes."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import OWNER_TOKEN, Processes
from tests.e2e.conftest import start_stack

pytestmark = pytest.mark.e2e

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or "/usr/bin/chromium"
# As CI runs it (root, no display, a closed network): no sandbox of Chromium's own, nothing phoning home.
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]


@pytest.fixture
def page_stack(processes: Processes, pincer_env: dict[str, str]) -> Iterator[dict]:
    workspace = Path(tempfile.mkdtemp(prefix="pincer-e2e-page-"))
    workspace.chmod(0o755)
    (workspace / "notes.txt").write_text("the page can read this\n")
    processes.env = {**pincer_env, "PINCER_WORKSPACE": str(workspace), "PINCER_HANDS__EXEC__MODE": "ask",
                     "PINCER_HANDS__SANDBOX__ALLOW_DEGRADED": "true"}
    start_stack(processes, hands=1)
    yield processes.env
    shutil.rmtree(workspace, ignore_errors=True)


@pytest.fixture
def browser():
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail("Chromium is not installed: .ci/run installs it (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        yield launched
        launched.close()


def sign_in_link(env: dict) -> str:
    made = subprocess.run([sys.executable, "-m", "gateway", "open", "--print"], env={**env, "PINCER_TOKEN": OWNER_TOKEN},
                          capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    return made.stdout.strip().splitlines()[0]


def test_sign_in_chat_tools_approval_stop_and_reload(page_stack: dict, browser) -> None:
    from playwright.sync_api import expect

    context = browser.new_context()
    page = context.new_page()
    link = sign_in_link(page_stack)
    page.goto(link)
    expect(page.locator("#app")).to_be_visible()
    assert page.url.endswith("/") or "#" in page.url  # the code is gone from the address bar
    cookie = next(c for c in context.cookies() if c["name"] == "pincer_session")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert "pincer_session" not in page.evaluate("document.cookie")
    assert page.evaluate("Object.keys(localStorage).length") == 0
    assert page.goto(link).status == 400  # a link works once

    page.goto(link.split("/login")[0] + "/")
    page.locator("#text").fill("hello page")
    page.keyboard.press("Enter")
    expect(page.locator(".msg.assistant").last).to_contain_text("echo: hello page")

    page.locator("#text").fill('CALL read_file {"path": "notes.txt"}')
    page.locator("#send").click()
    card = page.locator("details.tool").filter(has_text="read_file").last
    expect(card).to_contain_text("ms")  # the full card, from the transcript, with its duration
    card.locator("summary").click()
    expect(card).to_contain_text("the page can read this")

    page.locator("#text").fill('CALL exec {"command": "cat notes.txt"}')
    page.locator("#send").click()
    approval = page.locator(".approval")
    expect(approval).to_contain_text("cat notes.txt")
    approval.get_by_role("button", name="Allow once").click()
    expect(page.locator("details.tool").filter(has_text="exec").last).to_contain_text("sandbox")

    page.locator("#text").fill("SLEEP 30")
    page.locator("#send").click()
    expect(page.locator("#stop")).to_be_enabled()
    page.locator("#stop").click()
    expect(page.locator("#status")).to_have_text("Stopped.")

    session = page.evaluate("decodeURIComponent(location.hash.slice(1))")
    page.reload()
    expect(page.locator(".msg.user").first).to_have_text("hello page")  # the transcript comes back
    expect(page.locator("#sessions button", has_text=session)).to_be_visible()
    context.close()


def test_model_output_cannot_run_script(page_stack: dict, browser) -> None:
    from playwright.sync_api import expect

    context = browser.new_context()
    page = context.new_page()
    page.goto(sign_in_link(page_stack))
    expect(page.locator("#app")).to_be_visible()
    hostile = ('<img src=x onerror="window.pwned=1"> <script>window.pwned=2</script> '
               '[click](javascript:window.pwned=3) <a href="javascript:window.pwned=4" onclick="window.pwned=5">a</a>'
               '\n\n```\ncode block\n```')
    page.locator("#text").fill(hostile)
    page.locator("#send").click()
    reply = page.locator(".msg.assistant").last
    expect(reply.locator("pre")).to_contain_text("code block")  # markdown rendered (the model echoes it)
    expect(reply.locator("button.copy")).to_be_visible()
    for link in reply.locator("a").all():
        link.click()
    html = reply.inner_html()
    assert page.evaluate("window.pwned") is None
    assert "onerror" not in html and "<script" not in html and not re.search(r'href="\s*javascript:', html)
    context.close()


def test_small_screen_and_keyboard_only(page_stack: dict, browser) -> None:
    from playwright.sync_api import expect

    context = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True)
    page = context.new_page()
    page.goto(sign_in_link(page_stack))
    expect(page.locator("#app")).to_be_visible()
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    page.locator("#text").focus()
    page.keyboard.type("typed only")
    page.keyboard.press("Enter")
    expect(page.locator(".msg.assistant").last).to_contain_text("echo: typed only")
    for _ in range(12):  # every control is reachable with Tab
        page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.tagName") in ("BUTTON", "SELECT", "TEXTAREA", "INPUT")
    context.close()


def test_a_pasted_token_signs_in_and_a_wrong_one_is_told(page_stack: dict, browser) -> None:
    from playwright.sync_api import expect

    context = browser.new_context()
    page = context.new_page()
    page.goto(f"http://127.0.0.1:{page_stack['PINCER_GATEWAY_PORT']}/")
    expect(page.locator("#signin")).to_be_visible()
    page.locator("#token").fill("pcr_wrong")
    page.locator("#signin button").click()
    expect(page.locator("#signin-error")).to_contain_text("not valid")
    page.locator("#token").fill(OWNER_TOKEN)
    page.locator("#signin button").click()
    expect(page.locator("#app")).to_be_visible()
    expect(page.locator("#whoami")).to_have_text("owner")
    context.close()
