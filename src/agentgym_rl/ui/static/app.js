// The viewer's single page: plain DOM, no build step. Every call goes to /api (see ui/app.py).
"use strict";

const $ = (id) => document.getElementById(id);
const state = { runs: [], details: {}, ticked: new Set(), page: 0, pageSize: 100, session: null, metricNames: null };
const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2"];

async function api(path, options) {
  const response = await fetch(path, options);
  const body = await response.json().catch(() => ({ detail: response.statusText }));
  if (!response.ok) {
    const message = typeof body.detail === "string" ? body.detail : JSON.stringify(body.detail);
    showError(message);
    throw new Error(message);
  }
  $("error").textContent = "";
  return body;
}

function showError(message) {
  $("error").textContent = message;
}

function el(tag, attributes = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attributes)) {
    if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value);
  }
  for (const child of children) node.append(child instanceof Node ? child : String(child ?? ""));
  return node;
}

function fmt(value) {
  if (value === null || value === undefined) return "";
  if (typeof value === "number") return Number.isInteger(value) ? String(value) : value.toFixed(3);
  return String(value);
}

// ------------------------------------------------------------------ tabs

for (const button of document.querySelectorAll("nav button")) {
  button.addEventListener("click", () => showTab(button.dataset.tab));
}

function showTab(name) {
  for (const b of document.querySelectorAll("nav button")) b.classList.toggle("active", b.dataset.tab === name);
  for (const s of document.querySelectorAll(".tab")) s.classList.toggle("active", s.id === name);
  location.hash = name;
}

// ------------------------------------------------------------------ runs

async function loadRuns() {
  const body = await api("/api/runs");
  state.runs = body.runs;
  $("runs-dir").textContent = body.runs_dir;
  const rows = body.runs.map((run, i) => {
    const box = el("input", { type: "checkbox", "data-run": run.name });
    box.checked = i === 0;
    if (box.checked) state.ticked.add(run.name);
    box.addEventListener("change", () => {
      box.checked ? state.ticked.add(run.name) : state.ticked.delete(run.name);
      refreshCurves();
    });
    return el("tr", { onclick: (e) => { if (e.target !== box) showConfig(run.name); } },
      el("td", {}, box), el("td", {}, run.name), el("td", {}, run.env ?? ""), el("td", {}, run.kind ?? ""),
      el("td", {}, fmt(run.steps)), el("td", {}, fmt(run.success)), el("td", {}, fmt(run.validation)));
  });
  $("run-table").querySelector("tbody").replaceChildren(...rows);
  $("t-run").replaceChildren(...body.runs.map((run) => el("option", { value: run.name }, run.name)));
  $("p-run").replaceChildren(...body.runs.map((run) => el("option", { value: run.name }, `run ${run.name}`)),
    el("option", { value: "" }, "a served model"));
  $("p-endpoint-fields").hidden = body.runs.length > 0;
  checkRunEnv();
  if (body.runs.length) {
    await showConfig(body.runs[0].name);
    await refreshCurves();
    await loadTrajectoryRun();
  }
}

// Metric names come from the server (metric_names.py): the curve shown first, what each key means.
async function metricNames() {
  if (!state.metricNames) state.metricNames = await api("/api/metrics");
  return state.metricNames;
}

async function details(name) {
  if (!state.details[name]) state.details[name] = await api(`/api/runs/${encodeURIComponent(name)}`);
  return state.details[name];
}

async function showConfig(name) {
  const run = await details(name);
  $("config-name").textContent = name;
  $("config").textContent = JSON.stringify(run.config, null, 2);
  $("problems").replaceChildren(...run.problems.map((p) => el("li", {}, `${name}: ${p}`)));
}

// The curve list is every metric any ticked run logged; the chosen one stays while it exists.
async function refreshCurves() {
  const keys = new Set();
  for (const name of state.ticked) {
    for (const row of (await details(name)).metrics) {
      for (const [k, v] of Object.entries(row)) if (typeof v === "number" && k !== "step") keys.add(k);
    }
  }
  const chosen = $("metric").value;
  const sorted = [...keys].sort();
  const names = await metricNames();
  $("metric").replaceChildren(...sorted.map((k) => el("option", { value: k, title: names.described[k] ?? "" }, k)));
  const preferred = names.preferred.find((k) => keys.has(k)) ?? sorted[0];
  if (keys.has(chosen)) $("metric").value = chosen;
  else if (preferred) $("metric").value = preferred;
  await drawPlot();
}

