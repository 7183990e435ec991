// The console's operator views: the chat channels and pairing, the Gateway's tokens and its signed webhooks
// (what `pincer channels`, `pincer token` and `pincer hooks` show and do), each through the HTTP API, which
// refuses anyone but an operator. A stranger's handle, a channel's last error, a hook's message are text from
// outside: they go in as text.
"use strict";

VIEWS.channels = { show: () => showChannels(), operator: true };
// A secret shown once is gone when its view is chosen again (the person leaves it, it is not kept).
VIEWS.tokens = { show: () => { $("token-secret").replaceChildren(); return showTokens(); }, operator: true };
VIEWS.hooks = { show: () => { $("hook-secret").replaceChildren(); return showHooks(); }, operator: true };

const ago = (seconds) => (seconds === null || seconds === undefined ? "never" : `${Math.round(seconds)} s ago`);

// An action of a row's button: the API's answer, or its refusal in the status line; then the view again.
async function act(call, view, done = "") {
  try { await call(); status(done); await view(); } catch (error) { status(error.message, true); }
}

// -- channels ------------------------------------------------------------------------------------
async function showChannels() {
  const [{ channels }, { requests }, { paired }] = await Promise.all([api("GET", "/v1/channels"),
    api("GET", "/v1/channels/pairing"), api("GET", "/v1/channels/paired")]);
  grid($("channel-table"), ["channel", "state", "enabled", "bot", "last good poll", "in", "out", "errors",
    "last error"], channels.map((c) => [c.channel, el("span", { class: `state ${c.state.replace(/\W/g, "-")}` },
    c.state), c.enabled ? "yes" : "no", c.bot, ago(c.last_progress_s_ago), String(c.in), String(c.out),
    String(c.errors), c.last_error]));
  $("pairing-rows").replaceChildren(...(requests.length ? requests.map(pairingRow)
    : [el("li", { class: "note" }, "Nobody is waiting.")]));
  $("paired-rows").replaceChildren(...(paired.length ? paired.map(pairedRow)
    : [el("li", { class: "note" }, "Nobody was let in by pairing.")]));
}

function pairingRow(who) {
  const handle = who.username ? `@${who.username}` : "";
  return el("li", { class: "row" },
    el("div", { class: "main" }, el("span", { class: "title" }, `${who.channel} user ${who.user}`), " ", handle),
    el("div", { class: "facts" }, `code ${who.code} · asked ${when(who.asked)} · ${Math.round(who.expires_in / 60)} min left`),
    el("div", { class: "actions" }, el("button", { type: "button", onclick: () => act(() => api("POST",
      `/v1/channels/pairing/${path(who.code)}?channel=${encodeURIComponent(who.channel)}`), showChannels,
    `${who.channel} user ${who.user} is paired.`) }, "Approve")));
}

function pairedRow(who) {
  return el("li", { class: "row" },
    el("div", { class: "main" }, el("span", { class: "title" }, who.identity), " ",
      who.username ? `@${who.username}` : ""),
    el("div", { class: "facts" }, `let in by ${who.by} · ${when(who.at)}`),
    el("div", { class: "actions" }, el("button", { type: "button", onclick: () => {
      if (!confirm(`Unpair ${who.identity}? Their jobs are removed with them.`)) return;
      act(() => api("DELETE", `/v1/channels/paired/${path(who.user)}?channel=${encodeURIComponent(who.channel)}`),
        showChannels, `${who.identity} is unpaired.`);
    } }, "Unpair")));
}

