// The engine's status page. Everything comes from this engine's origin:
// GET /status (the run's counts, the provisioners, their outstanding
// jobs with Slurm's state, the first rows of the tasks and workers) and
// GET /v1/events (what happens, as it happens). Nothing is fetched from
// anywhere else, and every value from the engine is put in the page as
// text, never as markup.
//
// It is built for a run of any size: the top says the run in one look
// (counts by state, a progress bar, the pace and the time left, the
// machines, what waits and why, and what needs a person), and every
// table shows its first MAX_ROWS rows with a count of the rest, so that
// every panel's heading is on the first screen at 10,000 tasks and the
// page loads at 100,000 queued: GET /status?limit= lists no more than
// the page draws, and counts the rest. Green is progress, grey the
// expected wait (a backlog under max_workers is "queued for a machine"),
// amber only what needs a person.
"use strict";

const MAX_ROWS = 100;
const MAX_TIMELINE = 200;
const MAX_FAILURES = 20;
const MAX_BARS = 30;
// Jobs the page remembers beyond those outstanding: the newest ended
// ones, for their last state.
const KEEP_ENDED_JOBS = 200;
// The pace is tasks ended over the last RATE_WINDOW ms of samples.
const RATE_WINDOW = 30000;
// Events ask for a new status at most this often (ms): with 16 workers
// a run of fast tasks sends hundreds a second.
const EVENT_REFRESH = 1000;

const jobs = new Map();        // job id -> {job, provisioner, profile, worker, state, slurm, since}
const provisionedAt = new Map(); // worker -> Date of worker_provisioned
const attachTimes = [];        // {worker, seconds}
const failures = [];           // newest first: {time, text}
const samples = [];            // {t, ended}: the pace's samples
let statusTimer = null;
let firstStatus = true;
// refreshing: a GET /status is on its way; refreshAgain: something
// asked for another meanwhile.
let refreshing = false;
let refreshAgain = false;
// filter is the state the tasks' table lists ("" for every one).
let filter = "";
// What changed since the last frame: events arrive by the thousand a
// second with 10,000 workers, and the page redraws a table once a frame,
// not once an event.
const dirty = { jobs: false, chart: false, failures: false };
let frameAsked = false;

// The tasks' states in the order the page shows them, and the needs'
// for a run without tasks (the stand-in's needs).
const TASK_STATES = ["waiting", "running", "succeeded", "failed", "timed_out", "cancelled", "lost"];
const NEED_STATES = ["waiting", "assigned", "served"];
// States of a task that a person should look at.
const ATTENTION_STATES = new Set(["failed", "timed_out", "cancelled", "lost"]);
// Why a need waits, in words; those in ATTENTION_REASONS need a person,
// the others are the expected queue or weather that clears by itself.
const REASON_WORDS = {
  capped: "queued for a machine",
  queued: "queued in the scheduler",
  site_limit: "held by a site limit",
  throttled: "throttled by the scheduler",
  cluster_full: "waiting for room in the cluster",
  not_asked: "not asked for yet",
  backing_off: "backing off (machines failed)",
  misconfigured: "misconfigured",
  login_needed: "a login is needed",
  no_fit: "no machine fits",
  provisioner_down: "its provisioner is down",
  error: "a provisioner's error",
};
const ATTENTION_REASONS = new Set(["misconfigured", "login_needed", "no_fit", "provisioner_down", "error", "backing_off"]);

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

const numberFormat = new Intl.NumberFormat("en");
function num(n) { return numberFormat.format(n || 0); }

function words(state) { return String(state || "").replace(/_/g, " "); }

// One formatter for every time shown: toLocaleTimeString builds a new
// one each call, about a millisecond, which on 1,000 events replayed at
// connect, or 10,000 workers listed, held the page for seconds.
const timeFormat = new Intl.DateTimeFormat([], { hour: "2-digit", minute: "2-digit", second: "2-digit", hour12: false });

function clock(t) {
  return timeFormat.format(new Date(t));
}

// -- status ---------------------------------------------------------------

