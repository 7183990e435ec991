// The console beside the chat: a tab per view (sessions, jobs, memory, the pool; spend.js and operator.js add
// spend, channels, tokens and hooks), each drawn from the same HTTP API the CLI calls. Uses app.js's helpers
// (el, api, status, $, state). Every name, title, message and note is the server's or a model's text: it goes
// in as text, and no element is found by it afterwards (each row's buttons keep what they act on in their own
// handlers).
"use strict";

// A view is a tab and a section; `show` draws it each time its tab is chosen. Another view is one more entry
// here (or `VIEWS.name = ...` in a later script), one more tab and section in index.html. An operator's view
// has its tab shown to operators alone (the API refuses anyone else in any case).
const VIEWS = {
  chat: { show: () => {} },
  sessions: { show: () => showSessions() },
  jobs: { show: () => showJobs() },
  memory: { show: () => showNotes() },
  pool: { show: () => showPool(), operator: true },
};

// The tabs the signed-in identity may use (app.js calls this once /v1/me has answered).
function showTabs(operator) {
  for (const [name, view] of Object.entries(VIEWS)) if (view.operator) $(`tab-${name}`).hidden = !operator;
  // An operator may list (and tidy) every identity's sessions, jobs and notes.
  for (const choice of ["sessions-everyone", "jobs-everyone", "memory-owner"]) $(`${choice}-label`).hidden = !operator;
}

function showView(name) {
  for (const view of Object.keys(VIEWS)) {
    $(`view-${view}`).hidden = view !== name;
    if (view === name) $(`tab-${view}`).setAttribute("aria-current", "page");
    else $(`tab-${view}`).removeAttribute("aria-current");
  }
  Promise.resolve(VIEWS[name].show()).catch((error) => status(error.message, true));
}

const when = (seconds) => (seconds ? new Date(seconds * 1000).toLocaleString() : "—");
const dollars = (usd) => `$${usd > 0 && usd < 0.01 ? usd.toFixed(4) : usd.toFixed(2)}`;
const path = (...parts) => parts.map(encodeURIComponent).join("/");

// The agents the signed-in identity may use, for a view's picker (once, at its first showing).
function pickAgent(select) {
  if (!select.options.length) select.append(...state.me.agents.map((a) => el("option", { value: a }, a)));
}

// Answers can come back out of order (a search typed fast): only the newest asked is drawn.
function latest() {
  let asked = 0;
  return async (load, draw) => {
    const mine = ++asked;
    const data = await load();
    if (mine === asked) draw(data);
  };
}

// -- sessions ------------------------------------------------------------------------------------
const sessionsAsked = latest();

async function showSessions() {
  const query = $("session-search").value.trim();
  const everyone = state.me.operator && $("sessions-everyone").checked;
  const asked = new URLSearchParams();
  if (query) asked.set("q", query);
  if (everyone) asked.set("owner", "*");
  await sessionsAsked(() => api("GET", `/v1/sessions${asked.toString() ? `?${asked}` : ""}`),
    ({ details }) => $("session-rows").replaceChildren(...(details.length
      ? details.map((about) => (everyone ? othersRow(about) : sessionRow(about)))
      : [el("li", { class: "note" }, query ? "No session matches." : "No sessions yet.")])));
  if (!query) loadSessions().catch(() => {});  // the chat's list follows renames and deletions
}

// Another identity's session, as an operator sees it in "everyone's": who, what, its spend; delete. Its id is
// "owner/name", which the API takes as the name and ?owner= (the chat is its owner's own, so no Open).
function othersRow(about) {
  const [owner, ...rest] = about.id.split("/");
  const name = rest.join("/");
  const row = el("li", { class: "row" });
  const messages = `${about.messages} message${about.messages === 1 ? "" : "s"}`;
  row.append(
    el("div", { class: "main" }, el("span", { class: "title" }, about.title || name), " ",
      el("small", { class: "sid" }, about.id)),
    el("div", { class: "facts" }, `${owner} · ${messages} · ${dollars(about.spend_usd)} · ${when(about.updated_at)}`),
    el("div", { class: "actions" }, el("button", { type: "button", onclick: async () => {
      if (!confirm(`Delete ${owner}'s conversation "${about.title || name}"?`)) return;
      try {
        await api("DELETE", `/v1/sessions/${path(name)}?owner=${encodeURIComponent(owner)}`);
        row.remove();
        status("");
      } catch (error) { status(error.message, true); }
    } }, "Delete")));
  return row;
}