// -- tokens --------------------------------------------------------------------------------------
async function showTokens() {
  const { tokens } = await api("GET", "/v1/tokens");
  $("token-rows").replaceChildren(...tokens.map((token) => el("li", { class: "row" },
    el("div", { class: "main" }, el("span", { class: "title" }, token.name), " ", el("small", {}, token.scope)),
    el("div", { class: "facts" }, `agents: ${token.agents ? token.agents.join(", ") : "every agent"} · made `
      + `${when(token.created)}${token.source === "gateway.token" ? " · the configured token" : ""}`),
    el("div", { class: "actions" }, token.source === "gateway.token" ? "" : el("button", { type: "button",
      onclick: () => {
        if (!confirm(`Revoke the token "${token.name}"? Its jobs are removed with it.`)) return;
        act(() => api("DELETE", `/v1/tokens/${path(token.name)}`), showTokens, `Token ${token.name} is revoked.`);
      } }, "Revoke")))));
}

async function createToken(event) {
  event.preventDefault();
  const agents = $("token-agents").value.split(",").map((a) => a.trim()).filter(Boolean);
  const body = { name: $("token-name").value.trim(), scope: $("token-scope").value, agents };
  try {
    const made = await api("POST", "/v1/tokens", body);
    secretBox($("token-secret"), `The token for ${made.name}`, made.token,
      "Shown this once: copy it now and give it to its holder. Nobody can show it again; revoke it and make "
      + "another if it is lost.");
    status(`Token ${made.name} created.`);
    $("token-name").value = "";
    $("token-agents").value = "";
    await showTokens();
  } catch (error) { status(error.message, true); }
}

// -- hooks ---------------------------------------------------------------------------------------
async function showHooks() {
  pickAgent($("hook-agent"));
  const { hooks } = await api("GET", "/v1/admin/hooks");
  $("hook-rows").replaceChildren(...(hooks.length ? hooks.map(hookRow)
    : [el("li", { class: "note" }, "No hooks yet.")]));
}

function hookRow(hook) {
  const rotate = async () => {
    if (!confirm(`Rotate the secret of "${hook.name}"? The old one stays good for an hour.`)) return;
    try {
      const done = await api("POST", `/v1/admin/hooks/${path(hook.name, "rotate")}`);
      secretBox($("hook-secret"), `The new secret of ${done.name}`, done.secret,
        `Shown this once: give it to the sender. The old secret stays good for ${Math.round(done.previous_good_for_s / 60)} min.`);
      status(`Hook ${done.name} has a new secret.`);
    } catch (error) { status(error.message, true); }
  };
  return el("li", { class: "row" },
    el("div", { class: "main" }, el("span", { class: "title" }, hook.name), " ", el("small", {}, `agent ${hook.agent}`)),
    el("div", { class: "facts" }, `POST /v1/hooks/${hook.name} · made ${when(hook.created)}`
      + `${hook.deliver ? ` · delivers to ${hook.deliver}` : ""}`),
    el("div", { class: "facts message" }, hook.template),
    el("div", { class: "actions" },
      el("button", { type: "button", onclick: rotate }, "Rotate secret"),
      el("button", { type: "button", onclick: () => {
        if (!confirm(`Remove the hook "${hook.name}"? Its jobs are removed with it.`)) return;
        act(() => api("DELETE", `/v1/admin/hooks/${path(hook.name)}`), showHooks, `Hook ${hook.name} is removed.`);
      } }, "Remove")));
}

async function createHook(event) {
  event.preventDefault();
  const deliver = $("hook-deliver").value.trim();
  const body = { name: $("hook-name").value.trim(), agent: $("hook-agent").value, template: $("hook-template").value,
    ...(deliver ? { deliver } : {}) };
  try {
    const made = await api("POST", "/v1/admin/hooks", body);
    secretBox($("hook-secret"), `The secret of ${made.name}`, made.secret,
      `Shown this once: give it to the sender, who signs each request to ${made.path} with it.`);
    status(`Hook ${made.name} created.`);
    $("hook-name").value = "";
    await showHooks();
  } catch (error) { status(error.message, true); }
}

document.addEventListener("DOMContentLoaded", () => {
  $("token-form").addEventListener("submit", createToken);
  $("hook-form").addEventListener("submit", createHook);
});
