// Times in the zone the console shows them in (the reader's own unless TRAINYARD_TIME_ZONE
// names one), and durations that tick while a job runs.
//
// The server renders each time as <time class="local-time" datetime="ISO">… UTC</time> and
// each duration as <span class="duration" data-started data-finished|data-now data-prefix>
// (jobs/templatetags/trainyard.py), so a page reads right before this runs. Here the times
// are rewritten in local time, and running durations count on every second. They count on the
// server's clock, learnt from data-now: a browser whose clock is off still shows how long the
// job has really run.
import { formatDuration, formatLocalTime, shownZone } from "./format.js";

const TICK_MS = 1000;
let skewMs = 0; // the server's clock minus this browser's

// Show `iso` in `el` (a <time>) in local time; "—" for none.
export function setTime(el, iso) {
  const date = iso ? new Date(iso) : null;
  if (!date || Number.isNaN(date.getTime())) {
    el.removeAttribute("datetime");
    el.textContent = "—";
    el.title = "";
    return;
  }
  el.setAttribute("datetime", iso);
  el.textContent = formatLocalTime(date);
  el.title = `${shownZone}; ${date.toISOString().slice(0, 19).replace("T", " ")} UTC`;
}

// How long from `started` to `finished`, or to now while there is no finish; "—" before a
// start.
export function setDuration(el, started, finished) {
  if (!started) {
    delete el.dataset.started;
    delete el.dataset.finished;
    delete el.dataset.seconds;
    el.classList.remove("running");
    el.textContent = "—";
    return;
  }
  el.dataset.started = started;
  if (finished) el.dataset.finished = finished;
  else delete el.dataset.finished;
  el.classList.toggle("running", !finished);
  renderDuration(el);
}

function renderDuration(el) {
  const started = Date.parse(el.dataset.started);
  if (Number.isNaN(started)) return;
  const finished = el.dataset.finished ? Date.parse(el.dataset.finished) : null;
  const seconds = ((finished ?? Date.now() + skewMs) - started) / 1000;
  el.dataset.seconds = seconds.toFixed(3);
  const text = formatDuration(seconds);
  el.textContent = finished == null ? `${el.dataset.prefix || ""}${text}` : text;
}

function start() {
  const withNow = document.querySelector(".duration[data-now]");
  if (withNow) {
    const serverNow = Date.parse(withNow.dataset.now);
    if (!Number.isNaN(serverNow)) skewMs = serverNow - Date.now();
  }
  for (const el of document.querySelectorAll("time.local-time[datetime]")) setTime(el, el.getAttribute("datetime"));
  setInterval(() => {
    for (const el of document.querySelectorAll(".duration.running[data-started]")) renderDuration(el);
  }, TICK_MS);
}

start();
