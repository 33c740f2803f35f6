// The engine's status page. Everything comes from this engine's origin:
// GET /status (the provisioners, their outstanding jobs with Slurm's
// state, the attached workers) and GET /v1/events (what happens, as it
// happens). Nothing is fetched from anywhere else, and every value from
// the engine is put in the page as text, never as markup.
"use strict";

const MAX_TIMELINE = 500;
const MAX_FAILURES = 20;
const MAX_JOBS = 200;
const MAX_BARS = 30;
const MAX_NEEDS = 200;
const MAX_WORKERS = 200;
// Jobs the page remembers beyond those outstanding: the newest ended
// ones, for their last state.
const KEEP_ENDED_JOBS = 200;

const jobs = new Map();        // job id -> {job, provisioner, profile, worker, state, slurm, since}
const provisionedAt = new Map(); // worker -> Date of worker_provisioned
const attachTimes = [];        // {worker, seconds}
const failures = [];           // newest first: {time, text}
let statusTimer = null;
let firstStatus = true;
// What changed since the last frame: events arrive by the thousand a
// second with 10,000 workers, and the page redraws a table once a frame,
// not once an event.
const dirty = { jobs: false, chart: false, failures: false };
let frameAsked = false;

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else e.setAttribute(k, v);
  }
  for (const c of children) {
    e.append(c instanceof Node ? c : document.createTextNode(c == null ? "" : String(c)));
  }
  return e;
}

function age(seconds) {
  if (seconds < 60) return Math.round(seconds) + "s";
  if (seconds < 3600) return Math.floor(seconds / 60) + "m" + String(Math.round(seconds % 60)).padStart(2, "0") + "s";
  return Math.floor(seconds / 3600) + "h" + String(Math.floor((seconds % 3600) / 60)).padStart(2, "0") + "m";
}

// One formatter for every time shown: toLocaleTimeString builds a new
// one each call, about a millisecond, which on 1,000 events replayed at
// connect, or 10,000 workers listed, held the page for seconds.
const timeFormat = new Intl.DateTimeFormat([], { hour: "2-digit", minute: "2-digit", second: "2-digit", hour12: false });

function clock(t) {
  return timeFormat.format(new Date(t));
}

// -- status ---------------------------------------------------------------

async function refreshStatus() {
  let st;
  try {
    const resp = await fetch("/status", { cache: "no-store" });
    if (!resp.ok) return;
    st = await resp.json();
  } catch (e) {
    return; // the engine is away; the event stream says so
  }
  document.getElementById("engine-id").textContent = st.engine_id || "";
  const cv = st.config || {};
  document.getElementById("config-version").textContent =
    cv.generation ? "configuration " + cv.generation + (cv.digest ? " · " + cv.digest : "") : "";
  renderProvisioners(st.provisioners || [], st.held_back || []);
  const now = Date.now();
  const seen = new Set();
  for (const p of st.provisioners || []) {
    for (const o of (p.status && p.status.outstanding) || []) {
      if (!o.job) continue;
      seen.add(o.job);
      const j = jobs.get(o.job) || { job: o.job, provisioner: p.name, profile: o.profile, worker: o.worker, state: "" };
      j.slurm = o.state || "";
      j.since = j.since || new Date(now - o.age_seconds * 1000);
      jobs.set(o.job, j);
    }
  }
  forgetEndedJobs(seen);
  renderJobs();
  renderWorkers(st.workers || []);
  renderNeeds(st.needs || []);
  if (firstStatus) {
    firstStatus = false;
    // After the frame that shows it: the time the page took to show the
    // engine's state, which the benchmarks read (performance.mark).
    requestAnimationFrame(() => requestAnimationFrame(() => performance.mark("fluksio-status-shown")));
  }
}

// forgetEndedJobs keeps the jobs still outstanding and the newest ended
// ones: over a long run the page would otherwise remember every job the
// engine ever asked for.
function forgetEndedJobs(outstanding) {
  if (jobs.size <= outstanding.size + 2 * KEEP_ENDED_JOBS) return;
  const ended = [...jobs.values()].filter((j) => !outstanding.has(j.job))
    .sort((a, b) => (b.since || 0) - (a.since || 0));
  for (const j of ended.slice(KEEP_ENDED_JOBS)) jobs.delete(j.job);
}

