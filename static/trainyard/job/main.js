// Job page: wires its parts together. The state at the top (state.js), the log viewer
// (logview.js) and the training charts (charts.js) are fed by one websocket (connection.js);
// the charts hear its frames as "trainyard:state" and "trainyard:metric" events.
import { isWaiting } from "../rules.js";
import { isOlderState } from "../state_order.js";
import { openJobStream } from "./connection.js";
import { createLogView } from "./logview.js";
import { renderJobState, setReplicaCounts, waitingInQueue } from "./state.js";

const COUNTS_EVERY_MS = 2000;
const QUEUE_EVERY_MS = 3000;

const initial = JSON.parse(document.getElementById("job-initial").textContent);
const jobId = initial.id;
const view = createLogView(jobId, initial);
let job = initial;

function showState(state) {
  if (isOlderState(job, state)) return false; // a late answer: the page shows a newer state
  job = state;
  renderJobState(state);
  view.jobChanged(state);
  return true;
}

function share(name, detail) {
  document.dispatchEvent(new CustomEvent(name, { detail }));
}

function onFrame(msg) {
  if (msg.type === "state") {
    if (showState(msg.job)) share("trainyard:state", msg.job);
  } else if (msg.type === "metric") {
    view.advance(msg.next);
    share("trainyard:metric", msg);
  } else if (msg.type === "log") {
    view.log(msg);
  } else if (msg.type === "heartbeat") {
    view.advance(msg.next);
  } else if (msg.type === "gap") {
    view.gap(msg);
  } else if (msg.type === "end") {
    view.end(msg);
    refreshCounts();
  }
}

// Lines so far per instance and per node.
async function refreshCounts() {
  let counts;
  try {
    const r = await fetch(`/api/v1/jobs/${jobId}/logs/counts`, { credentials: "same-origin" });
    if (!r.ok) return;
    counts = await r.json();
  } catch {
    return;
  }
  setReplicaCounts(counts.replicas);
  view.setNodeCounts(counts.by_node, counts.total);
}

function countsLoop() {
  if (view.isEnded()) return;
  if (!isWaiting(job.state)) refreshCounts();
  setTimeout(countsLoop, COUNTS_EVERY_MS);
}

// While the job waits for room, its place in the queue moves as other jobs start or leave;
// those changes are not this job's events, so ask for them.
async function refreshWhileWaiting() {
  if (!view.isEnded() && waitingInQueue()) {
    const r = await fetch(`/api/v1/jobs/${jobId}`, { credentials: "same-origin" });
    if (r.ok) showState(await r.json());
  }
  setTimeout(refreshWhileWaiting, QUEUE_EVERY_MS);
}

showState(initial);
view.start();
openJobStream(jobId, {
  from: view.streamFrom,
  onFrame,
  onStatus: view.setConnection,
  isEnded: view.isEnded,
});
countsLoop();
setTimeout(refreshWhileWaiting, QUEUE_EVERY_MS);