$("metric").addEventListener("change", drawPlot);
$("smooth").addEventListener("change", drawPlot);
window.addEventListener("resize", () => { clearTimeout(state.resizing); state.resizing = setTimeout(drawPlot, 150); });

async function drawPlot() {
  const key = $("metric").value;
  const series = [];
  // In the table's order, so that a run keeps its colour whichever others are ticked.
  for (const name of state.runs.map((r) => r.name).filter((n) => state.ticked.has(n))) {
    const run = await details(name);
    const points = run.metrics.filter((r) => typeof r[key] === "number").map((r) => [r.step, r[key]]);
    if (points.length) series.push({ name, points, color: COLORS[state.runs.findIndex((r) => r.name === name) % COLORS.length] });
  }
  const smooth = $("smooth").checked;
  $("plot").replaceChildren(linePlot(series, key, smooth, $("plot").clientWidth || 900));
  $("legend").replaceChildren(...series.map((s) => el("span", { class: "swatch" },
    el("i", { style: `background:${s.color}` }), `${s.name} (${s.points.length} points)`)));
}

/** Mean of each value and the up to `window - 1` before it (eval/plots.py: trailing_mean). */
function trailingMean(values, window) {
  let total = 0;
  return values.map((v, i) => {
    total += v;
    if (i >= window) total -= values[i - window];
    return total / Math.min(i + 1, window);
  });
}

/** Rates live in [0, 1]: success, Pass@k, invalid-action rates. */
function isRate(key) {
  return /(^|\/)(success|pass_at_k)(\/|$)|success$|_rate$/.test(key);
}

/** About `count` round tick values covering [lo, hi]. */
function niceTicks(lo, hi, count, integer) {
  const raw = (hi - lo) / Math.max(1, count);
  const power = 10 ** Math.floor(Math.log10(raw || 1));
  let step = [1, 2, 2.5, 5, 10].map((m) => m * power).find((s) => s >= raw) ?? 10 * power;
  if (integer) step = Math.max(1, Math.round(step));
  const ticks = [];
  for (let t = Math.ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) ticks.push(Number(t.toPrecision(12)));
  return ticks;
}

function linePlot(series, label, smooth, width) {
  const height = 340, left = 64, bottom = 44, top = 14, right = 16;
  const svgNS = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(svgNS, "svg");
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.setAttribute("width", width);
  svg.setAttribute("height", height);
  const add = (tag, attrs, text) => {
    const node = document.createElementNS(svgNS, tag);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
    if (text !== undefined) node.textContent = text;
    svg.append(node);
    return node;
  };
  const all = series.flatMap((s) => s.points);
  if (!all.length) {
    add("text", { x: 20, y: 40 }, label ? `no ${label} logged by the ticked runs` : "no metrics yet: tick a run");
    return svg;
  }
  let [x0, x1] = [Math.min(...all.map((p) => p[0])), Math.max(...all.map((p) => p[0]))];
  let [y0, y1] = [Math.min(...all.map((p) => p[1])), Math.max(...all.map((p) => p[1]))];
  if (x0 === x1) { x0 -= 1; x1 += 1; }
  if (isRate(label) && y0 >= 0 && y1 <= 1) { y0 = 0; y1 = 1; }
  else {
    const pad = y1 > y0 ? 0.06 * (y1 - y0) : Math.abs(y0) * 0.1 || 1;
    y0 -= pad; y1 += pad;
  }
  const sx = (x) => left + ((x - x0) / (x1 - x0)) * (width - left - right);
  const sy = (y) => height - bottom - ((y - y0) / (y1 - y0)) * (height - top - bottom);
  for (const y of niceTicks(y0, y1, 5, false)) {
    add("line", { x1: left, y1: sy(y), x2: width - right, y2: sy(y), class: "grid" });
    add("text", { x: left - 6, y: sy(y) + 4, class: "tick y", "text-anchor": "end" }, fmt(y));
  }
  for (const x of niceTicks(x0, x1, Math.max(2, Math.floor((width - left - right) / 80)), true)) {
    add("line", { x1: sx(x), y1: top, x2: sx(x), y2: height - bottom, class: "grid" });
    add("text", { x: sx(x), y: height - bottom + 16, class: "tick x", "text-anchor": "middle" }, String(x));
  }
  add("line", { x1: left, y1: height - bottom, x2: width - right, y2: height - bottom, class: "axis" });
  add("line", { x1: left, y1: top, x2: left, y2: height - bottom, class: "axis" });
  add("text", { x: left + (width - left - right) / 2, y: height - 6, class: "label", "text-anchor": "middle" }, "step");
  add("text", { x: 14, y: top + (height - top - bottom) / 2, class: "label", "text-anchor": "middle",
    transform: `rotate(-90 14 ${top + (height - top - bottom) / 2})` }, label);
  const path = (points) => points.map((p, j) => `${j ? "L" : "M"}${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`).join(" ");
  for (const s of series) {
    const window = Math.max(1, Math.min(20, Math.floor(s.points.length / 10)));
    const smoothed = smooth && window > 1;
    add("path", { d: path(s.points), stroke: s.color, fill: "none", "stroke-width": smoothed ? 1 : 1.8,
      opacity: smoothed ? 0.3 : 1, "data-series": s.name });
    if (smoothed) {
      const means = trailingMean(s.points.map((p) => p[1]), window);
      add("path", { d: path(s.points.map((p, j) => [p[0], means[j]])), stroke: s.color, fill: "none",
        "stroke-width": 2.2, "data-series": `${s.name} (mean of ${window})` });
    }
    if (s.points.length <= 30) {  // few points (validation): each one shown
      for (const p of s.points) add("circle", { cx: sx(p[0]), cy: sy(p[1]), r: 3, fill: s.color });
    }
  }
  return svg;
}