// renderNeeds lists the needs not yet served, each with why it waits
// (the engine's typed reason) and the provisioners' own words; a count
// by reason heads the list, so a thousand waiting needs read as one line.
function renderNeeds(needs) {
  const open = needs.filter((n) => n.state !== "served");
  const byReason = new Map();
  for (const n of open) {
    const r = n.state === "waiting" ? (n.reason || "unknown") : n.state;
    byReason.set(r, (byReason.get(r) || 0) + 1);
  }
  const summary = document.getElementById("needs-summary");
  summary.replaceChildren();
  const served = needs.length - open.length;
  summary.append(el("span", {}, served + " served"));
  for (const [r, n] of [...byReason.entries()].sort()) {
    summary.append(" · ", el("span", { class: "reason reason-" + r, "data-reason": r }, n + " " + r.replace(/_/g, " ")));
  }
  const tb = document.querySelector("#needs tbody");
  tb.replaceChildren();
  for (const n of open.slice(0, MAX_NEEDS)) {
    const r = n.state === "waiting" ? (n.reason || "") : "";
    tb.append(el("tr", { "data-need": n.id, "data-reason": r },
      el("td", {}, n.id), el("td", {}, n.spec), el("td", {}, n.state),
      el("td", { class: "reason reason-" + r }, r.replace(/_/g, " ")), el("td", {}, n.detail || "")));
  }
}

// scheduleStatus refreshes soon, once however many events ask for it.
function scheduleStatus() {
  if (statusTimer) return;
  statusTimer = setTimeout(() => { statusTimer = null; refreshStatus(); }, 200);
}

function renderProvisioners(provs, heldBack) {
  const box = document.getElementById("provisioners");
  box.replaceChildren();
  if (provs.length === 0) box.append(el("p", { class: "empty" }, "none configured"));
  for (const p of provs) {
    const up = p.phase === "running";
    const div = el("div", { class: "prov", "data-provisioner": p.name },
      el("strong", {}, p.name), " (" + p.kind + ") ",
      el("span", { class: up ? "up" : "down" }, p.process || "unknown"));
    if (p.error) div.append(el("div", { class: "down" }, p.error));
    const s = p.status;
    if (s) {
      const t = el("table", {}, el("thead", {}, el("tr", {},
        el("th", {}, "profile"), el("th", {}, "pending"), el("th", {}, "starting"), el("th", {}, "attached"), el("th", {}, "backing off"))));
      const tb = el("tbody");
      for (const c of s.counts || []) {
        const b = (s.backing_off || []).find((x) => x.profile === c.profile);
        tb.append(el("tr", { "data-profile": c.profile },
          el("td", {}, c.profile), el("td", { class: "pending" }, c.pending), el("td", { class: "starting" }, c.starting),
          el("td", { class: "attached" }, c.attached),
          el("td", {}, b ? b.failures + " failure(s), until " + clock(b.until) : "")));
      }
      t.append(tb);
      div.append(t);
      if (s.last_error) div.append(el("div", { class: "hint" }, "last error: " + s.last_error));
      for (const n of s.notes || []) div.append(el("div", { class: "hint" }, n));
    }
    // The engine's own backoff, whatever the plugin (or its status) says.
    for (const h of heldBack.filter((x) => x.provisioner === p.name && x.held)) {
      div.append(el("div", { class: "down", "data-held": h.profile },
        "engine holds " + h.profile + " back: " + h.failures + " failure(s) in a row, until " + clock(h.until) + " (" + h.last_error + ")"));
    }
    box.append(div);
  }
}

function renderJobs() {
  dirty.jobs = false;
  const rows = [...jobs.values()].sort((a, b) => (b.since || 0) - (a.since || 0)).slice(0, MAX_JOBS);
  const tb = document.querySelector("#jobs tbody");
  tb.replaceChildren();
  const now = Date.now();
  for (const j of rows) {
    const state = j.state || j.slurm || "submitted";
    tb.append(el("tr", { "data-job": j.job, "data-worker": j.worker || "" },
      el("td", {}, j.job), el("td", {}, j.provisioner || ""), el("td", {}, j.profile || ""), el("td", {}, j.worker || ""),
      el("td", { class: "state state-" + state }, state),
      el("td", {}, j.since ? age((now - j.since) / 1000) : "")));
  }
}

// renderWorkers lists the first MAX_WORKERS attached workers by name,
// under a count of all of them, busy and idle.
function renderWorkers(workers) {
  const busy = workers.filter((w) => w.task).length;
  const summary = document.getElementById("workers-summary");
  summary.dataset.count = workers.length;
  summary.textContent = workers.length + " attached: " + busy + " busy, " + (workers.length - busy) + " idle" +
    (workers.length > MAX_WORKERS ? "; the first " + MAX_WORKERS + " by name shown" : "");
  const tb = document.querySelector("#workers tbody");
  tb.replaceChildren();
  for (const w of workers.slice(0, MAX_WORKERS)) {
    tb.append(el("tr", { "data-worker": w.name, "data-job": w.job_id || "" },
      el("td", {}, w.name), el("td", {}, w.provisioner), el("td", {}, w.hostname), el("td", {}, w.job_id),
      el("td", {}, w.cpus), el("td", {}, w.gpus), el("td", {}, w.task || "idle"), el("td", {}, clock(w.attached_at)),
      el("td", { "class": "time-left" }, w.time_left || "")));
  }
}

// -- events ---------------------------------------------------------------