async function refreshStatus() {
  if (refreshing) {
    // One more when this one is drawn: a filter chosen meanwhile shows.
    refreshAgain = true;
    return;
  }
  refreshing = true;
  let st;
  try {
    const q = "/status?limit=" + MAX_ROWS + (filter ? "&state=" + encodeURIComponent(filter) : "");
    const resp = await fetch(q, { cache: "no-store" });
    if (!resp.ok) return;
    st = await resp.json();
  } catch (e) {
    return; // the engine is away; the event stream says so
  } finally {
    refreshing = false;
    if (refreshAgain) {
      refreshAgain = false;
      setTimeout(refreshStatus, 0);
    }
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
  renderRun(st, now);
  renderTasks(st);
  renderWorkers(st);
  renderEndedChart(st);
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

// hasTasks says the run has tasks (Submit), not only needs.
function hasTasks(st) {
  return ((st.summary && st.summary.tasks && st.summary.tasks.submitted) || 0) > 0;
}

// stateCounts is each state's count, tasks' or needs'.
function stateCounts(st) {
  const sum = st.summary || {};
  if (hasTasks(st)) {
    const t = sum.tasks;
    return TASK_STATES.map((s) => [s, t[s] || 0]);
  }
  const n = sum.needs || {};
  return [["waiting", n.waiting || 0], ["assigned", n.assigned || 0], ["served", (n.served || 0) + (n.forgotten || 0)]];
}

// setFilter lists the tasks of state (or all, for "") and refreshes.
function setFilter(state) {
  filter = state === filter ? "" : state;
  refreshStatus();
}

// renderRun draws the top: counts by state (each a filter of the
// tasks' table), a progress bar, the pace and the time left, the
// machines, why what waits waits, and what needs a person.
function renderRun(st, now) {
  const sum = st.summary || {};
  const counts = stateCounts(st);
  const box = document.getElementById("counts");
  box.replaceChildren();
  for (const [s, n] of counts) {
    const attention = ATTENTION_STATES.has(s) && n > 0;
    if (n === 0 && (ATTENTION_STATES.has(s) || s === "assigned")) continue;
    const b = el("button", { type: "button", class: "count state-" + s + (attention ? " attention" : ""), "data-state": s,
      "data-count": n, "aria-pressed": String(filter === s) }, el("b", {}, num(n)), " " + words(s));
    b.addEventListener("click", () => setFilter(s));
    box.append(b);
  }

  // Progress: ended (or served) of all.
  let total, done, bad;
  if (hasTasks(st)) {
    const t = sum.tasks;
    total = t.submitted;
    bad = (t.failed || 0) + (t.timed_out || 0) + (t.cancelled || 0) + (t.lost || 0);
    done = (t.succeeded || 0) + bad;
  } else {
    const n = sum.needs || {};
    total = (n.waiting || 0) + (n.assigned || 0) + (n.served || 0) + (n.forgotten || 0);
    done = (n.served || 0) + (n.forgotten || 0);
    bad = 0;
  }
  const bar = document.getElementById("progress");
  bar.dataset.done = done;
  bar.dataset.total = total;
  bar.setAttribute("aria-valuenow", total ? Math.round(100 * done / total) : 0);
  bar.querySelector(".ok").style.width = (total ? 100 * (done - bad) / total : 0) + "%";
  bar.querySelector(".bad").style.width = (total ? 100 * bad / total : 0) + "%";
  let text = total ? num(done) + " of " + num(total) + (hasTasks(st) ? " tasks ended" : " needs served") + " (" + Math.floor(100 * done / total) + "%)" : "nothing asked for yet";
  const rate = pace(done, now, sum.tasks && sum.tasks.ended);
  if (rate > 0) {
    text += " · " + (rate >= 10 ? rate.toFixed(0) : rate.toFixed(1)) + (hasTasks(st) ? " tasks/s" : " needs/s");
    if (done < total) text += " · about " + age((total - done) / rate) + " left";
  }
  if (total && done === total) text += " · done";
  document.getElementById("progress-text").textContent = text;

  // Machines by state, and the slots in use: a worker is one slot.
  let pending = 0, starting = 0;
  for (const p of st.provisioners || []) {
    for (const c of (p.status && p.status.counts) || []) {
      pending += c.pending || 0;
      starting += c.starting || 0;
    }
  }
  const w = sum.workers || { attached: 0, busy: 0, idle: 0 };
  const m = document.getElementById("machines");
  m.dataset.attached = w.attached;
  m.dataset.busy = w.busy;
  m.dataset.cpus = w.cpus || 0;
  m.dataset.cpusBusy = w.cpus_busy || 0;
  m.textContent = "machines: " + num(w.attached) + " attached (" + num(w.busy) + " busy, " + num(w.idle) + " idle) · " +
    num(pending) + " pending in the scheduler · " + num(starting) + " starting · CPUs " + num(w.cpus_busy || 0) + " of " + num(w.cpus || 0) + " busy";

  // Why needs wait: the expected queue in grey; what needs a person goes
  // to the attention list.
  const reasons = Object.entries((sum.needs && sum.needs.by_reason) || {}).sort((a, b) => b[1] - a[1]);
  const waiting = document.getElementById("waiting");
  waiting.replaceChildren();
  const attention = [];
  for (const [r, n] of reasons) {
    if (ATTENTION_REASONS.has(r)) {
      attention.push(num(n) + " waiting: " + (REASON_WORDS[r] || words(r)) + " (see Provisioners)");
      continue;
    }
    if (waiting.childNodes.length) waiting.append(" · ");
    waiting.append(el("span", { class: "neutral reason-" + r, "data-reason": r, "data-count": n }, num(n) + " " + (REASON_WORDS[r] || words(r))));
  }
  if (waiting.childNodes.length) waiting.prepend("waiting: ");

  if (hasTasks(st)) {
    const t = sum.tasks;
    for (const s of ["failed", "timed_out", "lost", "cancelled"]) {
      if (t[s] > 0) attention.push(num(t[s]) + " task(s) " + words(s) + ": see Tasks, " + words(s));
    }
  }
  for (const h of (st.held_back || []).filter((x) => x.held)) {
    attention.push("engine holds " + h.provisioner + "/" + h.profile + " back after " + h.failures + " failure(s): " + h.last_error);
  }
  for (const p of st.provisioners || []) {
    if (p.error) attention.push(p.name + ": " + p.error);
  }
  const ul = document.getElementById("attention");
  ul.replaceChildren(...attention.map((a) => el("li", {}, a)));
}

// pace is things ended a second: over the page's samples of the last
// RATE_WINDOW, or, before it has two seconds of them, over the run from
// the engine's series of ends.
function pace(done, now, series) {
  samples.push({ t: now, ended: done });
  while (samples.length > 2 && now - samples[1].t >= RATE_WINDOW) samples.shift();
  const first = samples[0];
  if (now - first.t >= 2000 && done > first.ended) return (done - first.ended) * 1000 / (now - first.t);
  if (series && series.start && done > 0) {
    const secs = (now - Date.parse(series.start)) / 1000;
    if (secs > 0) return done / secs;
  }
  return 0;
}

// renderTasks lists the first MAX_ROWS tasks (or needs) of the filter,
// with filters by state and a count of the rest.
function renderTasks(st) {
  const f = document.getElementById("task-filters");
  f.replaceChildren();
  const all = el("button", { type: "button", "data-state": "", "aria-pressed": String(filter === "") }, "all");
  all.addEventListener("click", () => setFilter(""));
  f.append(all);
  for (const [s, n] of stateCounts(st)) {
    const b = el("button", { type: "button", "data-state": s, "aria-pressed": String(filter === s) }, words(s) + " " + num(n));
    b.addEventListener("click", () => setFilter(s));
    f.append(b);
  }
  const needs = st.needs || [];
  const tb = document.querySelector("#tasks tbody");
  tb.replaceChildren();
  for (const n of needs.slice(0, MAX_ROWS)) {
    const state = n.task_state || n.state;
    const why = n.state === "waiting" && n.reason ? (REASON_WORDS[n.reason] || words(n.reason)) + "; " : "";
    tb.append(el("tr", { "data-task": n.id, "data-state": state, "data-worker": n.worker || "", "data-reason": n.reason || "" },
      el("td", {}, n.id), el("td", { class: "state state-" + state + (n.reason ? " reason-" + n.reason : "") }, words(state)),
      el("td", {}, n.attempt || ""), el("td", {}, n.worker || ""), el("td", { class: "detail" }, why + (n.detail || ""))));
  }
  const matched = st.needs_matched != null ? st.needs_matched : needs.length;
  const more = Math.max(0, matched - Math.min(needs.length, MAX_ROWS));
  const m = document.getElementById("tasks-more");
  m.dataset.more = more;
  m.textContent = (more ? "and " + num(more) + " more" : "") + (filter ? (more ? " " : "") + "(" + words(filter) + " only)" : "");
}

// renderWorkers lists the first MAX_ROWS attached workers by name, under
// a count of all of them, busy and idle.
function renderWorkers(st) {
  const workers = st.workers || [];
  const w = (st.summary && st.summary.workers) || { attached: workers.length, busy: 0, idle: 0 };
  const summary = document.getElementById("workers-summary");
  summary.dataset.count = w.attached;
  let byProv = "";
  for (const [name, p] of Object.entries(w.by_provisioner || {}).sort()) {
    byProv += " · " + name + ": " + num(p.attached) + " attached, CPUs " + num(p.cpus_busy) + " of " + num(p.cpus) + " busy";
  }
  summary.textContent = num(w.attached) + " attached: " + num(w.busy) + " busy, " + num(w.idle) + " idle" + byProv;
  const tb = document.querySelector("#workers tbody");
  tb.replaceChildren();
  for (const x of workers.slice(0, MAX_ROWS)) {
    let task = x.task || (x.attempt_id ? "(a need's work)" : "idle");
    if ((x.running || 0) > 1) {
      task += " and " + num(x.running - 1) + " more";
    }
    tb.append(el("tr", { "data-worker": x.name, "data-job": x.job_id || "", "data-task": x.task || "", "data-attempt-id": x.attempt_id || "",
      "data-attempt-ids": (x.attempt_ids || []).join(","), "data-cpus-busy": x.cpus_busy || 0 },
      el("td", {}, x.name), el("td", {}, x.job_id), el("td", {}, x.hostname), el("td", {}, task + (x.reported ? " (result in)" : "")),
      el("td", {}, x.attempt || ""), el("td", { "class": "cpus" }, num(x.cpus_busy || 0) + "/" + num(x.cpus || 0)),
      el("td", { "class": "time-left" }, x.time_left || "")));
  }
  const total = st.workers_total != null ? st.workers_total : workers.length;
  const more = Math.max(0, total - Math.min(workers.length, MAX_ROWS));
  const m = document.getElementById("workers-more");
  m.dataset.more = more;
  m.textContent = more ? "and " + num(more) + " more (the first " + MAX_ROWS + " by name shown)" : "";
}

// renderEndedChart draws the tasks ended over time, from the engine's
// series (at most 120 bars, each a step of seconds from the first
// submission).
function renderEndedChart(st) {
  const svg = document.getElementById("ended-chart");
  const NS = "http://www.w3.org/2000/svg";
  const s = st.summary && st.summary.tasks && st.summary.tasks.ended;
  const data = (s && s.counts) || [];
  svg.replaceChildren();
  const cap = document.getElementById("ended-caption");
  if (data.length === 0) {
    cap.textContent = hasTasks(st) ? "tasks ended over time: none yet" : "tasks ended over time: no tasks";
    return;
  }
  const width = svg.clientWidth || 300, h = 90;
  const max = Math.max(...data, 1);
  const bw = width / Math.max(data.length, 10);
  data.forEach((n, i) => {
    const bh = n ? Math.max(1, (n / max) * h) : 0;
    const r = document.createElementNS(NS, "rect");
    r.setAttribute("x", i * bw); r.setAttribute("y", 4 + h - bh);
    r.setAttribute("width", Math.max(1, bw - 1)); r.setAttribute("height", bh);
    const title = document.createElementNS(NS, "title");
    title.textContent = n + " ended from " + age(i * s.step_seconds) + " to " + age((i + 1) * s.step_seconds);
    r.append(title);
    svg.append(r);
  });
  const label = document.createElementNS(NS, "text");
  label.setAttribute("x", 0); label.setAttribute("y", h + 16);
  label.textContent = "max " + num(max) + " in " + s.step_seconds + "s; " + age(data.length * s.step_seconds) + " shown";
  svg.append(label);
  svg.dataset.ended = data.reduce((a, b) => a + b, 0);
  cap.textContent = "tasks ended over time, " + s.step_seconds + "s a bar, from the first submission";
}

// scheduleStatus refreshes soon, once however many events ask for it.
function scheduleStatus() {
  if (statusTimer) return;
  statusTimer = setTimeout(() => { statusTimer = null; refreshStatus(); }, EVENT_REFRESH);
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
  const all = [...jobs.values()].sort((a, b) => (b.since || 0) - (a.since || 0));
  const rows = all.slice(0, MAX_ROWS);
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
  const more = all.length - rows.length;
  const m = document.getElementById("jobs-more");
  m.dataset.more = more;
  m.textContent = more > 0 ? "and " + num(more) + " more" : "";
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
      // A worker that leaves idle leaves as it should; one that leaves
      // with a task in hand (its job cancelled) or any other way is a
      // failure to show.
      if (ev.kind !== "worker_detached" || ev.task || ev.attempt_id) {
        addFailure(t, (ev.worker || "") + " " + ev.kind.slice(7) + (ev.task ? " with task " + ev.task : "") + ": " + (ev.detail || ""));
      }
      break;
    case "task_lost":
      addFailure(t, "task " + (ev.task || "") + (ev.attempt ? " attempt " + ev.attempt : "") + " lost on " + (ev.worker || "") + ": " + (ev.detail || ""));
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
  if (j) dirty.jobs = true;
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
  const task = ev.task && "task " + ev.task + (ev.attempt ? " (attempt " + ev.attempt + ")" : "");
  const parts = [ev.provisioner, ev.profile, ev.job && "job " + ev.job, ev.worker, task, ev.detail].filter(Boolean);
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
// Slurm's states and the ages change without an event: a refresh every
// 2 s, through the same debounce as the events' (one GET /status however
// many ask), so that a tick during a fetch starts no second one.
setInterval(scheduleStatus, 2000);
