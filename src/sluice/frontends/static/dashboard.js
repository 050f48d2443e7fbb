// sluice dashboard: polls /dashboard/data, draws the models table, the charts (Chart.js) and
// the control events; the controls call the repository API with the operator's key (if any).
"use strict";

const KEY_STORE = "sluice.dashboard.key";
const POINTS = 60; // points kept per time series
const COLORS = ["#2f6fde", "#d9480f", "#2b8a3e", "#ae3ec9", "#e8590c", "#1098ad", "#5c940d", "#c2255c"];

const state = {
  prev: null, // the previous snapshot: rates and percentiles are over the interval between two
  timer: null,
  charts: {},
  labels: [],
  lastModelsKey: "",
};

const $ = (sel) => document.querySelector(sel);
const el = (tag, attrs = {}, ...children) => {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c instanceof Node ? c : String(c));
  return node;
};

function headers(extra = {}) {
  const key = $("#key").value.trim();
  return key ? { ...extra, Authorization: `Bearer ${key}` } : extra;
}

async function api(method, path, body) {
  const init = { method, headers: headers(body ? { "Content-Type": "application/json" } : {}) };
  if (body !== undefined) init.body = JSON.stringify(body);
  const resp = await fetch(path, init);
  const text = await resp.text();
  if (!resp.ok) {
    let msg = text;
    try { msg = JSON.parse(text).error || text; } catch (e) { /* not JSON */ }
    throw new Error(`${resp.status}: ${msg || resp.statusText}`);
  }
  return text ? JSON.parse(text) : {};
}

function say(text, bad = false) {
  const s = $("#status");
  s.textContent = text;
  s.className = bad ? "bad" : "";
}

async function control(what, path, body) {
  say(`${what}…`);
  try {
    await api("POST", path, body);
    say(`${what}: done`);
  } catch (e) {
    say(`${what}: ${e.message}`, true);
  }
  poll();
}

const enc = encodeURIComponent;

function controls(m) {
  const base = `/v2/repository/models/${enc(m.name)}`;
  const cell = el("td");
  if (m.version) {
    cell.append(
      el("button", { "data-action": "unload-version", onclick: () =>
        control(`unload ${m.name} v${m.version}`, `${base}/versions/${enc(m.version)}/unload`) }, "unload v" + m.version),
      el("button", { "data-action": "load-version", onclick: () =>
        control(`load ${m.name} v${m.version}`, `${base}/versions/${enc(m.version)}/load`) }, "reload v" + m.version),
    );
  }
  cell.append(
    el("button", { "data-action": "load", "data-model": m.name, onclick: () =>
      control(`load ${m.name}`, `${base}/load`) }, m.state === "READY" ? "reload" : "load"),
    el("button", { "data-action": "unload", "data-model": m.name, onclick: () =>
      control(`unload ${m.name}`, `${base}/unload`) }, "unload"),
  );
  return cell;
}

function trafficCell(m, traffic) {
  const cell = el("td");
  if (!m.version || m.state !== "READY") return cell;
  const weights = traffic[m.name] || {};
  const input = el("input", { class: "traffic", placeholder: "1:90,2:10",
    value: Object.entries(weights).map(([v, w]) => `${v}:${w}`).join(",") });
  const set = el("button", { "data-action": "traffic", onclick: () => {
    const doc = {};
    for (const part of input.value.split(",").map((p) => p.trim()).filter(Boolean)) {
      const [v, w] = part.split(":");
      doc[v.trim()] = Number(w);
    }
    control(`traffic ${m.name}`, `/v2/repository/models/${enc(m.name)}/traffic`, { weights: doc });
  } }, "set");
  cell.append(input, set);
  return cell;
}