function onEvent(ev) {
  const t = new Date(ev.time);
  const j = ev.job ? (jobs.get(ev.job) || { job: ev.job, provisioner: ev.provisioner, profile: ev.profile, worker: ev.worker, state: "", since: t }) : null;
  switch (ev.kind) {
    case "worker_provisioned":
      provisionedAt.set(ev.worker, t);
      break;
    case "worker_attached":
      if (j) j.state = "attached";
      if (provisionedAt.has(ev.worker)) {
        attachTimes.push({ worker: ev.worker, seconds: (t - provisionedAt.get(ev.worker)) / 1000 });
        attachTimes.splice(0, Math.max(0, attachTimes.length - MAX_BARS));
        provisionedAt.delete(ev.worker);
        dirty.chart = true;
      }
      break;
    case "worker_provision_failed":
      provisionedAt.delete(ev.worker);
      if (j) j.state = "failed";
      addFailure(t, (ev.provisioner || "") + "/" + (ev.profile || "") + (ev.job ? " job " + ev.job : "") + ": " + (ev.detail || "failed"));
      break;
    case "worker_cancelled":
      provisionedAt.delete(ev.worker);
      if (j) j.state = "cancelled";
      break;
    case "worker_detached":
    case "worker_gone":
    case "worker_dropped":
      if (j) j.state = ev.kind.slice("worker_".length);
      if (ev.kind !== "worker_detached") addFailure(t, (ev.worker || "") + " " + ev.kind.slice(7) + ": " + (ev.detail || ""));
      break;
    case "plugin_down":
      addFailure(t, (ev.provisioner || "") + ": " + (ev.detail || "plugin down"));
      break;
  }
  if (j && (ev.kind.startsWith("worker_"))) {
    j.worker = j.worker || ev.worker;
    j.profile = j.profile || ev.profile;
    jobs.set(ev.job, j);
  }
  addTimeline(ev);
  dirty.jobs = true;
  askFrame();
  scheduleStatus();
}

// askFrame redraws what events changed, once, at the next frame.
function askFrame() {
  if (frameAsked) return;
  frameAsked = true;
  requestAnimationFrame(() => {
    frameAsked = false;
    if (dirty.jobs) renderJobs();
    if (dirty.chart) renderChart();
    if (dirty.failures) renderFailures();
    dirty.jobs = dirty.chart = dirty.failures = false;
  });
}

function addFailure(t, text) {
  failures.unshift({ time: t, text: text });
  failures.length = Math.min(failures.length, MAX_FAILURES);
  dirty.failures = true;
  askFrame();
}

function renderFailures() {
  const ul = document.getElementById("failures");
  ul.replaceChildren(...failures.map((f) => el("li", {}, clock(f.time) + " " + f.text)));
}

function addTimeline(ev) {
  const ol = document.getElementById("timeline");
  const parts = [ev.provisioner, ev.profile, ev.job && "job " + ev.job, ev.worker, ev.task, ev.detail].filter(Boolean);
  ol.prepend(el("li", { class: "k-" + ev.kind, "data-seq": ev.seq },
    clock(ev.time) + " ", el("span", { class: "kind" }, ev.kind), " " + parts.join(" · ")));
  while (ol.children.length > MAX_TIMELINE) ol.lastChild.remove();
}

function renderChart() {
  const svg = document.getElementById("tta-chart");
  const NS = "http://www.w3.org/2000/svg";
  const data = attachTimes.slice(-MAX_BARS);
  svg.replaceChildren();
  if (data.length === 0) return;
  const max = Math.max(...data.map((d) => d.seconds), 1);
  const w = 24, h = 110;
  data.forEach((d, i) => {
    const bh = Math.max(1, (d.seconds / max) * h);
    const r = document.createElementNS(NS, "rect");
    r.setAttribute("x", 4 + i * w); r.setAttribute("y", 4 + h - bh);
    r.setAttribute("width", w - 4); r.setAttribute("height", bh);
    const title = document.createElementNS(NS, "title");
    title.textContent = d.worker + ": " + d.seconds.toFixed(1) + "s";
    r.append(title);
    const label = document.createElementNS(NS, "text");
    label.setAttribute("x", 4 + i * w); label.setAttribute("y", h + 18);
    label.textContent = d.seconds.toFixed(1);
    svg.append(r, label);
  });
}

function connect() {
  const conn = document.getElementById("conn");
  const es = new EventSource("/v1/events");
  es.onopen = () => { conn.dataset.state = "live"; conn.textContent = "live"; };
  es.onerror = () => { conn.dataset.state = "reconnecting"; conn.textContent = "reconnecting…"; };
  es.onmessage = (m) => {
    let ev;
    try { ev = JSON.parse(m.data); } catch (e) { return; }
    onEvent(ev);
  };
}

refreshStatus();
connect();
// Slurm's states and the ages change without an event.
setInterval(refreshStatus, 2000);