function sessionRow(about) {
  const row = el("li", { class: "row" });
  const messages = `${about.messages} message${about.messages === 1 ? "" : "s"}`;
  const facts = `${messages} · ${dollars(about.spend_usd)} · ${when(about.updated_at)}`;
  const rename = el("button", { type: "button", onclick: () => renaming() }, "Rename");
  const shown = ({ refocus = false } = {}) => {
    row.replaceChildren(
      el("div", { class: "main" }, el("span", { class: "title" }, about.title || about.id), " ",
        el("small", { class: "sid" }, about.id)),
      el("div", { class: "facts" }, facts),
      el("div", { class: "actions" },
        el("button", { type: "button", onclick: () => { showView("chat"); openSession(about.id); } }, "Open"),
        rename,
        el("button", { type: "button", onclick: () => remove() }, "Delete")));
    if (refocus) rename.focus();  // back where the person started the rename
  };
  const renaming = () => {
    const input = el("input", { type: "text", value: about.title || "", maxlength: "80", "aria-label": "New title",  // the API keeps 80
      required: "" });
    const form = el("form", { class: "rename", onsubmit: async (event) => {
      event.preventDefault();
      try {
        const done = await api("PATCH", `/v1/sessions/${path(about.id)}`, { title: input.value.trim() });
        about.title = done.title;
        status("");
        shown({ refocus: true });
        loadSessions().catch(() => {});
      } catch (error) { status(error.message, true); }
    } }, input, el("button", { type: "submit" }, "Save"),
    el("button", { type: "button", onclick: () => shown({ refocus: true }) }, "Cancel"));
    row.replaceChildren(form);
    input.focus();  // the person asked to rename: the title's box is where their keys go next
  };
  const remove = async () => {
    if (!confirm(`Delete the conversation "${about.title || about.id}"?`)) return;
    try {
      await api("DELETE", `/v1/sessions/${path(about.id)}`);
      row.remove();
      status("");
      if (about.id === state.session) await openSession(newSessionId(), { fresh: true });
      else loadSessions().catch(() => {});
    } catch (error) { status(error.message, true); }
  };
  shown();
  return row;
}

// -- jobs ----------------------------------------------------------------------------------------
const jobsAsked = latest();

async function showJobs() {
  pickAgent($("job-agent"));
  const everyone = state.me.operator && $("jobs-everyone").checked;
  await jobsAsked(() => api("GET", `/v1/cron${everyone ? "?owner=*" : ""}`),
    ({ jobs }) => $("job-rows").replaceChildren(...(jobs.length ? jobs.map(jobRow)
      : [el("li", { class: "note" }, "No jobs yet.")])));
}

// A job's path in the API: its name, and ?owner= when it is another identity's (an operator's "everyone's").
function jobPath(job, ...more) {
  const theirs = job.owner !== state.me.name ? `?owner=${encodeURIComponent(job.owner)}` : "";
  return `/v1/cron/${path(job.name, ...more)}${theirs}`;
}