// ------------------------------------------------------------------ trajectories

async function loadTrajectoryRun() {
  const run = await details($("t-run").value);
  const steps = [...new Set(run.files.map((f) => f.step))].sort((a, b) => a - b);
  $("t-step").replaceChildren(el("option", { value: "" }, "all"), ...steps.map((s) => el("option", { value: s }, s)));
  state.page = 0;
  await loadTrajectories();
}

// Filters fire one request each; a slow earlier reply must not overwrite a later one.
let trajectoryRequest = 0;

async function loadTrajectories() {
  const request = ++trajectoryRequest;
  const query = new URLSearchParams({ offset: state.page * state.pageSize, limit: state.pageSize });
  const filters = { split: "t-split", step: "t-step", env: "t-env", item: "t-item", category: "t-category",
    success: "t-success" };
  for (const [key, id] of Object.entries(filters)) if ($(id).value) query.set(key, $(id).value.trim());
  const name = $("t-run").value;
  const body = await api(`/api/runs/${encodeURIComponent(name)}/trajectories?${query}`);
  if (request !== trajectoryRequest) return;
  const chosen = $("t-category").value;
  $("t-category").replaceChildren(el("option", { value: "" }, "all"), ...body.categories.map((c) => el("option", { value: c }, c)));
  $("t-category").value = chosen;
  const last = Math.min(body.offset + body.rows.length, body.total);
  $("t-count").textContent = `${body.total} trajectories` + (body.total ? `, showing ${body.offset + 1}-${last}` : "");
  const rows = body.rows.map((r) => el("tr", {
    class: r.malformed ? "malformed" : r.success ? "ok" : "fail",
    onclick: (e) => replay(name, r, e.shiftKey ? "pane-b" : "pane-a"),
  }, el("td", {}, r.split), el("td", {}, r.step), el("td", {}, r.line),
  ...(r.malformed
    ? [el("td", { colspan: 6 }, `malformed line: ${r.malformed}`)]
    : [el("td", {}, r.item_id), el("td", {}, r.category), el("td", {}, r.success ? "yes" : "no"),
      el("td", {}, fmt(r.reward)), el("td", {}, fmt(r.turns)), el("td", {}, fmt(r.invalid_actions))])));
  $("t-table").querySelector("tbody").replaceChildren(...rows);
}