function drawModels(snap) {
  // Rebuilt only when something changed, so that a traffic field being edited is kept.
  const key = JSON.stringify([snap.models, snap.traffic]);
  if (key === state.lastModelsKey) return;
  state.lastModelsKey = key;
  const shown = new Set();
  const body = $("#models tbody");
  body.replaceChildren();
  for (const m of snap.models) {
    // the traffic field is per model: shown on its first READY version row only
    const traffic = shown.has(m.name) ? {} : snap.traffic;
    const tcell = shown.has(m.name) ? el("td") : trafficCell(m, traffic);
    if (m.version && m.state === "READY") shown.add(m.name);
    body.append(el("tr", { "data-model": m.name, "data-version": m.version, "data-state": m.state || "" },
      el("td", {}, m.name), el("td", {}, m.version || "—"),
      el("td", { class: m.state || "" }, m.state || "not loaded"), el("td", {}, m.reason || ""),
      el("td", {}, m.instances || ""), tcell, controls(m)));
  }
}

function drawEvents(snap) {
  const body = $("#events tbody");
  body.replaceChildren();
  for (const e of snap.events.slice(0, 20)) {
    body.append(el("tr", {}, el("td", {}, new Date(e.time_ms).toLocaleTimeString()),
      el("td", {}, e.action), el("td", {}, e.model), el("td", {}, e.version || ""),
      el("td", { class: e.ok ? "" : "bad" }, e.ok ? ("ok " + (e.message || "")) : e.message)));
  }
}

// -------------------------------------------------------------------------- charts
function lineChart(id, unit) {
  return new Chart($(id), {
    type: "line",
    data: { labels: [], datasets: [] },
    options: {
      animation: false, maintainAspectRatio: false, spanGaps: true,
      elements: { point: { radius: 0 } },
      scales: { y: { beginAtZero: true, title: { display: !!unit, text: unit } } },
      plugins: { legend: { position: "bottom", labels: { boxWidth: 12 } } },
    },
  });
}

function barChart(id, stacked) {
  return new Chart($(id), {
    type: "bar",
    data: { labels: [], datasets: [] },
    options: {
      animation: false, maintainAspectRatio: false,
      scales: { x: { stacked }, y: { stacked, beginAtZero: true } },
      plugins: { legend: { position: "bottom", labels: { boxWidth: 12 } } },
    },
  });
}

function series(chart, label, value, i) {
  let ds = chart.data.datasets.find((d) => d.label === label);
  if (!ds) {
    const color = COLORS[chart.data.datasets.length % COLORS.length];
    ds = { label, data: Array(Math.max(chart.data.labels.length - 1, 0)).fill(null),
      borderColor: color, backgroundColor: color, borderWidth: 2, tension: 0.2 };
    chart.data.datasets.push(ds);
  }
  ds.data[i] = value;
}

// The q-quantile (ms) of a histogram delta over BUCKETS_US (upper bounds; one +Inf bucket).
function quantile(counts, bounds, q) {
  const total = counts.reduce((a, b) => a + b, 0);
  if (!total) return null;
  const want = q * total;
  let acc = 0;
  for (let i = 0; i < counts.length; i++) {
    if (acc + counts[i] >= want && counts[i] > 0) {
      const lo = i === 0 ? 0 : bounds[i - 1];
      const hi = i < bounds.length ? bounds[i] : bounds[bounds.length - 1];
      return (lo + (hi - lo) * ((want - acc) / counts[i])) / 1000;
    }
    acc += counts[i];
  }
  return bounds[bounds.length - 1] / 1000;
}

