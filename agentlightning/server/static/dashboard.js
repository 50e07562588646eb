// Agent Lightning dashboard: plain JavaScript, no build step, no library. Pages are picked by the URL's hash
// (#/run, #/rollouts?..., #/rollout/ID, #/tasks, #/task/ID); data comes from /ui/api with the bearer token.
"use strict";

const page = document.getElementById("page");
let timer = null;  // the current page's refresh timer

// -- helpers -------------------------------------------------------------------------------------------------

function esc(value) {
  return String(value ?? "").replace(/[&<>"']/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;",
    "'": "&#39;"}[c]));
}
const num = (v, digits = 3) => (v === null || v === undefined ? "" : Number(v).toPrecision(digits).replace(/\.?0+$/, ""));
const time = (t) => (t ? new Date(t * 1000).toLocaleTimeString() : "");
const seconds = (a, b) => (a && b ? `${(b - a).toFixed(2)} s` : "");
const plural = (n, word) => `${n} ${word}${n === 1 ? "" : "s"}`;
const badge = (s) => `<span class="badge ${esc(s)}">${esc(s)}</span>`;
const json = (v) => {  // one line when short, indented otherwise
  if (typeof v === "string") return v;
  const line = JSON.stringify(v);
  return line && line.length > 100 ? JSON.stringify(v, null, 2) : line;
};

class AuthNeeded extends Error {}

async function api(path) {
  const token = sessionStorage.getItem("aglToken");
  const response = await fetch("/ui/api" + path, {headers: token ? {Authorization: "Bearer " + token} : {}});
  const body = await response.json().catch(() => ({}));
  if (response.status === 401 || response.status === 403) {
    showLogin((body.error && body.error.message) || "this server needs its token");
    throw new AuthNeeded();
  }
  if (!response.ok) throw new Error(body.detail || (body.error && body.error.message) || response.statusText);
  return body;
}

function showLogin(message) {
  document.getElementById("login-message").textContent = `Refused: ${message}. Enter the server's token (agl server --token).`;
  document.getElementById("login").hidden = false;
  page.innerHTML = "";
}

document.getElementById("login").addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem("aglToken", document.getElementById("token").value);
  document.getElementById("login").hidden = true;
  route();
});

