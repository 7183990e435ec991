// The console's spend view: today's and this month's spend against the budgets, a chart of the last 30 days
// (uPlot, vendored: it draws on a canvas) and the latest alerts, as GET /v1/spend gives them. An operator is
// given the pool's (the pool, each agent, each identity); anyone else their own identity's alone: the page
// shows what the API answers and decides nothing of it.
"use strict";

VIEWS.spend = { show: () => showSpend() };

const CHART_DAYS = 30;
const CHART_LINES = 8;  // the pool and the scopes that spent most: more lines than this are a tangle
const COLOURS = ["#2b6cb0", "#c05621", "#2f855a", "#b83280", "#6b46c1", "#b7791f", "#319795", "#718096"];
const spendAsked = latest();
let spendChart = null;

function scopeName(scope) {
  const [kind, name] = scope.split(/:(.*)/s);
  return kind === "pool" ? "the pool" : `${kind} ${name}`;
}

async function showSpend() {
  await spendAsked(() => api("GET", `/v1/spend?days=${CHART_DAYS}`), (data) => {
    $("spend-scope").textContent = `${data.scope === "pool" ? "The pool's spend" : `Your own spend (${scopeName(data.scope)})`}`
      + `, by days in ${data.timezone}.`;
    spendTable(data.budgets);
    spendChartDraw(data.daily || []);
    $("spend-alerts").replaceChildren(...(data.alerts.length ? data.alerts.map((alert) => el("li", { class: "row" },
      el("div", { class: "main" }, alert.text || `${alert.budget} at ${alert.share}`),
      el("div", { class: "facts" }, `${alert.scope ? scopeName(alert.scope) : "the pool"} · ${when(Number(alert.at))}`)))
      : [el("li", { class: "note" }, "No alerts.")]));
  });
}

// One line per scope: today's spend against the day's limit, this month's against the month's.
function spendTable(budgets) {
  const scopes = new Map();
  for (const row of budgets) {
    const line = scopes.get(row.scope) || {};
    line[row.period.startsWith("day:") ? "day" : "month"] = row;
    scopes.set(row.scope, line);
  }
  const against = (row) => {
    if (!row) return "—";
    if (row.limit_usd === null) return `${dollars(row.spent_usd)} (no limit)`;
    return el("span", { class: "against" }, `${dollars(row.spent_usd)} of ${dollars(row.limit_usd)} `,
      el("meter", { min: "0", max: String(row.limit_usd || 1e-9), high: String(row.limit_usd * 0.8),
        optimum: "0", value: String(row.spent_usd), "aria-label": `${row.budget}: share spent` }));
  };
  grid($("spend-table"), ["", "today", "this month", "calls today"], [...scopes].map(([scope, line]) =>
    [scopeName(scope), against(line.day), against(line.month), String(line.day?.calls ?? 0)]));
}

// Each scope's spend a day, oldest first (the API fills a day without spend with 0).
function spendChartDraw(series) {
  const holder = $("spend-chart");
  if (spendChart) { spendChart.destroy(); spendChart = null; }
  if (!series.length) { holder.replaceChildren(el("p", { class: "note" }, "No spend yet.")); return; }
  holder.replaceChildren();
  const total = (s) => s.days.reduce((sum, d) => sum + d.spent_usd, 0);
  const shown = [series[0], ...series.slice(1).sort((a, b) => total(b) - total(a))].slice(0, CHART_LINES);
  const days = shown[0].days.map((d) => Date.parse(`${d.day}T12:00:00Z`) / 1000);
  const options = {
    width: chartWidth(holder), height: 220,
    tzDate: (ts) => window.uPlot.tzDate(new Date(ts * 1000), "UTC"),  // a day is the API's day, wherever the page is
    scales: { x: { time: true }, y: { range: (u, min, max) => [0, max > 0 ? max * 1.1 : 0.01] } },
    axes: [{ stroke: "#888", grid: { stroke: "#8883" }, ticks: { stroke: "#8883" } },
      { stroke: "#888", grid: { stroke: "#8883" }, ticks: { stroke: "#8883" }, size: 60,
        values: (u, ticks) => ticks.map((v) => dollars(v)) }],
    series: [{ label: "day", value: (u, ts) => (ts === null ? "—" : new Date(ts * 1000).toISOString().slice(0, 10)) },
      // The pool's line is the widest, under the rest: an agent or identity that spent all of it lies on it.
      ...shown.map((s, i) => ({ label: scopeName(s.scope), stroke: COLOURS[i % COLOURS.length], width: i ? 2 : 5,
        points: { size: i ? 4 : 6 }, value: (u, v) => (v === null ? "—" : dollars(v)) }))],
  };
  spendChart = new window.uPlot(options, [days, ...shown.map((s) => s.days.map((d) => d.spent_usd))], holder);
}

function chartWidth(holder) { return Math.max(240, Math.min(holder.clientWidth || 600, 900)); }

document.addEventListener("DOMContentLoaded", () => {
  window.addEventListener("resize", () => {
    if (spendChart) spendChart.setSize({ width: chartWidth($("spend-chart")), height: 220 });
  });
});
