// Job page: state, instances and the live log, all over one websocket.
// Lines are inserted as text nodes only: HTML printed by a trainer stays text.
(function () {
  "use strict";
  const MAX_DOM_LINES = 20000;
  const initial = JSON.parse(document.getElementById("job-initial").textContent);
  const jobId = initial.id;
  const logEl = document.getElementById("log");
  const statusEl = document.getElementById("log-status");
  const followEl = document.getElementById("follow");
  const tabsEl = document.getElementById("log-tabs");
  const counts = {};
  let cursor = 0;
  let filter = "";
  let ended = false;
  let retry = 500;

  function tagOf(line) {
    return line.role === "master" || line.role === "scheduler" ? line.role : `${line.role}-${line.index}`;
  }

  function renderState(job) {
    const stateEl = document.getElementById("job-state");
    stateEl.textContent = job.state;
    stateEl.className = `state state-${job.state}`;
    document.getElementById("job-reason").textContent = job.reason || "";
    const position = document.getElementById("queue-position");
    position.hidden = !job.queue_position;
    position.querySelector("span").textContent = job.queue_position || "";
    const cancel = document.getElementById("cancel-form");
    if (cancel && ["succeeded", "failed", "cancelled"].includes(job.state)) cancel.remove();
    const body = document.querySelector("#replicas tbody");
    body.replaceChildren();
    for (const r of job.replicas) {
      const tr = document.createElement("tr");
      tr.dataset.tag = r.tag;
      for (const value of [`[${r.tag}]`, r.node || "–", r.state, r.exit_code ?? "", counts[r.tag] || 0]) {
        const td = document.createElement("td");
        td.textContent = value;
        tr.appendChild(td);
      }
      const badge = document.createElement("span");
      badge.className = `state state-${r.state}`;
      badge.textContent = r.state;
      tr.children[2].replaceChildren(badge);
      body.appendChild(tr);
      ensureTab(r.tag);
    }
  }

  function ensureTab(tag) {
    if (tabsEl.querySelector(`[data-tag="${CSS.escape(tag)}"]`)) return;
    const b = document.createElement("button");
    b.type = "button";
    b.className = "tab";
    b.dataset.tag = tag;
    b.textContent = `[${tag}]`;
    tabsEl.appendChild(b);
  }

  tabsEl.addEventListener("click", (ev) => {
    const b = ev.target.closest("button.tab");
    if (!b) return;
    filter = b.dataset.tag;
    tabsEl.querySelectorAll(".tab").forEach((t) => t.classList.toggle("active", t === b));
    for (const el of logEl.children) el.hidden = filter !== "" && el.dataset.tag !== filter;
  });

  function appendLines(lines) {
    const frag = document.createDocumentFragment();
    for (const line of lines) {
      const tag = tagOf(line);
      counts[tag] = (counts[tag] || 0) + 1;
      const div = document.createElement("div");
      div.className = line.stream === "stderr" ? "line stderr" : "line";
      div.dataset.tag = tag;
      div.dataset.cursor = line.cursor;
      div.title = `${line.node} · ${line.stream} · ${new Date(line.ts * 1000).toISOString()}`;
      const t = document.createElement("span");
      t.className = "tag";
      t.textContent = `[${tag}] `;
      div.appendChild(t);
      div.appendChild(document.createTextNode(line.text));
      if (filter !== "" && tag !== filter) div.hidden = true;
      frag.appendChild(div);
    }
    logEl.appendChild(frag);
    while (logEl.childElementCount > MAX_DOM_LINES) logEl.firstElementChild.remove();
    for (const tr of document.querySelectorAll("#replicas tbody tr")) {
      tr.lastElementChild.textContent = counts[tr.dataset.tag] || 0;
    }
    if (followEl.checked) logEl.scrollTop = logEl.scrollHeight;
  }

  function connect() {
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const ws = new WebSocket(`${scheme}://${location.host}/ws/jobs/${jobId}/?after=${cursor}`);
    ws.onopen = () => { statusEl.textContent = "live"; retry = 500; };
    ws.onmessage = (ev) => {
      const msg = JSON.parse(ev.data);
      if (msg.type === "state") renderState(msg.job);
      else if (msg.type === "log") { appendLines(msg.lines); cursor = msg.next; }
      else if (msg.type === "end") { ended = true; cursor = msg.next; statusEl.textContent = `log complete (${msg.reason})`; }
    };
    ws.onclose = () => {
      if (ended) return;
      statusEl.textContent = "reconnecting…";
      setTimeout(connect, retry);  // resumes after the last line we have: no gap, no repeat
      retry = Math.min(retry * 2, 10000);
    };
  }

  // While the job waits for room, its place in the queue moves as other jobs start or leave;
  // those changes are not this job's events, so ask for them.
  async function refreshWhileWaiting() {
    const position = document.getElementById("queue-position");
    if (!ended && !position.hidden) {
      const r = await fetch(`/api/v1/jobs/${jobId}`, { credentials: "same-origin" });
      if (r.ok) renderState(await r.json());
    }
    setTimeout(refreshWhileWaiting, 3000);
  }

  renderState(initial);
  connect();
  setTimeout(refreshWhileWaiting, 3000);
})();
