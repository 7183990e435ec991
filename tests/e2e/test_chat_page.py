"""The chat page in a real headless Chromium (the system's package), against real pincer processes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import OWNER_TOKEN, ROOT, Processes, gateway_client
from tests.e2e.conftest import sign_in_link, signed_in
from tests.scripted_llm import ScriptedLLM

pytestmark = pytest.mark.e2e

@pytest.fixture
def page_stack(asking_stack: dict[str, str], ws: Path) -> dict[str, str]:
    (ws / "notes.txt").write_text("the page can read this\n")
    return asking_stack


def shoot(page, name: str, tmp_path: Path) -> Path:
    """A screenshot of the page as the test left it; ``PINCER_SCREENSHOTS=1`` writes the README's copies."""
    folder = ROOT / "docs" / "screenshots" if os.environ.get("PINCER_SCREENSHOTS") == "1" else tmp_path
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.png"
    page.screenshot(path=str(path))
    assert path.stat().st_size > 5_000  # a page, not a blank
    return path


def requests_elsewhere(page) -> list[str]:  # type: ignore[no-untyped-def]
    """Every request the page makes to another origin than the Gateway's (filled as it happens)."""
    elsewhere: list[str] = []
    page.on("request", lambda request: None if request.url.startswith(("http://127.0.0.1", "ws://127.0.0.1", "data:"))
            else elsewhere.append(request.url))
    return elsewhere


def echoed(page, text: str):  # type: ignore[no-untyped-def]
    """Send ``text`` (the scripted model echoes it) and return the reply's element."""
    page.locator("#text").fill(text)
    page.locator("#send").click()
    return page.locator(".msg.assistant").last


def test_sign_in_chat_tools_approval_stop_and_reload(page_stack: dict, browser, tmp_path: Path) -> None:
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
    again = browser.new_context().new_page()
    again.goto(link)  # a link works once
    expect(again.locator("#login-status")).to_contain_text("used already")
    assert "code" not in again.url  # the page takes the code out of the address at once
    again.context.close()

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
    shoot(page, "approval", tmp_path)
    approval.get_by_role("button", name="Allow once").click()
    expect(page.locator("details.tool").filter(has_text="exec").last).to_contain_text("sandbox")

    exec_card = page.locator("details.tool").filter(has_text="exec").last
    exec_card.locator("summary").click()
    shoot(page, "chat", tmp_path)
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
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    elsewhere = requests_elsewhere(page)
    page.goto(sign_in_link(page_stack))
    expect(page.locator("#app")).to_be_visible()
    hostile = ('<img src=x onerror="alert(1);window.pwned=1"> <script>alert(2);window.pwned=2</script> '
               '[click](javascript:alert(3)) <a href="javascript:window.pwned=4" onclick="window.pwned=5">a</a> '
               '<img src="http://evil.example/beacon.png"> <iframe src="http://evil.example/"></iframe> '
               '<svg onload="window.pwned=6"><circle r="1"/></svg> <style>body{display:none}</style> '
               '<form action="http://evil.example/"><button>win</button></form>'
               '\n\n```\ncode block\n```')
    reply = echoed(page, hostile)
    expect(reply.locator("pre")).to_contain_text("code block")  # markdown rendered (the model echoes it)
    expect(reply.locator("button.copy")).to_be_visible()
    for link in reply.locator("a").all():
        link.click()
    html = reply.inner_html()
    assert page.evaluate("window.pwned") is None and dialogs == []
    assert not re.search(r"onerror|onload|onclick|<script|<iframe|<style|<form", html), html
    assert not re.search(r'href="\s*javascript:', html), html
    assert elsewhere == [], elsewhere  # no beacon, no frame: nothing left for another origin
    assert page.locator("body").is_visible()
    context.close()


def test_a_reload_mid_turn_picks_up_the_rest(page_stack: dict, browser) -> None:
    from playwright.sync_api import expect

    context, page = signed_in(browser, page_stack)
    page.locator("#text").fill("SLEEP 3")
    page.locator("#send").click()
    expect(page.locator("#stop")).to_be_enabled()  # the turn runs
    page.reload()
    expect(page.locator(".msg.assistant").last).to_contain_text("slept 3s", timeout=20_000)
    context.close()


