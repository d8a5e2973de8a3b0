// The job's state at the top of its page: the badge and reason, the place in the queue, the
// Cancel button (gone once the job has ended), when it started and ended, the Instances
// table, the runs of a restarted job and the health rules that fired. Everything is built
// with textContent: reasons and rule messages are data, never markup.
import { formatCount, formatLocalTime } from "../format.js";
import { isTerminal } from "../rules.js";
import { setDuration, setTime } from "../times.js";

const $ = (id) => document.getElementById(id);

export function renderJobState(state) {
  const stateEl = $("job-state");
  stateEl.textContent = state.state;
  stateEl.className = `state state-${state.state}`;
  $("job-reason").textContent = state.reason || "";
  const position = $("queue-position");
  position.hidden = !state.queue_position;
  position.querySelector("span").textContent = state.queue_position || "";
  const cancel = $("cancel-form");
  if (cancel && isTerminal(state.state)) cancel.remove();
  // An ended job's cost is what it cost, not "so far".
  const costLabel = document.querySelector("#fig-cost .figure-label");
  if (costLabel && isTerminal(state.state)) costLabel.textContent = "Cost";
  renderTimes(state);
  renderReplicas(state);
  renderAttempts(state);
  renderSlurmJobs(state);
  renderHealthEvents(state);
  if (state.state === "failed") showFailureBanner();
}

// A job that fails while its page is open gets the banner its page leads with once failed:
// the server renders it (jobs/services/views/failure.py), so it is fetched, not built a second way.
let bannerAsked = false;
async function showFailureBanner() {
  if (bannerAsked || $("failure-banner")) return;
  bannerAsked = true;
  let html;
  try {
    const r = await fetch(window.location.href, { credentials: "same-origin" });
    if (!r.ok) return;
    html = await r.text();
  } catch {
    return;
  }
  const banner = new DOMParser().parseFromString(html, "text/html").getElementById("failure-banner");
  if (!banner || $("failure-banner")) return;
  document.querySelector(".heading").after(document.adoptNode(banner));
  $("job-reason").hidden = true;
}

// Started, ended and how long it ran (ticking while it runs, "—" while it waits).
function renderTimes(state) {
  setTime($("job-started"), state.started);
  setTime($("job-finished"), state.finished);
  setDuration($("job-duration"), state.started, state.finished);
}

// Whether the page still waits for the job to get room (its place in the queue is shown).
export const waitingInQueue = () => !$("queue-position").hidden;

function renderReplicas(state) {
  const body = document.querySelector("#replicas tbody");
  body.replaceChildren();
  for (const r of state.replicas) {
    const tr = document.createElement("tr");
    tr.dataset.tag = r.tag;
    // A process killed by a signal shows the signal's name (SIGTERM), never its number (-15).
    cells(tr, [`[${r.tag}]`, r.node || "–", r.state, r.signal || (r.exit_code ?? ""), ""]);
    const badge = document.createElement("span");
    badge.className = `state state-${r.state}`;
    badge.textContent = r.state;
    tr.children[2].replaceChildren(badge);
    tr.children[1].className = "node-name";
    if (r.reason) {
      // How this instance ended, beside the job's own reason (which names the first cause).
      const why = document.createElement("small");
      why.className = "replica-reason";
      why.textContent = ` ${r.reason.split("\n")[0]}`;
      why.title = r.reason;
      tr.children[2].appendChild(why);
    }
    tr.lastElementChild.className = "lines";
    body.appendChild(tr);
  }
  renderReplicaCounts();
}

function cells(tr, values) {
  for (const value of values) {
    const td = document.createElement("td");
    td.textContent = value;
    tr.appendChild(td);
  }
}

// The same "2026-11-25 12:23:38" as every other time on the page, in the reader's zone.
function when(iso) {
  return iso ? formatLocalTime(new Date(iso)) : "–";
}