for (const id of ["t-split", "t-step", "t-category", "t-success"]) {
  $(id).addEventListener("change", () => { state.page = 0; loadTrajectories(); });
}
for (const id of ["t-env", "t-item"]) {
  $(id).addEventListener("keyup", (e) => { if (e.key === "Enter") { state.page = 0; loadTrajectories(); } });
  $(id).addEventListener("change", () => { state.page = 0; loadTrajectories(); });
}
$("t-run").addEventListener("change", loadTrajectoryRun);
$("t-prev").addEventListener("click", () => { if (state.page > 0) { state.page--; loadTrajectories(); } });
$("t-next").addEventListener("click", () => { state.page++; loadTrajectories(); });

function splitReply(text) {
  const thought = /Thought:\s*([\s\S]*?)(?=\n?Action:|$)/.exec(text);
  const action = /Action:\s*([\s\S]*)$/.exec(text);
  return { thought: thought ? thought[1].trim() : "", action: action ? action[1].trim() : text.trim() };
}

async function replay(run, row, paneId) {
  const query = new URLSearchParams({ split: row.split, step: row.step, line: row.line });
  const t = await api(`/api/runs/${encodeURIComponent(run)}/trajectory?${query}`);
  const pane = $(paneId);
  const title = el("h3", {}, `${run} · ${row.split} step ${row.step} · line ${row.line}`);
  if (t.malformed) {
    pane.replaceChildren(title, el("p", { class: "fail" }, `malformed line: ${t.malformed}`), el("pre", {}, t.raw));
    return;
  }
  const head = el("p", {}, `${t.item_id} (${t.category}) · ${t.success ? "success" : "failure"} · reward ${fmt(t.reward)}`);
  const turns = el("ol", { class: "turns", "data-testid": "turns" });
  const rewards = t.turn_rewards || [];
  let turn = 0;
  for (const m of t.messages || []) {
    if (m.role === "assistant") {
      const { thought, action } = splitReply(m.content);
      turns.lastChild?.append(
        thought ? el("div", { class: "thought" }, `Thought: ${thought}`) : "",
        el("div", { class: "action" }, `Action: ${action}`),
        el("div", { class: "reward" }, `reward ${fmt(rewards[turn] ?? 0)}`));
      turn++;
    } else {
      turns.append(el("li", { class: m.role }, el("pre", { class: "observation" }, m.content)));
    }
  }
  pane.replaceChildren(title, head, turns, tokenView(t.tokens));
}

function tokenView(tokens) {
  const box = el("div", { class: "tokens", "data-testid": "tokens" });
  if (!tokens || tokens.note) {
    box.append(el("p", { class: "hint" }, tokens ? tokens.note : "no tokens"));
    return box;
  }
  box.append(el("p", { class: "hint" }, "tokens: highlighted ones carry the loss (loss mask 1); hover for the logprob"));
  // An episode whose context was cut (rollout.keep_turns) is its windows back to back: each one
  // is what the model was shown, and a reply is trained in the window it was written in.
  const starts = new Set(tokens.window_starts || []);
  let window = 1;
  tokens.text.forEach((text, i) => {
    if (starts.has(i)) {
      window++;
      box.append(el("div", { class: "window-start", "data-testid": "window-start" }, `context window ${window}`));
    }
    const lp = tokens.logprob[i];
    box.append(el("span", {
      class: tokens.mask[i] ? "tok masked" : "tok",
      title: `#${i} id mask=${tokens.mask[i]}` + (lp === null || lp === undefined ? "" : ` logprob=${lp.toFixed(3)}`),
    }, text));
  });
  return box;
}

// ------------------------------------------------------------------ playground

async function loadEnvs() {
  const body = await api("/api/envs");
  $("p-env").replaceChildren(...body.envs.map((e) => el("option", { value: e.id, title: e.requires ? `needs ${e.requires}` : "" },
    e.requires ? `${e.id} (needs your own setup)` : e.id)));
  state.settable = Object.fromEntries(body.envs.map((e) => [e.id, e.settable]));
  showSettable();
  checkRunEnv();
  await loadItems();
}

// The page may set only an environment's safe arguments; the rest come from `view --env-arg`.
function showSettable() {
  const names = (state.settable || {})[$("p-env").value] || [];
  $("p-kwargs").title = names.length ? `settable here: ${names.join(", ")}; others with view --env-arg ENV.KEY=VALUE`
    : "nothing settable here; arguments come from view --env-arg ENV.KEY=VALUE";
}

let itemsRequest = 0;