def test_another_token_sees_none_of_the_owners_sessions(page_stack: dict, browser, processes: Processes) -> None:
    from playwright.sync_api import expect

    owner, page = signed_in(browser, page_stack)
    page.locator("#text").fill("owner's secret plan")
    page.locator("#send").click()
    expect(page.locator(".msg.assistant").last).to_contain_text("echo: owner's secret plan")
    session = page.evaluate("decodeURIComponent(location.hash.slice(1))")
    owner.close()

    made = processes.run("token", "create", "guest")
    assert made.returncode == 0, made.stderr
    guest = browser.new_context()
    page = guest.new_page()
    page.goto(f"http://127.0.0.1:{page_stack['PINCER_GATEWAY_PORT']}/#{session}")
    page.locator("#token").fill(made.stdout.strip())
    page.locator("#signin button").click()
    expect(page.locator("#whoami")).to_have_text("guest")
    expect(page.locator("#sessions button", has_text=session)).to_have_count(0)
    expect(page.locator("#transcript")).not_to_contain_text("secret plan")
    guest.close()


def test_small_screen_and_keyboard_only(page_stack: dict, browser, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    context, page = signed_in(browser, page_stack, viewport={"width": 390, "height": 844}, is_mobile=True,
                              has_touch=True)
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    page.locator("#text").focus()
    page.keyboard.type("typed only")
    page.keyboard.press("Enter")
    expect(page.locator(".msg.assistant").last).to_contain_text("echo: typed only")
    expect(page.get_by_role("button", name="Fork from here")).to_have_count(1)
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")  # the fork action fits too
    shoot(page, "phone", tmp_path)
    reached = set()
    for _ in range(30):  # every control is reachable with Tab (round the page and back)
        page.keyboard.press("Tab")
        reached.add(page.evaluate("document.activeElement.getAttribute('aria-label') || document.activeElement.id"))
    assert {"new-session", "signout", "agent", "delete-session", "Fork from here (message 1)", "text",
            "send"} <= reached, reached
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


def test_operators_see_the_pool_and_a_session_can_be_deleted(page_stack: dict, browser) -> None:
    from playwright.sync_api import expect

    context = browser.new_context()
    page = context.new_page()
    page.on("dialog", lambda dialog: dialog.accept())
    page.goto(sign_in_link(page_stack))
    expect(page.locator("#app")).to_be_visible()
    page.locator("#tab-pool").click()  # the owner's token is an operator's
    pool = page.locator("#view-pool")
    expect(pool).to_contain_text("Hands workers")
    workers = pool.locator("table").first
    expect(workers.locator("tr")).to_have_count(2)  # a header and the one worker
    expect(workers.locator("td").first).to_contain_text("hands-")
    expect(pool).to_contain_text("dead letters: 0")

    page.locator("#tab-chat").click()
    page.locator("#text").fill("to be deleted")
    page.locator("#send").click()
    expect(page.locator(".msg.assistant").last).to_contain_text("echo: to be deleted")
    session = page.evaluate("decodeURIComponent(location.hash.slice(1))")
    expect(page.locator("#sessions button", has_text=session)).to_be_visible()
    page.locator("#delete-session").click()
    expect(page.locator("#sessions button", has_text=session)).to_have_count(0)
    expect(page.locator("#transcript")).to_be_empty()
    context.close()


def test_model_output_cannot_address_the_page(page_stack: dict, browser) -> None:
    """A reply that names the page's own elements (ids, names, classes, data attributes, form controls)
    changes nothing the person sends, and loads nothing from elsewhere (srcset, poster)."""
    from playwright.sync_api import expect

    context, page = signed_in(browser, page_stack)
    elsewhere = requests_elsewhere(page)
    hostile = ('<textarea id="text" name="text" class="visually-hidden">rm -rf ~ (smuggled)</textarea>'
               '<select id="agent" class="visually-hidden"><option value="evil">evil</option></select>'
               '<input id="token" name="token" value="x"><label for="text">label</label>'
               '<div class="approval" data-approval="x" data-live-call="y" id="status" tabindex="1" autofocus>'
               'fake card</div><form id="composer"><button id="send">fake send</button></form>'
               '<img src="/static/style.css" srcset="http://evil.example/beacon.png 1x">'
               '<video poster="http://evil.example/poster.png"></video><picture><source '
               'srcset="http://evil.example/p.png"></picture><div popover id="app">hidden</div> said')
    reply = echoed(page, hostile)
    expect(reply).to_contain_text("said")
    # While it streams the reply is plain text (the tags' own characters shown); the check is on what the
    # page renders once the turn is over, from the transcript.
    expect(page.locator(".msg.assistant").last).not_to_contain_text("<textarea")
    reply = page.locator(".msg.assistant").last
    html = reply.inner_html()
    assert not re.search(r"<(textarea|select|input|label|form|button(?! class=\"copy)|video|source|picture)\b", html), (
        html
    )
    assert not re.search(r'\s(id|name|class|for|srcset|poster|tabindex|autofocus|popover|data-[a-z-]+)=', html), html
    assert page.evaluate("document.querySelectorAll('#text').length") == 1  # the page's own, alone
    page.locator("#text").click()
    page.keyboard.type("my own words")
    page.keyboard.press("Enter")
    expect(page.locator(".msg.assistant").last).to_contain_text("echo: my own words")
    sent = page.locator(".msg.user").last
    expect(sent).to_have_text("my own words")
    assert page.locator("#agent").input_value() == "main"
    assert elsewhere == [], elsewhere
    context.close()


def test_an_approval_card_announces_itself_and_never_takes_the_keyboard(page_stack: dict, browser) -> None:
    from playwright.sync_api import expect

    context, page = signed_in(browser, page_stack)
    page.locator("#text").fill('CALL exec {"command": "cat notes.txt"}')
    page.keyboard.press("Enter")
    approval = page.locator(".approval")
    expect(approval).to_contain_text("cat notes.txt")
    expect(page.locator("#status")).to_contain_text("waits for your approval")  # a role=status region says it
    assert page.evaluate("document.activeElement.id") == "text"  # focus stayed in the message box
    page.keyboard.type("typed on")  # keys meant for the message box land there ...
    page.keyboard.press("Space")
    expect(page.locator("#text")).to_have_value("typed on ")
    expect(approval).to_be_visible()  # ... and answer nothing
    approval.get_by_role("button", name="Deny").click()
    expect(page.locator(".msg.assistant").last).to_contain_text("APPROVAL_DENIED")
    context.close()


ASK = ('CALL ask_user {"questions": [{"text": "Which colour?", "choices": ["red", "blue"]}, '
       '{"text": "Why \\u001b[31mthat?"}]}')


def test_ask_user_is_answered_on_the_page_and_the_model_reads_the_answers(page_stack: dict, browser,
                                                                          scripted_llm: ScriptedLLM) -> None:
    """A question card in the conversation: a choice is a button, a question without choices a text box; it
    never takes the keyboard; the answers reach the model's next request as the tool's result."""
    from playwright.sync_api import expect

    context, page = signed_in(browser, page_stack)
    page.locator("#text").fill(ASK)
    page.keyboard.press("Enter")
    card = page.locator(".question-card")
    expect(card).to_contain_text("Which colour?")
    expect(card).to_contain_text("Why \\x1b[31mthat?")  # the escape is shown, not obeyed
    expect(page.locator("#status")).to_contain_text("asks you")  # announced, not focused
    assert page.evaluate("document.activeElement.id") == "text"
    send = card.get_by_role("button", name="Send answers")
    expect(send).to_be_disabled()  # until every question has an answer
    card.get_by_role("button", name="blue").click()
    expect(send).to_be_disabled()
    card.get_by_role("textbox", name="Answer 2").fill("it is calm")
    send.click()
    reply = page.locator(".msg.assistant").last
    expect(reply).to_contain_text("RESULT ask_user")
    expect(reply).to_contain_text("it is calm")
    results = [m["content"] for body in scripted_llm.requests for m in body["messages"] if m.get("role") == "tool"]
    assert [json.loads(r) for r in results] == [{"answers": ["blue", "it is calm"], "by": "owner"}]
    context.close()


def test_pincer_open_hands_the_code_to_the_browser_off_the_command_line(page_stack: dict, browser,
                                                                         tmp_path: Path) -> None:
    """What a local user sees of `pincer open`: the browser's command line holds a file's name, never the code;
    the file is its user's alone; following it signs in once."""
    from playwright.sync_api import expect

    seen = tmp_path / "browser-argv.txt"
    fake = tmp_path / "fake-browser"
    fake.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {seen}\n")
    fake.chmod(0o755)
    data = tmp_path / "data"
    env = {**page_stack, "PINCER_TOKEN": OWNER_TOKEN, "BROWSER": str(fake), "PINCER_DATA_DIR": str(data)}
    opened = subprocess.run([sys.executable, "-m", "gateway", "open"], env=env, capture_output=True, text=True,
                            timeout=60)
    assert opened.returncode == 0, opened.stderr
    argv = seen.read_text().split()
    assert len(argv) == 1 and argv[0].startswith("file://"), argv
    forwarder = Path(argv[0].removeprefix("file://"))
    assert forwarder.stat().st_mode & 0o777 == 0o600 and forwarder.parent.stat().st_mode & 0o777 == 0o700
    code = re.search(r"#code=([A-Za-z0-9_-]+)", forwarder.read_text()).group(1)  # type: ignore[union-attr]
    assert code not in opened.stdout + opened.stderr + " ".join(argv)
    query = browser.new_context()  # the code is never taken from a query (logs, history, referrers)
    asked = query.new_page()
    asked.goto(f"http://127.0.0.1:{page_stack['PINCER_GATEWAY_PORT']}/login?code={code}")
    expect(asked.locator("#login-status")).to_contain_text("has no code")
    assert not [c for c in query.cookies() if c["name"] == "pincer_session"]
    query.close()
    context = browser.new_context()
    page = context.new_page()
    page.goto(forwarder.as_uri())
    expect(page.locator("#app")).to_be_visible()
    expect(page.locator("#whoami")).to_have_text("owner")
    context.close()


def test_a_sub_agents_calls_are_cards_inside_its_delegate_card(page_stack: dict, browser, tmp_path: Path) -> None:
    """The sub-agent's exec asks the person (its approval reaches the page through its parent) and shows as a
    card nested in the delegate card; the finished delegate card opens the sub-agent's session."""
    from playwright.sync_api import expect

    context, page = signed_in(browser, page_stack)
    task = 'CALL exec {"command": "cat notes.txt"}'
    page.locator("#text").fill("CALL delegate " + json.dumps({"task": task}))
    page.keyboard.press("Enter")
    approval = page.locator(".approval")
    expect(approval).to_contain_text("cat notes.txt")
    delegate = page.locator("details.tool").filter(has_text="delegate").first
    expect(delegate.locator(".children details.tool")).to_contain_text("exec")  # nested, live
    shoot(page, "delegation", tmp_path)
    approval.get_by_role("button", name="Allow once").click()
    expect(page.locator(".msg.assistant").last).to_contain_text("the page can read this")
    finished = page.locator("details.tool:has(button.sub-session)")  # the card as the transcript has it
    expect(finished).to_have_count(1)
    finished.locator(":scope > summary").click()
    finished.get_by_role("button", name="Open the sub-agent's session").click()
    expect(page.locator(".msg.user").first).to_have_text(task)  # the sub-agent's own conversation
    expect(page.locator("details.tool").filter(has_text="exec").last).to_contain_text("sandbox")
    context.close()


def test_fork_from_here_opens_the_first_exchange_and_asks_no_model(page_stack: dict, browser,
                                                                    scripted_llm: ScriptedLLM) -> None:
    """Each of the person's messages forks from the keyboard: the fork opens with messages 1..N and their
    answers (no model asked for them), takes the next message, and a name in use takes the next suffix."""
    from playwright.sync_api import expect

    context, page = signed_in(browser, page_stack)
    expect(echoed(page, "first words")).to_contain_text("echo: first words")
    expect(echoed(page, "second words")).to_contain_text("echo: second words")
    source = page.evaluate("decodeURIComponent(location.hash.slice(1))")
    forks = page.get_by_role("button", name="Fork from here")
    expect(forks).to_have_count(2)  # the transcript is shown again once the turn ends
    asked = len(scripted_llm.requests)

    page.get_by_role("button", name="Fork from here (message 1)").focus()
    page.keyboard.press("Enter")
    fork = f"{source}-fork-1"
    expect(page.locator("#session-name")).to_have_text(fork)
    expect(page.locator("#session-title")).to_have_text("first words (from message 1)")  # titled from its source
    listed = page.locator("#sessions")
    expect(listed.get_by_role("button", name=f"first words (from message 1) {fork}", exact=True)).to_be_visible()
    expect(page.locator(".msg.user")).to_have_text(["first words"])
    expect(page.locator(".msg.assistant")).to_have_text(["echo: first words"])
    assert len(scripted_llm.requests) == asked  # the copied exchange was asked of no model
    assert page.evaluate("document.activeElement.id") == "text"

    page.keyboard.type("words in the fork")
    page.keyboard.press("Enter")
    expect(page.locator(".msg.assistant").last).to_contain_text("echo: words in the fork")
    assert len(scripted_llm.requests) == asked + 1
    sent = [m["content"] for m in scripted_llm.requests[-1]["messages"] if m["role"] != "system"]
    assert sent == ["first words", "echo: first words", "words in the fork"]
    with gateway_client(page_stack) as client:
        said = {name: [e["content"] for e in client.get(f"/v1/sessions/{name}").json()["entries"]
                       if e["role"] == "user"] for name in (source, fork)}
    assert said == {source: ["first words", "second words"], fork: ["first words", "words in the fork"]}

    listed.get_by_role("button", name=f"first words {source}", exact=True).click()
    expect(page.locator(".msg.user")).to_have_text(["first words", "second words"])
    page.get_by_role("button", name="Fork from here (message 1)").click()  # its first name is taken now
    expect(page.locator("#session-name")).to_have_text(f"{fork}-2")
    expect(page.locator(".msg.user")).to_have_text(["first words"])
    assert len(scripted_llm.requests) == asked + 1

    listed.get_by_role("button", name=f"first words {source}", exact=True).click()
    expect(page.locator(".msg.user")).to_have_count(2)
    with gateway_client(page_stack) as client:
        assert client.delete(f"/v1/sessions/{source}").status_code == 200
    page.get_by_role("button", name="Fork from here (message 2)").click()
    expect(page.locator("#status")).to_contain_text(f"no session '{source}'")  # as the page shows other errors
    expect(page.locator("#status")).to_have_class(re.compile(r"\berror\b"))
    expect(page.locator("#session-name")).to_have_text(source)
    context.close()


HOSTILE = '<img src=x onerror="window.pwned=1"><b id="text">bold</b>'


def test_sessions_console_titles_spend_search_rename_delete(page_stack: dict, browser, tmp_path: Path) -> None:
    """The console's sessions: titled by their first message with their spend, narrowed by a search, renamed
    and deleted through the API the CLI calls; a hostile title is shown as its characters."""
    from playwright.sync_api import expect

    with gateway_client(page_stack) as client:
        for name, text in (("trip", "plan the trip to Lisbon"), ("shop", "groceries for the week"),
                           ("odd", HOSTILE)):
            assert client.post(f"/v1/sessions/{name}/messages", json={"text": text}).status_code == 200
        spend = {d["id"]: d["spend_usd"] for d in client.get("/v1/sessions").json()["details"]}
    context, page = signed_in(browser, page_stack)
    page.on("dialog", lambda dialog: dialog.accept())
    page.locator("#tab-sessions").click()
    rows = page.locator("#session-rows > li")
    expect(rows).to_have_count(3)
    trip = rows.filter(has_text="plan the trip to Lisbon")
    expect(trip.locator(".sid")).to_have_text("trip")  # the title first, its name beneath
    expect(trip).to_contain_text(f"${spend['trip']:.2f}" if not 0 < spend["trip"] < 0.01 else f"${spend['trip']:.4f}")
    expect(trip).to_contain_text("1 message ·")  # the person's messages
    expect(rows.filter(has_text="odd").locator(".title")).to_have_text(HOSTILE)  # text, not markup
    assert page.evaluate("window.pwned") is None
    assert page.evaluate("document.querySelectorAll('#text').length") == 1
    expect(page.locator("#sessions")).to_contain_text("groceries for the week")  # the chat's list has titles too

    shoot(page, "console-sessions", tmp_path)
    page.locator("#session-search").fill("lisbon")
    expect(rows).to_have_count(1)
    expect(rows.first.locator(".title")).to_have_text("plan the trip to Lisbon")
    page.locator("#session-search").fill("")
    expect(rows).to_have_count(3)

    trip.get_by_role("button", name="Rename").click()
    box = page.get_by_role("textbox", name="New title")
    assert page.evaluate("document.activeElement.getAttribute('aria-label')") == "New title"  # their own click
    box.fill("Lisbon in May")
    box.press("Enter")
    renamed = rows.filter(has_text="Lisbon in May")
    expect(renamed.locator(".sid")).to_have_text("trip")
    assert page.evaluate("document.activeElement.textContent") == "Rename"  # the keyboard back where it was
    with gateway_client(page_stack) as client:
        titles = {d["id"]: d["title"] for d in client.get("/v1/sessions").json()["details"]}
    assert titles["trip"] == "Lisbon in May"
    expect(page.locator("#sessions")).to_contain_text("Lisbon in May")

    rows.filter(has_text="groceries for the week").get_by_role("button", name="Delete").click()
    expect(rows).to_have_count(2)
    with gateway_client(page_stack) as client:
        assert "shop" not in client.get("/v1/sessions").json()["sessions"]
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    context.close()


def test_jobs_console_create_pause_resume_run_and_runs(page_stack: dict, browser, tmp_path: Path) -> None:
    """A job made on the page is the API's; pause, resume and run now act on it, and its runs show how each
    went. On a phone's width nothing scrolls sideways."""
    from playwright.sync_api import expect

    context, page = signed_in(browser, page_stack, viewport={"width": 390, "height": 844}, is_mobile=True,
                              has_touch=True)
    page.locator("#tab-jobs").click()
    page.locator("#job-name").fill("morning")
    page.locator("#job-message").fill(HOSTILE)
    page.locator("#job-kind").select_option("every")
    page.locator("#job-when").fill("1h")
    page.locator("#job-create").click()
    job = page.locator("#job-rows > li").filter(has_text="morning")
    expect(job).to_contain_text("every 3600s")
    expect(job.locator(".message")).to_have_text(HOSTILE)
    assert page.evaluate("window.pwned") is None

    def paused() -> bool:
        with gateway_client(page_stack) as client:
            return bool(client.get("/v1/cron/morning").json()["paused"])

    assert not paused()
    job.get_by_role("button", name="Pause").click()
    expect(job.locator(".state")).to_have_text("paused")
    assert page.evaluate("document.activeElement.textContent") == "Resume"  # the row changed in place
    assert paused()
    job.get_by_role("button", name="Resume").click()
    expect(job.locator(".state")).to_have_text("active")
    assert not paused()

    job.get_by_role("button", name="Run now").click()
    run = job.locator(".runs > li")
    expect(run).to_have_count(1)
    expect(run).to_contain_text("fired")
    expect(run).to_contain_text("run by hand")
    with gateway_client(page_stack) as client:
        runs = client.get("/v1/cron/morning/runs").json()["runs"]
    assert [(r["status"], r["reason"]) for r in runs] == [("fired", "run by hand")]
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    shoot(page, "console-jobs-phone", tmp_path)

    page.locator("#job-name").fill("morning")  # a name in use: the API's refusal, in the status line
    page.locator("#job-message").fill("again")
    page.locator("#job-create").click()
    expect(page.locator("#status")).to_have_class(re.compile(r"\berror\b"))
    expect(page.locator("#status")).to_contain_text("morning")
    context.close()


def test_memory_console_lists_searches_and_deletes_notes(page_stack: dict, browser, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    with gateway_client(page_stack) as client:
        for key, content in (("gift", "a red scarf for Bob"), ("plants", HOSTILE)):
            write = "CALL memory_write " + json.dumps({"key": key, "content": content})
            assert client.post("/v1/sessions/notes/messages", json={"text": write}).status_code == 200
    context, page = signed_in(browser, page_stack, viewport={"width": 390, "height": 844}, is_mobile=True,
                              has_touch=True)
    page.on("dialog", lambda dialog: dialog.accept())
    page.locator("#tab-memory").click()
    notes = page.locator("#note-rows > li")
    expect(notes).to_have_count(2)
    expect(notes.filter(has_text="plants").locator(".message")).to_have_text(HOSTILE)
    assert page.evaluate("window.pwned") is None
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    shoot(page, "console-memory-phone", tmp_path)
    page.locator("#memory-search").fill("scarf")
    expect(notes).to_have_count(1)
    expect(notes.first.locator(".title")).to_have_text("gift")
    notes.first.get_by_role("button", name="Delete").click()
    expect(notes).to_have_text(["No note matches."])
    with gateway_client(page_stack) as client:
        assert [n["key"] for n in client.get("/v1/memory").json()["notes"]] == ["plants"]
    context.close()