// "node-1, node-2": the list may wrap between names, never inside one.
function nodeNames(names) {
  return names.flatMap((name, i) => {
    const span = document.createElement("span");
    span.className = "node-name";
    span.textContent = name;
    return i ? [", ", span] : [span];
  });
}

// One row per run of the whole job; a restart adds one, with why the one before ended.
// A Slurm pool's job: each attempt's Slurm job id, as soon as the pass has submitted it.
function renderSlurmJobs(state) {
  const span = $("slurm-jobs");
  if (!span) return;
  const ids = (state.attempts || []).map((a) => a.slurm_job_id).filter(Boolean);
  span.replaceChildren();
  if (!ids.length) return;
  span.append(" · Slurm job");
  for (const id of ids) {
    const code = document.createElement("code");
    code.textContent = id;
    span.append(" ", code);
  }
}

function renderAttempts(state) {
  const attempts = state.attempts || [];
  $("attempts-section").hidden = attempts.length < 2 && state.state !== "restarting";
  const body = document.querySelector("#attempts tbody");
  body.replaceChildren();
  // Which arguments each attempt ran with, only where they differ (restart.args_on_resume).
  const argsDiffer = new Set(attempts.map((a) => JSON.stringify(a.args || []))).size > 1;
  document.querySelector("#attempts th.attempt-args").hidden = !argsDiffer;
  for (const a of attempts) {
    const tr = document.createElement("tr");
    tr.dataset.attempt = a.number;
    let why = a.reason ? a.reason.split("\n")[0] : "";
    if (!a.finished) why = state.state === "restarting" ? "waiting to start" : "current";
    else if (a.reason && !a.counted) why += " (not counted against the restarts)";
    // An elastic job's size over time: each attempt's instances, and why it changed.
    const size = a.instances === null || a.instances === undefined ? "–" : String(a.instances);
    cells(tr, [`#${a.number}`, when(a.started), when(a.finished), "–", size, (a.args || []).join(" "), why]);
    if (a.nodes && a.nodes.length) tr.children[3].replaceChildren(...nodeNames(a.nodes));
    tr.children[4].className = "attempt-size";
    if (a.resize) {
      const note = document.createElement("span");
      note.className = "muted resize";
      note.textContent = ` ${a.resize}`;
      tr.children[4].append(note);
    }
    tr.children[5].className = "attempt-args";
    tr.children[5].hidden = !argsDiffer;
    tr.lastElementChild.title = a.reason || "";
    body.appendChild(tr);
  }
}

function renderHealthEvents(state) {
  const events = state.health_events || [];
  $("health-section").hidden = events.length === 0;
  const body = document.querySelector("#health-events tbody");
  body.replaceChildren();
  for (const e of events) {
    const tr = document.createElement("tr");
    tr.className = `health-${e.action}`;
    let measured = "–";
    if (typeof e.value === "number") measured = String(Number(e.value.toPrecision(4)));
    else if (e.value !== null && e.value !== undefined) measured = String(e.value);
    cells(tr, [when(e.at), `#${e.attempt}`, `[${e.instance}]`, e.rule, measured, e.action, e.outcome || ""]);
    tr.children[3].title = e.message;
    body.appendChild(tr);
  }
}

// Lines so far per instance (GET .../logs/counts), in the Instances table's last column.
let replicaCounts = {};

export function setReplicaCounts(replicas) {
  replicaCounts = {};
  for (const r of replicas || []) replicaCounts[r.tag] = r;
  renderReplicaCounts();
}

function renderReplicaCounts() {
  for (const tr of document.querySelectorAll("#replicas tbody tr")) {
    const c = replicaCounts[tr.dataset.tag];
    const td = tr.lastElementChild;
    td.textContent = formatCount(c ? c.stdout + c.stderr : 0);
    td.title = c ? `${formatCount(c.stdout)} stdout, ${formatCount(c.stderr)} stderr` : "";
  }
}