async function loadItems() {
  const request = ++itemsRequest;
  $("p-item").replaceChildren();
  const query = new URLSearchParams({ split: $("p-split").value });
  try {
    const body = await api(`/api/envs/${encodeURIComponent($("p-env").value)}/tasks?${query}`);
    if (request !== itemsRequest) return;  // an env or split chosen since has its own reply
    $("p-item").replaceChildren(...body.tasks.slice(0, 500).map((t) => el("option", { value: t.item_id }, `${t.item_id} (${t.category})`)));
  } catch (error) { /* shown in the error line */ }
}

$("p-env").addEventListener("change", () => { showSettable(); checkRunEnv(); loadItems(); });

// A run's model acting in another environment than it was trained on: allowed, but said.
function checkRunEnv() {
  const run = state.runs.find((r) => r.name === $("p-run").value);
  const env = $("p-env").value;
  $("p-warning").textContent = run && run.env && env && run.env !== env
    ? `run ${run.name} was trained on ${run.env}, not ${env}: its replies may mean nothing here` : "";
}
$("p-split").addEventListener("change", loadItems);

$("p-start").addEventListener("click", async () => {
  let kwargs;
  try { kwargs = JSON.parse($("p-kwargs").value || "{}"); } catch (e) { showError(`env kwargs are not JSON: ${e.message}`); return; }
  if (state.session) fetch(`/api/play/${state.session}`, { method: "DELETE" });
  const body = await api("/api/play", { method: "POST", headers: { "content-type": "application/json" },
    body: JSON.stringify({ env_id: $("p-env").value, item_id: $("p-item").value || null, kwargs,
      url: $("p-url").value.trim() || null }) });
  state.session = body.session;
  showPlay(body);
});

async function act(action) {
  if (!state.session) { showError("start an episode first"); return; }
  const body = await api(`/api/play/${state.session}/step`, { method: "POST",
    headers: { "content-type": "application/json" }, body: JSON.stringify({ action }) });
  showPlay(body);
}

$("p-send").addEventListener("click", () => act($("p-action").value));
$("p-action").addEventListener("keyup", (e) => { if (e.key === "Enter") act($("p-action").value); });
$("p-model").addEventListener("click", async () => {
  if (!state.session) { showError("start an episode first"); return; }
  $("p-status").textContent = "the model is thinking...";
  try {
    const body = await api(`/api/play/${state.session}/model`, { method: "POST",
      headers: { "content-type": "application/json" }, body: JSON.stringify(modelChoice()) });
    showPlay(body);
  } finally { if ($("p-status").textContent.startsWith("the model")) $("p-status").textContent = ""; }
});

$("p-run").addEventListener("change", () => { $("p-endpoint-fields").hidden = $("p-run").value !== ""; checkRunEnv(); });

function modelChoice() {
  if ($("p-run").value) return { run: $("p-run").value };
  return { endpoint: $("p-endpoint").value.trim(), model: $("p-model-name").value.trim() };
}

const MAX_ACTION_BUTTONS = 40;

function showPlay(body) {
  const log = body.messages.map((m) => el("div", { class: `msg ${m.role}` }, el("b", {}, m.role === "user" ? "env" : "agent"), el("pre", {}, m.content)));
  $("p-log").replaceChildren(...log);
  $("p-log").scrollTop = $("p-log").scrollHeight;
  // A button per action while they fit on a line or two (BabyAI's, TextCraft's); SciWorld lists
  // thousands, which the action box offers as suggestions while one types instead.
  const actions = body.available_actions || [];
  const many = actions.length > MAX_ACTION_BUTTONS;
  $("p-actions").replaceChildren(...(many ? [`${actions.length} actions available: type in the box to see them`]
    : actions.map((a) => el("button", { onclick: () => act(a) }, a))));
  $("p-suggestions").replaceChildren(...(many ? actions.map((a) => el("option", { value: a })) : []));
  $("p-status").textContent = `${body.item_id} · turn ${(body.messages.length - 1) / 2} · reward ${fmt(body.total_reward)}` +
    (body.done ? " · episode over" : "");
  const image = body.image || body.screenshot;
  $("p-image").src = image ? `data:image/png;base64,${image}` : "";
  $("p-action").value = "";
}

// ------------------------------------------------------------------ start

loadRuns().catch(() => {});
loadEnvs().catch(() => {});
if (location.hash) showTab(location.hash.slice(1));