function drawCharts(snap, prev) {
  const c = state.charts;
  const dt = (snap.time_ms - prev.time_ms) / 1000;
  if (dt <= 0) return;
  const label = new Date(snap.time_ms).toLocaleTimeString();
  const before = new Map(prev.stats.map((s) => [`${s.model}/${s.version}`, s]));
  for (const chart of [c.throughput, c.latency, c.queue]) {
    chart.data.labels.push(label);
    if (chart.data.labels.length > POINTS) {
      chart.data.labels.shift();
      for (const ds of chart.data.datasets) ds.data.shift();
    }
  }
  const i = c.throughput.data.labels.length - 1;
  for (const s of snap.stats) {
    const id = `${s.model}/${s.version}`;
    const p = before.get(id);
    if (!p) continue;
    series(c.throughput, id, (s.inference_count - p.inference_count) / dt, i);
    const delta = s.request_hist.map((n, k) => n - (p.request_hist[k] || 0));
    series(c.latency, `${id} p50`, quantile(delta, snap.buckets_us, 0.5), i);
    series(c.latency, `${id} p99`, quantile(delta, snap.buckets_us, 0.99), i);
    const nq = s.queue_count - p.queue_count;
    const nc = s.compute_count - p.compute_count;
    series(c.queue, `${id} queue`, nq ? (s.queue_ns - p.queue_ns) / nq / 1e6 : null, i);
    series(c.queue, `${id} compute`, nc ? (s.compute_ns - p.compute_ns) / nc / 1e6 : null, i);
  }
  for (const chart of [c.throughput, c.latency, c.queue]) {
    for (const ds of chart.data.datasets) while (ds.data.length < chart.data.labels.length) ds.data.push(null);
    chart.update("none");
  }
}

function drawTotals(snap) {
  // batch sizes and failures: cumulative since the server started
  const c = state.charts;
  const sizes = [...new Set(snap.stats.flatMap((s) => Object.keys(s.batch_sizes)))]
    .sort((a, b) => a - b);
  c.batch.data.labels = sizes;
  c.batch.data.datasets = snap.stats.filter((s) => Object.keys(s.batch_sizes).length).map((s, k) => ({
    label: `${s.model}/${s.version}`, data: sizes.map((b) => s.batch_sizes[b] || 0),
    backgroundColor: COLORS[k % COLORS.length] }));
  c.batch.update("none");
  const reasons = [...new Set(snap.stats.flatMap((s) => Object.keys(s.fail_reasons)))].sort();
  c.fail.data.labels = reasons.length ? reasons : ["(none)"];
  c.fail.data.datasets = snap.stats.filter((s) => s.fail).map((s, k) => ({
    label: `${s.model}/${s.version}`, data: reasons.map((r) => s.fail_reasons[r] || 0),
    backgroundColor: COLORS[k % COLORS.length] }));
  c.fail.update("none");
}

// -------------------------------------------------------------------------- polling
async function poll() {
  let snap;
  try {
    snap = await api("GET", "/dashboard/data");
  } catch (e) {
    $("#server").textContent = `unreachable or refused: ${e.message}`;
    $("#ready").className = "pill down";
    $("#ready").textContent = "?";
    return;
  }
  $("#server").textContent = `${snap.server.name} ${snap.server.version} · control ${snap.server.control_mode}`;
  $("#ready").className = snap.server.ready ? "pill" : "pill down";
  $("#ready").textContent = snap.server.ready ? "ready" : "not ready";
  drawModels(snap);
  drawEvents(snap);
  drawTotals(snap);
  if (state.prev) drawCharts(snap, state.prev);
  state.prev = snap;
  document.body.dataset.polls = String(Number(document.body.dataset.polls || 0) + 1);
}

function schedule() {
  if (state.timer) clearInterval(state.timer);
  state.timer = setInterval(poll, Number($("#interval").value));
}

function start() {
  const key = $("#key");
  key.value = sessionStorage.getItem(KEY_STORE) || "";
  key.addEventListener("change", () => { sessionStorage.setItem(KEY_STORE, key.value.trim()); poll(); });
  const params = new URLSearchParams(location.search);
  if (params.get("interval")) {
    const opt = el("option", { value: params.get("interval") }, `${params.get("interval")} ms`);
    $("#interval").append(opt);
    $("#interval").value = params.get("interval");
  }
  $("#interval").addEventListener("change", schedule);
  state.charts = {
    throughput: lineChart("#c-throughput", "inferences/s"),
    latency: lineChart("#c-latency", "ms"),
    queue: lineChart("#c-queue", "ms"),
    batch: barChart("#c-batch", false),
    fail: barChart("#c-fail", true),
  };
  poll();
  schedule();
}

start();