function jobRow(job) {
  const runs = el("ul", { class: "runs", hidden: "" });
  const runsShown = (open) => { runs.hidden = !open; toggle.setAttribute("aria-expanded", String(open)); };
  const toggle = el("button", { type: "button", "aria-expanded": "false", onclick: async () => {
    runsShown(runs.hidden);
    if (!runs.hidden) await showRuns(job, runs).catch((error) => status(error.message, true));
  } }, "Runs");
  const act = async (action) => {
    try {
      const done = await api("POST", jobPath(job, action));
      status("");
      if (action === "run") { runsShown(true); await showRuns(job, runs); } else drawn(done);
    } catch (error) { status(error.message, true); }
  };
  // Pause and resume change the row in place: the button the person pressed keeps the keyboard.
  const state_ = el("small", { class: "state" });
  const facts = el("div", { class: "facts" });
  const pause = el("button", { type: "button", onclick: () => act(job.paused ? "resume" : "pause") });
  const whose = job.owner !== state.me.name ? `${job.owner} · ` : "";  // only in an operator's "everyone's"
  const drawn = (changed) => {
    job = changed;
    row.classList.toggle("paused", job.paused);
    state_.textContent = job.paused ? "paused" : "active";
    pause.textContent = job.paused ? "Resume" : "Pause";
    facts.textContent = `${whose}${job.schedule} · agent ${job.agent} · next ${job.paused ? "—" : when(job.next_due)}`;
  };
  const row = el("li", { class: "row" },
    el("div", { class: "main" }, el("span", { class: "title" }, job.name), " ", state_),
    facts,
    el("div", { class: "facts message" }, job.message),
    el("div", { class: "actions" },
      pause,
      el("button", { type: "button", onclick: () => act("run") }, "Run now"),
      toggle,
      el("button", { type: "button", onclick: async () => {
        if (!confirm(`Remove ${whose ? `${job.owner}'s` : "the"} job "${job.name}"?`)) return;
        try { await api("DELETE", jobPath(job)); row.remove(); status(""); }
        catch (error) { status(error.message, true); }
      } }, "Remove")),
    runs);
  drawn(job);
  return row;
}

// Each run as the scheduler recorded it: fired (and how its turn ended), skipped or missed, and why.
async function showRuns(job, list) {
  const { runs } = await api("GET", jobPath(job, "runs"));
  list.replaceChildren(...(runs.length ? runs.map((run) => el("li", { class: `run ${run.status}` },
    el("strong", {}, run.status), ` ${when(run.fired_at || run.due)}`,
    run.reason ? ` · ${run.reason}` : "", run.outcome ? ` · ${run.outcome}` : "",
    run.answer ? el("div", { class: "facts" }, run.answer) : "")) : [el("li", { class: "note" }, "No runs yet.")]));
}

async function createJob(event) {
  event.preventDefault();
  const body = { name: $("job-name").value.trim(), message: $("job-message").value, tz: $("job-tz").value.trim(),
    agent: $("job-agent").value, [$("job-kind").value]: $("job-when").value.trim() };
  try {
    await api("POST", "/v1/cron", body);
    status(`Job ${body.name} created.`);
    $("job-name").value = "";
    $("job-message").value = "";
    await showJobs();
  } catch (error) { status(error.message, true); }
}

// Rows of cells as a table (each cell text, or an element made here), inside a box that scrolls sideways on a
// narrow screen rather than widening the page.
function grid(table, head, rows) {
  table.replaceChildren(el("tr", {}, ...head.map((h) => el("th", {}, h))),
    ...rows.map((r) => el("tr", {}, ...r.map((c) => el("td", {}, c ?? "")))));
  return table;
}

// A secret the API shows once (a new token, a hook's secret): in a box the person can select or copy, until
// they close it. It is never kept: a listing has none, and drawing the view again forgets it.
function secretBox(holder, label, secret, note) {
  const box = el("input", { type: "text", readonly: "", value: secret, "aria-label": label, class: "secret-value" });
  const copy = el("button", { type: "button", onclick: () => {
    box.select();
    navigator.clipboard?.writeText(secret).catch(() => {});
    copy.textContent = "Copied";
  } }, "Copy");
  holder.replaceChildren(el("div", { class: "secret", role: "group", "aria-label": label },
    el("strong", {}, label), el("p", { class: "note" }, note), el("div", { class: "filters" }, box, copy,
      el("button", { type: "button", onclick: () => holder.replaceChildren() }, "Done"))));
}

// -- memory --------------------------------------------------------------------------------------
// The notes the identity keeps with an agent, its own and the shared ones: listed (the search box asks the
// API for those whose name or text holds it), deleted; and what the agent's recall finds for a question. An
// operator may name another identity (the owner box): its notes, its deletions and its recall instead.
const notesAsked = latest();

const memoryOwner = () => (state.me.operator ? $("memory-owner").value.trim() : "");

function memoryQuery(agent) {
  const owner = memoryOwner();
  return `agent=${encodeURIComponent(agent)}${owner ? `&owner=${encodeURIComponent(owner)}` : ""}`;
}

async function showNotes() {
  pickAgent($("memory-agent"));
  const agent = $("memory-agent").value || "main";
  const query = $("memory-search").value.trim();
  await notesAsked(() => api("GET", `/v1/memory?${memoryQuery(agent)}${query ? `&q=${encodeURIComponent(query)}` : ""}`),
    ({ notes }) => $("note-rows").replaceChildren(...(notes.length ? notes.map((note) => noteRow(agent, note))
      : [el("li", { class: "note" }, query ? "No note matches." : "No notes yet.")])));
}

const recallAsked = latest();

async function recall(event) {
  event.preventDefault();
  const agent = $("memory-agent").value || "main";
  const query = $("recall-query").value.trim();
  if (!query) return;
  $("recall-rows").replaceChildren(el("li", { class: "note" }, "Searching…"));
  try {
    await recallAsked(() => api("GET", `/v1/memory/recall?${memoryQuery(agent)}&q=${encodeURIComponent(query)}`),
      ({ hits }) => $("recall-rows").replaceChildren(...(hits.length ? hits.map(recallRow)
        : [el("li", { class: "note" }, "Recall finds nothing for this.")])));
    status("");
  } catch (error) { $("recall-rows").replaceChildren(); status(error.message, true); }
}

function recallRow(hit) {
  const where = hit.source === "note" ? `note ${hit.key} (${hit.scope})`
    : `conversation ${hit.session}, said by the ${hit.said_by}`;
  return el("li", { class: "row hit" },
    el("div", { class: "main" }, el("span", { class: "title" }, where)),
    el("div", { class: "facts" }, `score ${hit.score}${hit.when ? ` · ${new Date(hit.when).toLocaleString()}` : ""}`),
    el("div", { class: "facts message" }, hit.excerpt));
}

function noteRow(agent, note) {
  const shared = note.scope === "shared";
  const owner = memoryOwner();
  const whose = shared || !owner || owner === state.me.name ? note.scope : `${owner}'s`;
  return el("li", { class: "row" },
    el("div", { class: "main" }, el("span", { class: "title" }, note.key), " ", el("small", {}, whose)),
    el("div", { class: "facts" }, `${note.chars} characters · ${when(note.updated / 1000)}`),
    el("div", { class: "facts message" }, note.preview),
    el("div", { class: "actions" }, shared && !state.me.operator ? "" : el("button", { type: "button",
      onclick: async () => {
        if (!confirm(`Delete ${whose === note.scope ? "the" : whose} note "${note.key}"?`)) return;
        const query = `${memoryQuery(agent)}${shared ? "&shared=1" : ""}`;
        try { await api("DELETE", `/v1/memory/${path(note.key)}?${query}`); status(""); await showNotes(); }
        catch (error) { status(error.message, true); }
      } }, "Delete")));
}

// -- pool (operators) ----------------------------------------------------------------------------
async function showPool() {
  const data = await api("GET", "/v1/status");
  const table = (head, rows) => el("div", { class: "scroll" }, grid(el("table", {}), head, rows));
  $("view-pool").replaceChildren(
    el("h2", {}, "Pool"),
    el("h3", {}, "Hands workers"),
    table(["worker", "running", "queued", "capacity", "sandbox"], data.instances.hands.map((w) =>
      [w.id, w.running, w.queued, w.capacity, w.sandbox])),
    el("h3", {}, "Brains"), table(["brain", "in flight", "capacity"], data.instances.brain.map((b) =>
      [b.id, b.in_flight, b.capacity])),
    el("h3", {}, "Queues"), table(["stream", "pending", "undelivered"], data.streams.map((q) =>
      [q.stream, q.pending, q.undelivered])),
    el("p", {}, `dead letters: ${data.dead}`));
}

// -- start ---------------------------------------------------------------------------------------
// After app.js's own listener (scripts run in order): the page's elements are in `ui` by now.
document.addEventListener("DOMContentLoaded", () => {
  for (const view of Object.keys(VIEWS)) $(`tab-${view}`).addEventListener("click", () => showView(view));
  $("session-search").addEventListener("input", () => showSessions().catch((error) => status(error.message, true)));
  $("sessions-everyone").addEventListener("change", () => showSessions().catch((error) => status(error.message, true)));
  $("memory-search").addEventListener("input", () => showNotes().catch((error) => status(error.message, true)));
  for (const [choice, event] of [["memory-agent", "change"], ["memory-owner", "input"]]) {
    $(choice).addEventListener(event, () => {
      $("recall-rows").replaceChildren();  // what was recalled was another agent's or owner's
      showNotes().catch((error) => status(error.message, true));
    });
  }
  $("recall-form").addEventListener("submit", recall);
  $("job-kind").addEventListener("change", () => {
    $("job-when").placeholder = { every: "1h", cron: "0 8 * * 1-5", at: "2026-12-24T18:00" }[$("job-kind").value];
  });
  $("job-form").addEventListener("submit", createJob);
  $("jobs-everyone").addEventListener("change", () => showJobs().catch((error) => status(error.message, true)));
});