function query(hash) {
  const [path, search] = hash.replace(/^#\/?/, "").split("?");
  return {path: path.split("/").map(decodeURIComponent), params: new URLSearchParams(search || "")};
}

function setQuery(base, params) {
  const kept = [...params].filter(([, v]) => v !== "" && v !== "false");
  history.replaceState(null, "", `#/${base}` + (kept.length ? "?" + new URLSearchParams(kept) : ""));
}

// -- charts (inline SVG) -------------------------------------------------------------------------------------

const COLOURS = ["#3867d6", "#e17055", "#00a884", "#8e44ad", "#f5b400", "#636e72"];

// One chart of one or more series ({label, points: [[step, value], ...]}); a y axis whose values are all >= 0 starts
// at 0 or above, and the x axis is labelled with the steps the data has (a single step: that step, centred).
function lineChart(name, series, big = false) {
  if (!Array.isArray(series[0]?.points)) series = [{label: name, points: series}];
  series = series.filter((s) => s.points.length);
  if (!series.length) return "";
  const w = 320, h = big ? 190 : 150, left = 42, bottom = 20, top = 8, right = 8;
  const all = series.flatMap((s) => s.points), xs = all.map((p) => p[0]), ys = all.map((p) => p[1]);
  const [xmin, xmax, ymin, ymax] = [Math.min(...xs), Math.max(...xs), Math.min(...ys), Math.max(...ys)];
  let [x0, x1, y0, y1] = [xmin, xmax, ymin, ymax];
  if (x0 === x1) { x0 -= 1; x1 += 1; }
  if (y0 === y1) { const pad = Math.abs(y0) * 0.1 || 0.5; y0 -= pad; y1 += pad; }
  if (ymin >= 0 && y0 < 0) y0 = 0;  // counts, rates and lengths never go below zero
  const sx = (x) => left + ((x - x0) / (x1 - x0)) * (w - left - right);
  const sy = (y) => top + (1 - (y - y0) / (y1 - y0)) * (h - top - bottom);
  const drawn = series.map((s, i) => {
    const colour = COLOURS[i % COLOURS.length];
    const line = s.points.map((p) => `${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`).join(" ");
    const dots = s.points.map((p) => `<circle cx="${sx(p[0]).toFixed(1)}" cy="${sy(p[1]).toFixed(1)}" r="2.5"
      style="fill:${colour}"><title>${esc(s.label)} · step ${p[0]}: ${num(p[1], 4)}</title></circle>`).join("");
    return `<g data-series="${esc(s.label)}"><polyline points="${line}" style="stroke:${colour}"/>${dots}</g>`;
  });
  const xLabels = xmin === xmax ? `<text x="${sx(xmin) - 3}" y="${h - 4}">${num(xmin)}</text>` :
    `<text x="${left}" y="${h - 4}">${num(xmin)}</text><text x="${w - right - 30}" y="${h - 4}">${num(xmax)}</text>`;
  const legend = series.length > 1 ? `<div class="legend">${series.map((s, i) =>
    `<span style="color:${COLOURS[i % COLOURS.length]}">● ${esc(s.label)}</span>`).join(" ")}</div>` : "";
  return `<div class="chart-box${big ? " big" : ""}"><h4>${esc(name)}</h4>${legend}<svg class="chart"
    data-metric="${esc(name)}" data-points="${Math.max(...series.map((s) => s.points.length))}"
    data-series-count="${series.length}" viewBox="0 0 ${w} ${h}" width="100%">
    <line x1="${left}" y1="${h - bottom}" x2="${w - right}" y2="${h - bottom}" stroke="#ccc"/>
    <line x1="${left}" y1="${top}" x2="${left}" y2="${h - bottom}" stroke="#ccc"/>
    <text x="2" y="${top + 8}">${num(y1)}</text><text x="2" y="${h - bottom}">${num(y0)}</text>
    ${xLabels}<text x="${(w + left) / 2 - 10}" y="${h - 4}">step</text>${drawn.join("")}</svg></div>`;
}

// What a user reads first: reward and accuracy, in training and on the held-out tasks.
const HEADLINE = ["reward", "accuracy", "val/reward", "val/accuracy"];
// The other curves in this order; every other numeric column of metrics.jsonl follows, by name.
const FIRST = ["train/kl", "train/entropy", "train/loss", "completion_tokens_mean", "throughput (rollouts/s)",
  "staleness (calls off-version)", "step_seconds", "failed"];
const rank = (name) => (FIRST.includes(name) ? FIRST.indexOf(name) : FIRST.length);

function derived(row) {
  const extra = {};
  if (row.rollouts && row.step_seconds) extra["throughput (rollouts/s)"] = row.rollouts / row.step_seconds;
  if (row.llm_calls) extra["staleness (calls off-version)"] = 1 - (row.calls_on_version || 0) / row.llm_calls;
  return {...row, ...extra};
}

function seriesOf(rows) {
  const series = {};
  for (const row of rows.map(derived)) {
    for (const [key, value] of Object.entries(row)) {
      if (key !== "step" && typeof value === "number" && isFinite(value)) (series[key] ||= []).push([row.step, value]);
    }
  }
  return series;
}
const moved = (points) => points.some((p) => p[1] !== points[0][1]);

// The run's curves in three parts: the headline (always drawn), one chart per role or policy metric with a line
// per role (role/<name>/<metric>, policy/<name>/<metric>), and the rest; a chart none of whose lines moved over
// the run is not drawn but named with its (last) value, so a synchronous run shows no wall of async/* charts.
function curves(rows) {
  const series = seriesOf(rows);
  const headline = HEADLINE.filter((name) => series[name]).map((name) => lineChart(name, series[name], true));
  const grouped = {}, other = [];
  for (const name of Object.keys(series)) {
    const match = /^(role|policy)\/(.+)\/([^/]+)$/.exec(name);
    if (match) ((grouped[`${match[3]} by ${match[1]}`] ||= [])).push({label: match[2], points: series[name], name});
    else if (!HEADLINE.includes(name)) other.push(name);
  }
  const flat = [];
  const perRole = Object.keys(grouped).sort().map((title) => {
    const lines = grouped[title];
    if (lines.some((line) => moved(line.points))) return lineChart(title, lines);
    flat.push(...lines.map((line) => [line.name, line.points.at(-1)[1]]));
    return "";
  });
  // A synchronous run (nothing queued ahead, no lag) has async/* columns of waits that only say the step waited for
  // its rollouts: listed, not drawn.
  const ahead = ["async/queue_depth", "async/staleness_max"].some((name) => (series[name] || []).some((p) => p[1] > 0));
  const rest = other.sort((a, b) => rank(a) - rank(b) || a.localeCompare(b)).map((name) => {
    if (moved(series[name]) && (ahead || !name.startsWith("async/"))) return lineChart(name, series[name]);
    flat.push([name, series[name].at(-1)[1]]);
    return "";
  });
  return {headline: headline.join(""), perRole: perRole.join(""), rest: rest.join(""), flat};
}

function flatNote(flat, steps) {
  if (!flat.length) return "";
  const values = flat.sort((a, b) => a[0].localeCompare(b[0])).map(([name, value]) =>
    `<span class="flat-metric" data-metric="${esc(name)}">${esc(name)} = ${num(value)}</span>`);
  const why = (steps > 1 ? `never moved over the ${steps} steps` : "one step so far") +
    (flat.some(([name]) => name.startsWith("async/")) ? "; async/* of a run that sampled no step ahead" : "");
  return `<details id="flat"><summary>${flat.length} metrics not drawn (${why})</summary><p>${values.join(" · ")}</p>
    </details>`;
}

// The run's warnings, most important first: a run that trained nothing, what each step's extraction or update
// skipped (with the steps it happened in), the run's logged warnings (warnings.jsonl), retried and failed rollouts.
function warningList(rows, logged, overview) {
  const items = [];
  const steps = rows.filter((row) => row.step >= 1);
  if (steps.length && steps.every((row) => row.skipped_update)) {
    items.push(["nothing-trained", `Nothing trained: none of the ${steps.length} steps changed the model ` +
      `(${esc(steps.at(-1).model_version_after || steps.at(-1).model_version || "")} is the model it started with)`]);
  }
  const byText = new Map();
  for (const row of steps) for (const text of row.warnings || []) byText.set(text, [...(byText.get(text) || []), row.step]);
  for (const [text, at] of byText) items.push(["step", `${esc(text)} <small>(${stepList(at)})</small>`]);
  for (const entry of logged) {
    items.push(["run", `${esc(entry.message)} <small>(${esc(entry.logger)}${entry.count > 1 ? `, ${entry.count} times` : ""})</small>`]);
  }
  const counts = overview.counts || {};
  if (overview.retried) {
    items.push(["retried", `<a href="#/rollouts?retried=true">${plural(overview.retried, "rollout")} retried</a> ` +
      "(an attempt crashed, timed out or lost its worker)"]);
  }
  const failed = (counts.failed || 0) + (counts.timeout || 0) + (counts.cancelled || 0);
  if (failed) items.push(["failed", `<a href="#/rollouts?failed=true">${plural(failed, "rollout")} failed</a> on the last attempt`]);
  if (!items.length) return "";
  return `<h3>Warnings</h3><ul class="warnings">${items.map(([kind, html]) =>
    `<li class="warning ${kind}" data-kind="${kind}">${html}</li>`).join("")}</ul>`;
}

function stepList(steps) {
  if (steps.length === 1) return `step ${steps[0]}`;
  const contiguous = steps.every((s, i) => !i || s === steps[i - 1] + 1);
  return contiguous ? `steps ${steps[0]}–${steps.at(-1)}` : `steps ${steps.join(", ")}`;
}

// -- pages ---------------------------------------------------------------------------------------------------

const pages = {run: runPage, rollouts: rolloutsPage, rollout: rolloutPage, tasks: tasksPage, task: taskPage};

async function route() {
  clearInterval(timer);
  const hash = location.hash || "#/run";
  if (hash.startsWith("#token=")) {  // a link carrying the token: keep it for this tab, drop it from the URL
    sessionStorage.setItem("aglToken", decodeURIComponent(hash.slice(7)));
    history.replaceState(null, "", "#/run");
    return route();
  }
  const {path, params} = query(hash);
  const name = pages[path[0]] ? path[0] : "run";
  document.querySelectorAll("nav a").forEach((a) => a.classList.toggle("active", name.startsWith(a.dataset.page)));
  try {
    await pages[name](path.slice(1), params);
  } catch (error) {
    if (!(error instanceof AuthNeeded)) page.innerHTML = `<p class="error-box">${esc(error.message)}</p>`;
  }
}

function listing(title, items, cells) {
  if (!items || !items.length) return "";
  const rows = items.map((item) => `<tr>${cells(item).map((c) => `<td>${esc(c)}</td>`).join("")}</tr>`);
  return `<h3>${esc(title)}</h3><table><tbody>${rows.join("")}</tbody></table>`;
}

async function runPage() {
  const overview = await api("/overview");
  const counts = Object.entries(overview.counts || {}).map(([s, n]) => `${badge(s)} ${n}`).join(" &nbsp; ");
  document.getElementById("status-line").textContent = overview.store || overview.metrics || "";
  const versions = (overview.model_versions || []).map((v) => `<tr><td>${esc(v.version)}</td><td>${esc(v.model_name)}</td>
    <td>${time(v.created)}</td><td class="num">${v.rollouts}</td><td class="num">${num(v.mean_reward)}</td></tr>`);
  const settings = Object.entries(overview.settings).map(([k, v]) => `<tr><td>${esc(k)}</td><td>${esc(json(v))}</td></tr>`);
  page.innerHTML = `<h2>Run</h2><p>${counts || '<span class="empty">no rollouts in the store</span>'}</p>
    <div id="warnings"></div>
    <h3>Reward and accuracy <small id="curve-note"></small></h3><div class="charts headline" id="headline"></div>
    <div id="per-role"></div><div id="other"></div>
    <div id="evals"></div>
    <h3>Model versions</h3><table><thead><tr><th>version</th><th>model</th><th>since</th><th class="num">rollouts</th>
    <th class="num">mean reward</th></tr></thead><tbody>${versions.join("") || '<tr><td colspan="5" class="empty">none</td></tr>'}
    </tbody></table>${listing("Datasets", overview.datasets, (d) => [d.dataset_id, d.name, d.size, time(d.created)])}
    ${listing("Workers", overview.workers, (w) => [w.worker_id, `last seen ${time(w.last_seen)}`, `${w.leased} leased`])}
    <h3>Settings</h3><table class="kv"><tbody>${settings.join("")}</tbody></table>`;
  let rows = [], logged = [], tick = 0;
  const draw = async () => {
    const fresh = await api(`/metrics?since=${rows.length}`);
    const restarted = fresh.total < rows.length;  // a fresh run in the same directory started a new file
    rows = restarted ? (await api("/metrics")).rows : rows.concat(fresh.rows);
    const headline = document.getElementById("headline");
    if (!headline) return;
    const polled = tick++ % 5 === 0;  // the warnings log and the store's batches change slowly: every 10 s
    if (polled) logged = await api("/warnings");
    if (polled || restarted || fresh.rows.length) {
      document.getElementById("warnings").innerHTML = warningList(rows, logged, overview);
    }
    if (rows.length) {
      if (!restarted && !fresh.rows.length && headline.children.length) return;  // nothing new: keep what is drawn
      document.getElementById("curve-note").textContent = `(${rows.length} steps from ${overview.metrics})`;
      const drawn = curves(rows);
      headline.innerHTML = drawn.headline;
      document.getElementById("per-role").innerHTML = drawn.perRole ?
        `<h3>Per role and policy</h3><div class="charts" id="role-charts">${drawn.perRole}</div>` : "";
      document.getElementById("other").innerHTML = (drawn.rest ? `<h3>Other curves</h3><div class="charts" id="charts">
        ${drawn.rest}</div>` : "") + flatNote(drawn.flat, rows.length);
    } else if (polled) {  // no metrics.jsonl: the store's batches of rollouts (a step each) stand in
      const batches = await api("/batches");
      document.getElementById("curve-note").textContent = `(no metrics.jsonl; mean reward of each of ${batches.length} batches)`;
      headline.innerHTML = lineChart("batch mean reward", batches.map((b, i) => [i + 1, b.mean_reward]).filter((p) => p[1] !== null), true) +
        lineChart("batch failed rollouts", batches.map((b, i) => [i + 1, b.failed]), true);
    }
  };
  await draw();
  timer = setInterval(() => draw().catch(() => {}), 2000);
  const reports = await api("/evals");
  const box = document.getElementById("evals");
  if (box) box.innerHTML = evalTable(reports);
}

// Reports of agl.evaluate beside the run (<run>/eval/*.json): accuracy and reward with their 95% intervals.
function evalTable(reports) {
  if (!reports.length) return "";
  const ci = (i) => (i ? `${num(i.value)} [${num(i.low)}, ${num(i.high)}]` : "");
  const rows = reports.map((r) => (r.error ? `<tr><td>${esc(r.file)}</td><td colspan="6" class="error">${esc(r.error)}</td></tr>` :
    `<tr data-eval="${esc(r.file)}"><td>${esc(r.name)}</td><td>${esc(r.model_version)}</td><td class="num">${r.rollouts}</td>
    <td class="num">${ci(r.accuracy)}</td><td class="num">${ci(r.reward)}</td><td class="num">${num(r.tool_error_rate)}</td>
    <td>${time(r.created)}</td></tr>`));
  return `<h3>Evaluations</h3><table><thead><tr><th>name</th><th>model version</th><th class="num">rollouts</th>
    <th class="num">accuracy [95%]</th><th class="num">mean reward [95%]</th><th class="num">tool errors</th><th>when</th></tr>
    </thead><tbody>${rows.join("")}</tbody></table>`;
}

const ROLLOUT_FILTERS = ["status", "failed", "retried", "task_id", "group_id", "role", "model_version", "reward_min",
  "reward_max"];

async function rolloutsPage(_, params) {
  const options = await api("/filters");
  const statuses = ["", "queued", "running", "succeeded", "failed", "timeout", "cancelled"];
  const option = (v) => `<option value="${esc(v)}" ${params.get("status") === v ? "selected" : ""}>${esc(v || "any")}</option>`;
  const box = (name, label) => `<label>${label}<input type="checkbox" name="${name}" ${params.get(name) === "true" ? "checked" : ""}></label>`;
  const text = (name, label, extra = "") => `<label>${label}<input name="${name}" value="${esc(params.get(name) || "")}" ${extra}></label>`;
  page.innerHTML = `<h2>Rollouts</h2><form class="filters" id="filters">
    <label>status<select name="status">${statuses.map(option).join("")}</select></label>
    ${box("failed", "failed only")}${box("retried", "retried")}${text("task_id", "task")}${text("group_id", "group")}
    ${text("role", "role", 'list="roles"')}${text("model_version", "model version", 'list="versions"')}
    ${text("reward_min", "reward ≥", 'type="number" step="any"')}${text("reward_max", "reward ≤", 'type="number" step="any"')}
    <datalist id="roles">${options.roles.map((r) => `<option value="${esc(r)}">`).join("")}</datalist>
    <datalist id="versions">${options.model_versions.map((v) => `<option value="${esc(v)}">`).join("")}</datalist>
    </form><div id="table"></div>`;
  const form = document.getElementById("filters");
  const state = {sort: params.get("sort") || "created", desc: params.get("desc") !== "0", offset: +(params.get("offset") || 0),
    request: 0};
  let debounce = null;
  const load = async () => {
    const chosen = new URLSearchParams();
    for (const name of ROLLOUT_FILTERS) {
      const field = form.elements[name];
      chosen.set(name, field.type === "checkbox" ? String(field.checked) : field.value.trim());
    }
    chosen.set("sort", state.sort);
    chosen.set("desc", state.desc ? "1" : "0");
    chosen.set("offset", String(state.offset));
    setQuery("rollouts", chosen);
    const sent = new URLSearchParams([...chosen].filter(([, v]) => v !== "" && v !== "false"));
    sent.set("desc", String(state.desc));
    const mine = ++state.request;
    const data = await api(`/rollouts?${sent}`);
    if (mine === state.request) renderRollouts(data, state, load, sent.toString());  // an older, slower answer is dropped
  };
  const reload = (delay) => { clearTimeout(debounce); state.offset = 0; debounce = setTimeout(load, delay); };
  const typed = (target) => target.tagName === "INPUT" && target.type !== "checkbox";
  form.addEventListener("input", (event) => typed(event.target) && reload(120));  // typing: wait for a pause
  form.addEventListener("change", (event) => typed(event.target) || reload(0));  // a click: at once
  form.addEventListener("submit", (event) => event.preventDefault());
  await load();
}

function sortHeader(label, key, state, cls = "") {
  const sorted = state.sort === key ? ` sorted ${state.desc ? "" : "asc"}` : "";
  return `<th class="sortable${sorted} ${cls}" data-sort="${key}">${label}</th>`;
}

function pager(data, state, load) {
  const last = Math.min(data.offset + data.rows.length, data.total);
  const html = `<div class="pager"><button data-go="-1" ${data.offset ? "" : "disabled"}>previous</button>
    <span id="range">${data.total ? data.offset + 1 : 0}–${last} of ${data.total.toLocaleString()}${data.more ? "+" : ""}</span>
    <button data-go="1" ${last < data.total ? "" : "disabled"}>next</button></div>`;
  const wire = (root) => root.querySelectorAll("[data-go]").forEach((b) => b.addEventListener("click", () => {
    state.offset = Math.max(0, state.offset + Number(b.dataset.go) * data.limit);
    load();
  }));
  return [html, wire];
}

function wireSorting(root, state, load) {
  root.querySelectorAll("th.sortable").forEach((th) => th.addEventListener("click", () => {
    state.desc = state.sort === th.dataset.sort ? !state.desc : true;
    state.sort = th.dataset.sort;
    state.offset = 0;
    load();
  }));
  root.querySelectorAll("tr.link").forEach((tr) => tr.addEventListener("click", () => { location.hash = tr.dataset.href; }));
}

function renderRollouts(data, state, load, sent) {
  const rows = data.rows.map((r) => `<tr class="link" data-href="#/rollout/${encodeURIComponent(r.rollout_id)}"
    data-rollout="${esc(r.rollout_id)}"><td>${esc(r.rollout_id)}</td><td>${badge(r.status)}</td><td>${esc(r.task_id)}</td>
    <td>${esc(r.group_id)}</td><td class="num">${r.attempt}/${r.max_attempts}</td><td class="num">${num(r.final_reward)}</td>
    <td class="num">${r.n_calls ?? ""}${r.missed_by_capture ?
    ` ${missedBadge(`${r.missed_by_capture} missed by capture`)}` : ""}</td><td>${esc(r.model_version)}</td>
    <td class="num">${seconds(r.started, r.ended)}</td><td>${time(r.ended)}</td>
    <td>${esc(r.error_type ? `${r.error_type}: ${r.error}` : "")}</td></tr>`);
  const [pagerHtml, wirePager] = pager(data, state, load);
  const table = document.getElementById("table");
  table.innerHTML = `${pagerHtml}<table id="rollouts" data-query="${esc(sent)}"><thead><tr>${sortHeader("rollout", "created", state)}<th>status</th>
    <th>task</th><th>group</th>${sortHeader("attempt", "attempt", state, "num")}${sortHeader("reward", "reward", state, "num")}
    ${sortHeader("calls", "calls", state, "num")}<th>model</th>${sortHeader("duration", "duration", state, "num")}
    ${sortHeader("ended", "ended", state)}<th>error</th></tr></thead>
    <tbody>${rows.join("") || '<tr><td colspan="11" class="empty">no rollout matches</td></tr>'}</tbody></table>`;
  wirePager(table);
  wireSorting(table, state, load);
}

// Calls the proxy served that in-process capture missed: kept from the proxy's record, without role or tool calls.
const missedBadge = (label) => `<span class="badge missed"
  title="served by the proxy, not captured in-process: kept without role or tool calls">${esc(label)}</span>`;

function message(m) {
  const role = m.role || m.type || "message";
  const content = typeof m.content === "string" ? m.content : m.content == null ? "" : json(m.content);
  const calls = (m.tool_calls || []).map((t) => `\n→ ${t.function ? `${t.function.name}(${t.function.arguments})` : json(t)}`);
  return `<div class="msg ${esc(role)}"><span class="who">${esc(role)}${m.name ? " · " + esc(m.name) : ""}</span>${esc(content)}${esc(calls.join(""))}</div>`;
}

function callCard(call, rewards, shown) {
  const meta = call.metadata || {};
  const own = rewards.filter((r) => r.call_id === call.call_id);
  const parts = [`#${call.sequence}`, `<b>${esc(call.kind)}</b>`, `role ${esc(call.role ?? "—")}`, esc(call.name), badge(call.status),
    `latency ${seconds(call.start_time, call.end_time)}`];
  if (meta.missed_by_capture) parts.push(missedBadge("missed by capture"));
  if (call.kind === "llm") {
    parts.push(`tokens ${call.prompt_tokens ?? "?"} + ${call.completion_tokens ?? "?"} (${esc(call.token_source ?? "none")})`,
      `model ${esc(meta.model_version ?? "?")}`);
    if (call.mean_logprob !== null) parts.push(`mean logprob ${num(call.mean_logprob)}`);
  }
  let body = "";
  if (call.kind === "llm" && Array.isArray(call.input)) {
    const fresh = call.input.length > shown ? call.input.slice(shown) : call.input;
    body += fresh.map(message).join("");
    if (fresh.length < call.input.length) body += `<details><summary>full prompt (${call.input.length} messages)</summary>${call.input.map(message).join("")}</details>`;
    if (call.output) body += message({role: "assistant", ...(typeof call.output === "string" ? {content: call.output} : call.output)});
  } else {
    body += `<div class="msg tool"><span class="who">arguments</span>${esc(json(call.input))}</div>`;
    if (call.output !== null && call.output !== undefined) body += `<div class="msg tool"><span class="who">result</span>${esc(json(call.output))}</div>`;
  }
  if (call.error) body += `<p class="error-box call-error">${esc(call.error)}</p>`;
  const marks = own.map((r) => `<span class="reward">${esc(r.source)}${r.name ? " " + esc(r.name) : ""}: ${num(r.value)}</span>`).join("");
  return `<div class="card ${esc(call.kind)} status-${esc(call.status)}${meta.missed_by_capture ? " missed" : ""}" data-call="${call.sequence}">
    <div class="meta">${parts.join("<span>·</span>")}</div>${marks ? `<div>${marks}</div>` : ""}${body}</div>`;
}

function conversation(calls, rewards) {
  let shown = 0;
  return calls.map((call) => {
    const html = callCard(call, rewards, shown);
    if (call.kind === "llm" && Array.isArray(call.input)) shown = call.input.length + 1;
    return html;
  }).join("") || '<p class="empty">no calls recorded</p>';
}

// The proxy served LLM calls that in-process capture missed: the counts, then the note with the cause and the fix.
function captureGapBlock(gap) {
  if (!gap) return "";
  return `<div class="warning-box" id="capture-gap"><b>In-process capture missed ${gap.missed} of the
    ${plural(gap.served, "LLM call")} the proxy served</b> (recorded ${gap.captured}; the missed ones are marked
    "missed by capture" below)<p>${esc(gap.note)}</p></div>`;
}

function errorBlock(error) {
  if (!error) return "";
  return `<div class="error-box"><b>${esc(error.type)}</b>: ${esc(error.message)}
    ${error.traceback ? `<pre class="traceback">${esc(error.traceback)}</pre>` : ""}</div>`;
}

async function rolloutPage([id]) {
  const r = await api(`/rollouts/${encodeURIComponent(id)}`);
  const live = r.status === "queued" || r.status === "running";  // no result yet: the current attempt's calls
  const calls = live && !r.calls.length ? (r.attempts.at(-1) || {calls: []}).calls : r.calls;
  // The capture gap's note has its own box above: not repeated among the other diagnostics.
  const diagnostics = (r.diagnostics || []).filter((d) => !(r.capture_gap && d.endsWith(r.capture_gap.note)));
  const episode = r.rewards.filter((x) => !x.call_id).map((x) => `<span class="reward">${esc(x.source)}${x.name ? " " + esc(x.name) : ""}: ${num(x.value)}</span>`);
  const attempts = r.attempts.map((a) => `<tr data-attempt="${a.attempt}"><td>${a.attempt}</td><td>${badge(a.status)}</td>
    <td>${esc(a.worker_id)}</td><td>${time(a.started)}</td><td>${seconds(a.started, a.ended)}</td><td>${errorBlock(a.error)}
    ${a.logs.length ? `<details><summary>${a.logs.length} log lines</summary><pre>${esc(a.logs.join("\n"))}</pre></details>` : ""}
    ${a.calls.length ? `<details><summary>${a.calls.length} calls of this attempt</summary>${conversation(a.calls, [])}</details>` : ""}
    </td></tr>`);
  page.innerHTML = `<h2>Rollout ${esc(r.rollout_id)} ${badge(r.status)}</h2>
    <table class="kv"><tbody>
    <tr><td>task</td><td><a href="#/task/${encodeURIComponent(r.task_id)}">${esc(r.task_id)}</a></td></tr>
    <tr><td>group</td><td><a href="#/rollouts?group_id=${encodeURIComponent(r.group_id || "")}">${esc(r.group_id)}</a></td></tr>
    <tr><td>attempt</td><td>${r.attempt} of ${r.max_attempts}</td></tr><tr><td>model version</td><td>${esc(r.model_version)}</td></tr>
    <tr><td>final reward</td><td id="final-reward">${num(r.final_reward)} ${episode.join("")}</td></tr>
    <tr><td>worker</td><td>${esc(r.worker_id || (r.attempts.at(-1) || {}).worker_id)}</td></tr><tr><td>duration</td><td>${seconds(r.started, r.ended)}</td></tr>
    <tr><td>trainable roles</td><td>${esc((r.trainable_roles || ["all"]).join(", "))}</td></tr></tbody></table>
    ${errorBlock(r.error)}${captureGapBlock(r.capture_gap)}
    ${diagnostics.length ? `<h3>Diagnostics</h3><pre>${esc(diagnostics.join("\n"))}</pre>` : ""}
    <h3>Task</h3><pre>${esc(json(r.task))}</pre>
    <h3>Calls${live ? " so far (as the proxy records them)" : ""}</h3><div id="calls">${conversation(calls, r.rewards)}</div>
    ${r.output !== null && r.output !== undefined ? `<h3>Output</h3><pre>${esc(json(r.output))}</pre>` : ""}
    <h3>Attempts</h3><table id="attempts"><thead><tr><th>#</th><th>status</th><th>worker</th><th>started</th><th>took</th>
    <th>error, logs, calls</th></tr></thead><tbody>${attempts.join("")}</tbody></table>
    ${(r.logs || []).length ? `<h3>Logs</h3><pre id="logs">${esc(r.logs.join("\n"))}</pre>` : ""}`;
  if (live) timer = setInterval(route, 2000);
}

async function tasksPage(_, params) {
  const state = {sort: params.get("sort") || "last", desc: params.get("desc") !== "0", offset: +(params.get("offset") || 0)};
  page.innerHTML = `<h2>Tasks</h2><div id="table"></div>`;
  const load = async () => {
    setQuery("tasks", new URLSearchParams({sort: state.sort, desc: state.desc ? "1" : "0", offset: String(state.offset)}));
    const data = await api(`/tasks?sort=${state.sort}&desc=${state.desc}&offset=${state.offset}`);
    const rows = data.rows.map((t) => `<tr class="link" data-href="#/task/${encodeURIComponent(t.task_id)}"><td>${esc(t.task_id)}</td>
      <td class="num">${t.n}</td><td class="num">${t.groups}</td><td class="num">${num(t.mean_reward)}</td><td class="num">${t.failed}</td></tr>`);
    const [pagerHtml, wirePager] = pager(data, state, load);
    const table = document.getElementById("table");
    table.innerHTML = `${pagerHtml}<table id="tasks"><thead><tr>${sortHeader("task", "task", state)}${sortHeader("rollouts", "rollouts", state, "num")}
      <th class="num">groups</th>${sortHeader("mean reward", "reward", state, "num")}<th class="num">failed</th></tr></thead>
      <tbody>${rows.join("") || '<tr><td colspan="5" class="empty">no tasks</td></tr>'}</tbody></table>`;
    wirePager(table);
    wireSorting(table, state, load);
  };
  await load();
}

function rewardColour(value) {
  if (value === null || value === undefined) return "#ddd";
  const v = Math.max(0, Math.min(1, value));
  return `hsl(${Math.round(v * 120)}, 70%, 75%)`;
}

async function taskPage([id], params) {
  const offset = +(params.get("offset") || 0);
  const data = await api(`/tasks/${encodeURIComponent(id)}?offset=${offset}`);
  const groups = data.groups.map((g) => {
    const rewards = g.rollouts.map((r) => r.final_reward).filter((v) => v !== null);
    const mean = rewards.length ? rewards.reduce((a, b) => a + b, 0) / rewards.length : null;
    const cells = g.rollouts.map((r) => `<a class="cell" href="#/rollout/${encodeURIComponent(r.rollout_id)}"
      style="background:${rewardColour(r.final_reward)}" title="${esc(r.status)} · ${esc(r.answer || "")}">${r.final_reward === null ? esc(r.status) : num(r.final_reward, 2)}</a>`);
    const versions = [...new Set(g.rollouts.map((r) => r.model_version))].join(", ");
    const answers = g.rollouts.map((r) => `<div class="msg assistant">${esc(r.answer || "(no answer)")}</div>`).join("");
    return `<tr class="group"><td>${esc(g.group_id)}</td><td>${esc(versions)}</td><td class="num">${num(mean)}</td>
      <td>${cells.join("")}<details><summary>answers</summary>${answers}</details></td></tr>`;
  });
  const trend = data.groups.slice().reverse().map((g, i) => {
    const rewards = g.rollouts.map((r) => r.final_reward).filter((v) => v !== null);
    return [i + 1, rewards.length ? rewards.reduce((a, b) => a + b, 0) / rewards.length : null];
  }).filter((p) => p[1] !== null);
  page.innerHTML = `<h2>Task ${esc(data.task_id)}</h2><pre>${esc(json(data.task))}</pre>
    <div class="charts">${lineChart("group mean reward (oldest → newest)", trend)}</div>
    <h3>Groups (${data.total}, newest first)</h3><table id="groups"><thead><tr><th>group</th><th>model version</th>
    <th class="num">mean</th><th>rewards of its rollouts</th></tr></thead><tbody>${groups.join("")}</tbody></table>
    <div class="pager">${offset ? `<a href="#/task/${encodeURIComponent(id)}?offset=${Math.max(0, offset - 20)}">newer</a>` : ""}
    ${offset + 20 < data.total ? `<a href="#/task/${encodeURIComponent(id)}?offset=${offset + 20}">older</a>` : ""}</div>`;
}

window.addEventListener("hashchange", route);
route();
