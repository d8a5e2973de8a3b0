// Job page: the training section (templates/jobs/_training.html), as an ES module.
//
// Figures come from GET /api/v1/jobs/ID/metrics/summary (jobs/services/views/training_report.py);
// charts are drawn with uPlot (static/vendor/uplot) from every metric point of the job, and of
// its baseline when it has one. The points load once over HTTP; live ones arrive as
// "trainyard:metric" events, which the page's websocket code dispatches for each metric frame,
// and are deduplicated by cursor (the socket replays the history the HTTP load already gave).
// Charts are redrawn at most every DRAW_EVERY_MS, in an animation frame, however fast points
// come. The figures, the progress bar and the verdict are the server's: the page only shows
// them. It asks again for them soon after live points arrive (at most every
// SUMMARY_AFTER_POINTS_MS), so that the bar keeps up with the charts and the log, every
// SUMMARY_EVERY_MS while the job is active, and once more when it ends. A figure, chart or
// table with nothing to show yet takes no room.
//
// Everything shown is built with createElement / textContent: metric names and job names are
// data, never markup. Points become curves in ../curves.js and are drawn by ../plot.js, which
// the compare page shares; the bar over the charts (../chart_controls.js) sets the smoothing,
// the log scale and the x axis of them all, and a zoom dragged on one is shown by every chart
// on the same axis. On a time axis a line breaks between the job's attempts.
import { chartControls } from "../chart_controls.js";
import { attemptBreaks, axesOf, breakAt, completeTotals, curveOn, effectiveAxis, reports, timeOrigin, X_AXES } from "../curves.js";
import { formatCompact, formatCount, formatDuration, formatMoney, formatPrice, perMoney } from "../format.js";
import { align, chartSlot, COLOURS, render, resizeWith, showEmpty, zoomOutOnDoubleClick } from "../plot.js";
import { isTerminal, tagOf as tagOfInstance } from "../rules.js";

function startCharts() {
  const section = document.getElementById("training");
  if (!section || typeof uPlot === "undefined") return;

  const SUMMARY_EVERY_MS = 5000;
  const SUMMARY_AFTER_POINTS_MS = 1000;
  const DRAW_EVERY_MS = 250;
  // Without socket frames for this long while the job runs, fetch new points over HTTP too.
  const SOCKET_QUIET_MS = 10000;
  // Names with a chart of their own, and the declared totals, which only feed the progress bar.
  const OWN_CHART = new Set(["loss", "lr", "eval_accuracy", "samples_per_sec", "cpu_percent", "memory_mb", "gpu_util_percent"]);
  const NOT_CHARTED = new Set(["total_steps", "total_epochs"]);
  // Measured by the agent on every instance, whatever the trainer reports.
  const RESOURCE_SAMPLES = ["cpu_percent", "memory_mb", "gpu_util_percent"];
  const RUN_COLOUR = "#2855d8";
  const BASELINE_COLOUR = "#a3aab8";
  const GLOBAL_COLOUR = "#1d2330";

  const jobId = Number(section.dataset.jobId);
  const hasGpus = Number(section.dataset.gpus) > 0;
  const $ = (id) => document.getElementById(id);
  const int = new Intl.NumberFormat("en-US", { maximumFractionDigits: 0 });
  const two = new Intl.NumberFormat("en-US", { minimumFractionDigits: 2, maximumFractionDigits: 2 });

  let state = section.dataset.state;
  let sawStateEvent = false;
  let lastSocketPointsAt = 0;
  let summary = null;
  let jobsList = []; // the user's jobs, for the baseline picker

  // --- points -------------------------------------------------------------------------------
  function store() {
    // started: when the job started (seconds), where "time since start" counts from; before
    // it is known, the time of its first point.
    return { seen: new Set(), byName: new Map(), next: 0, count: 0, first: Infinity, started: null };
  }
  const run = store();
  let base = store();
  let baseId = null; // whose points `base` holds
  let baseState = null;
  let baseGen = 0; // bumped when the baseline changes: answers for an older one are dropped
  const dirty = new Set(); // metric names with points not charted yet
  let dirtyAll = true; // redraw every chart (the axis, the baseline or the GPU state changed)
  let chartsKey = ""; // what of the summary the charts were last drawn with

  function addPoints(into, points) {
    let added = 0;
    for (const p of points || []) {
      if (p == null || typeof p.cursor !== "number" || into.seen.has(p.cursor)) continue;
      into.seen.add(p.cursor);
      // A value that was not finite comes as null (with p.nonfinite): nothing to chart or sum.
      if (typeof p.value !== "number" || !Number.isFinite(p.value)) continue;
      let list = into.byName.get(p.name);
      if (!list) into.byName.set(p.name, (list = []));
      list.push(p);
      if (p.ts < into.first) into.first = p.ts;
      into.count++;
      added++;
      dirty.add(p.name);
    }
    if (added) scheduleDraw();
    return added;
  }

  const tagOf = (p) => tagOfInstance(p.role, p.index);
  const ROLE_ORDER = { scheduler: 0, master: 1, server: 2, worker: 3 };
  // Instances in order by their role and index (points carry both; the tag is only a name).
  function byInstance(a, b) {
    return (ROLE_ORDER[a.role] ?? 9) - (ROLE_ORDER[b.role] ?? 9) || a.role.localeCompare(b.role) || Number(a.index || 0) - Number(b.index || 0);
  }

  // The moments between the job's attempts (a preemption, a restart): lines on a time axis
  // break there rather than draw across the time nothing ran.
  const initialJob = JSON.parse(document.getElementById("job-initial").textContent);
  let breaks = attemptBreaks(initialJob.attempts);
  const startOf = (job) => (job && job.started ? Date.parse(job.started) / 1000 : null);
  run.started = startOf(initialJob);

  // One process's (or the mean over processes') reports as a line on `axis`.
  function lineOf(reportList, axis, into = run) {
    const origin = timeOrigin(into.started, into.first);
    const line = curveOn(reportList, axis, origin);
    if (into !== run) return line; // a baseline's attempts are not known here
    if (axis === "wall") return breakAt(line, breaks);
    if (axis === "relative") return breakAt(line, breaks.map((t) => t - origin));
    return line;
  }

  // One line per process that has `axis`, in order of role and index.
  function perTag(points, axis) {
    const tags = new Map();
    for (const p of points || []) {
      const tag = tagOf(p);
      if (!tags.has(tag)) tags.set(tag, []);
      tags.get(tag).push(p);
    }
    return [...tags.entries()]
      .sort((a, b) => byInstance(a[1][0], b[1][0]))
      .map(([tag, pts]) => [tag, lineOf(reports(pts), axis)])
      .filter(([, line]) => line.length);
  }

  // --- the charts ---------------------------------------------------------------------------
  const charts = {};
  for (const fig of section.querySelectorAll("figure.chart")) {
    charts[fig.dataset.chart] = chartSlot(fig);
  }
  const controls = chartControls("job", () => preferredAxis(), () => scheduleDraw(true));
  const group = controls.group;
  for (const chart of Object.values(charts)) zoomOutOnDoubleClick(chart, group);

  // Loss, lr, eval accuracy: this run's mean over processes, over the baseline's in grey, both
  // by the axis the verdict compared them on (epoch lines runs on different worker counts up).
  function preferredAxis() {
    const verdictAxis = summary && summary.baseline && summary.baseline.verdict && summary.baseline.verdict.axis;
    if (verdictAxis) return verdictAxis;
    const loss = run.byName.get("loss") || [];
    if (loss.some((p) => p.epoch != null)) return "epoch";
    // A run that reports no step (only the agents' samples, say) is read by time.
    const offered = offeredAxes();
    return offered.includes("step") ? "step" : offered.includes("epoch") ? "epoch" : "wall";
  }

  function curveSpec(name) {
    const own = reports(run.byName.get(name));
    if (!own.length) return null;
    const axis = effectiveAxis(group.view.x, axesOf(own));
    const series = [];
    const curves = [];
    // On wall time a baseline run earlier would sit apart, far to the left: it is drawn on the
    // other axes, where both runs start at 0.
    if (baseId !== null && axis !== "wall") {
      series.push({ label: `baseline #${baseId}`, stroke: BASELINE_COLOUR, width: 2 });
      curves.push(lineOf(reports(base.byName.get(name)), axis, base));
    }
    series.push({ label: `this run #${jobId}`, stroke: RUN_COLOUR, width: 2 });
    curves.push(lineOf(own, axis));
    return { axis, series, data: align(curves) };
  }

  // Global throughput: at each step (or epoch) the sum over the processes, drawn once every
  // one of them has reported that step; and each process's own.
  function throughputSpec() {
    const points = run.byName.get("samples_per_sec") || [];
    if (!points.length) return null;
    const axis = effectiveAxis(group.view.x, axesOf(reports(points)));
    const tags = perTag(points, axis);
    return {
      axis,
      series: [
        { label: "global", stroke: GLOBAL_COLOUR, width: 2.5 },
        ...tags.map(([tag], i) => ({ label: tag, stroke: COLOURS[i % COLOURS.length] })),
      ],
      data: align([lineOf(completeTotals(points), axis), ...tags.map(([, c]) => c)]),
    };
  }

  // The agents' samples have a time only: wall time, or time since the start where asked.
  function perInstanceSpec(name) {
    const axis = effectiveAxis(group.view.x, ["wall", "relative"]);
    const tags = perTag(run.byName.get(name), axis);
    if (!tags.length) return null;
    return {
      axis,
      series: tags.map(([tag], i) => ({ label: tag, stroke: COLOURS[i % COLOURS.length] })),
      data: align(tags.map(([, c]) => c)),
    };
  }

  // Any other names, one series per name and process, on an axis every one of them has.
  function customSpec() {
    const names = [...run.byName.keys()].filter((n) => !OWN_CHART.has(n) && !NOT_CHARTED.has(n)).sort();
    if (!names.length) return null;
    const shared = names.map((n) => axesOf(reports(run.byName.get(n))));
    const axis = effectiveAxis(group.view.x, X_AXES.filter((a) => shared.every((axes) => axes.includes(a))));
    const series = [];
    const curves = [];
    for (const name of names) {
      const tags = perTag(run.byName.get(name), axis);
      for (const [tag, c] of tags) {
        series.push({ label: tags.length > 1 ? `${name} [${tag}]` : name, stroke: COLOURS[series.length % COLOURS.length] });
        curves.push(c);
      }
    }
    return { axis, series, data: align(curves) };
  }

  // The x axes the run's points offer, for the control: time always; step and epoch where any
  // training metric has them.
  function offeredAxes() {
    const axes = new Set(["wall", "relative"]);
    for (const [name, points] of run.byName) {
      if (["cpu_percent", "memory_mb", "gpu_util_percent"].includes(name)) continue;
      for (const a of axesOf(reports(points))) axes.add(a);
    }
    return X_AXES.filter((a) => axes.has(a));
  }

  // Only the charts whose points changed are rebuilt; a new summary or baseline redraws all.
  function drawCharts() {
    // Until the user picks an x axis, the charts follow the run's own (epoch once it has any).
    const all = controls.followDefault() || dirtyAll;
    const names = new Set(dirty);
    dirty.clear();
    dirtyAll = false;
    const changed = (name) => all || names.has(name);
    const customChanged = all || [...names].some((n) => !OWN_CHART.has(n) && !NOT_CHARTED.has(n));
    if (changed("loss")) render(charts.loss, curveSpec("loss"), group);
    if (changed("lr")) render(charts.lr, curveSpec("lr"), group);
    if (changed("eval_accuracy")) render(charts.eval_accuracy, curveSpec("eval_accuracy"), group);
    if (changed("samples_per_sec")) render(charts.samples_per_sec, throughputSpec(), group);
    if (changed("cpu_percent")) render(charts.cpu_percent, perInstanceSpec("cpu_percent"), group);
    if (changed("memory_mb")) render(charts.memory_mb, perInstanceSpec("memory_mb"), group);
    if (changed("gpu_util_percent")) {
      const noGpu = summary ? summary.gpu === "none" : !hasGpus;
      if (noGpu) showEmpty(charts.gpu_util_percent, "no GPU");
      else render(charts.gpu_util_percent, perInstanceSpec("gpu_util_percent"), group);
      renderGpuStatus();
    }
    controls.offerAxes(offeredAxes());
    $("chart-controls").hidden = !Object.values(charts).some((c) => !c.fig.hidden && !c.fig.classList.contains("empty"));
    if (customChanged) {
      const custom = customSpec();
      if (custom) render(charts.custom, custom, group);
      else charts.custom.fig.hidden = true;
    }
    const live = state && !isTerminal(state) ? " · live" : "";
    $("training-status").textContent = `${pointsText()}${live}`;
  }

  // What the trainers reported, apart from the agents' own samples of each instance's use: a
  // job that failed before its first step has resource samples, but no training points.
  function pointsText() {
    let resources = 0;
    for (const name of RESOURCE_SAMPLES) resources += (run.byName.get(name) || []).length;
    const training = run.count - resources;
    const samples = `${int.format(resources)} resource sample${resources === 1 ? "" : "s"}`;
    if (!training) return resources ? `no training metrics reported · ${samples}` : "no points yet";
    const points = `${int.format(training)} training point${training === 1 ? "" : "s"}`;
    return resources ? `${points} · ${samples}` : points;
  }

  let drawQueued = false;
  let lastDraw = 0;
  function scheduleDraw(everything = false) {
    if (everything) dirtyAll = true;
    if (drawQueued) return;
    drawQueued = true;
    const wait = Math.max(0, lastDraw + DRAW_EVERY_MS - performance.now());
    setTimeout(() => requestAnimationFrame(() => {
      drawQueued = false;
      lastDraw = performance.now();
      drawCharts();
    }), wait);
  }

  resizeWith(() => Object.values(charts));

  // --- the summary --------------------------------------------------------------------------
  function setFigure(id, value, title) {
    const el = $(id).querySelector(".figure-value");
    el.textContent = value;
    el.title = title || "";
    $(id).classList.toggle("unknown", value === "–");
  }

  function renderSummary() {
    const s = summary;
    const tp = s.throughput;
    const b = s.baseline;
    const sp = b && b.speedup;
    const noSpeedup = b ? b.why_no_speedup || "" : "needs a 1-trainer baseline";
    setFigure("fig-global-sps", tp ? formatCount(tp.global_sps) : "–");
    setFigure("fig-per-worker-sps", tp ? formatCount(tp.per_worker_sps) : "–", tp ? `${tp.workers_reporting} training process${tp.workers_reporting === 1 ? "" : "es"} reporting` : "");
    setFigure("fig-speedup", sp ? two.format(sp.speedup) : "–", sp ? "" : noSpeedup);
    setFigure("fig-global-speedup", sp ? `${two.format(sp.global_speedup)}×` : "–", sp ? "" : noSpeedup);
    setFigure("fig-efficiency", sp ? `${int.format(sp.efficiency * 100)} %` : "–", sp ? "" : noSpeedup);
    // A short run on a cheap package costs fractions of a cent: formatMoney shows them. Before
    // the trainer reports anything (queued, or failed at start-up) there is no figure to show.
    setFigure("fig-cost", s.reported ? formatMoney(s.cost_so_far) : "–", `${formatDuration(s.elapsed_seconds)} at ${formatPrice(s.price_per_hour)} per hour`);
    const free = s.price_per_hour <= 0;
    const spd = s.samples_per_dollar;
    setFigure("fig-samples-per-dollar", spd != null ? formatCompact(spd) : free && tp ? "free" : "–", free ? "the package costs nothing per hour" : spd != null ? `${formatCount(spd)} samples ${perMoney}` : "");
    const ratio = sp && sp.samples_per_dollar_ratio;
    setFigure("fig-spd-ratio", ratio != null ? `${two.format(ratio)}×` : "–", ratio != null ? "" : noSpeedup);

    renderProgress(s.progress);
    renderBaseline();
    renderScaling(s.scaling);
    renderExports();
    renderGpuStatus();
  }

  // The server's figures, as they are: how far (by epoch where the run declared its epochs, as
  // its log counts them), and done once the last one is reported or the job succeeded.
  function renderProgress(p) {
    const fill = $("progress-fill");
    const text = $("progress-text");
    $("training-progress").hidden = !p;
    if (!p) return;
    const pct = Math.max(0, Math.min(100, p.fraction * 100));
    fill.style.width = `${pct}%`;
    fill.parentElement.setAttribute("aria-valuenow", String(Math.round(pct)));
    const reached = p.by === "epoch" ? Math.floor(p.reached) : p.reached;
    let line = `${int.format(Math.floor(pct))} % · ${p.by} ${int.format(reached)} of ${int.format(p.total)}`;
    if (isTerminal(state)) line += state === "succeeded" ? " · done" : ` · stopped (${state})`;
    else if (p.done) line += " · finishing";
    else if (p.eta_seconds != null) line += ` · ETA ${formatDuration(p.eta_seconds)}`;
    text.textContent = line;
  }

  function latestByTag(name) {
    const latest = new Map();
    for (const p of run.byName.get(name) || []) {
      const tag = tagOf(p);
      const had = latest.get(tag);
      if (!had || p.ts >= had.ts) latest.set(tag, p);
    }
    return [...latest.entries()].sort((a, b) => byInstance(a[1], b[1]));
  }

  function renderGpuStatus() {
    const status = $("gpu-status").querySelector("span");
    const noGpu = summary ? summary.gpu === "none" : !hasGpus;
    if (noGpu) {
      status.textContent = "no GPU";
    } else {
      const latest = latestByTag("gpu_util_percent");
      status.textContent = latest.length
        ? latest.map(([tag, p]) => `${tag} ${int.format(p.value)} %`).join(", ")
        : "waiting for GPU samples";
    }
    const warning = $("gpu-warning");
    const slow = summary ? summary.low_gpu_utilisation || [] : [];
    warning.hidden = slow.length === 0;
    warning.textContent = slow.length
      ? summary.low_gpu_warning
      : "";
  }

  function renderBaseline() {
    const b = summary.baseline;
    const scaling = summary.scaling || {};
    renderBaselineOptions();
    $("baseline-launch").hidden = !!b || !!scaling.has_single_worker_run;
    const note = $("baseline-note");
    note.hidden = !(b && b.why_no_speedup);
    note.textContent = b && b.why_no_speedup ? `No speedup figures against this baseline: ${b.why_no_speedup}.` : "";

    const verdictEl = $("verdict");
    const badge = $("verdict-badge");
    const reasons = $("verdict-reasons");
    reasons.replaceChildren();
    if (!b) {
      verdictEl.dataset.matches = "";
      badge.textContent = "no baseline: pick one to compare the curves";
      $("verdict-note").hidden = true;
      return;
    }
    const v = b.verdict;
    verdictEl.dataset.matches = v.matches === true ? "true" : v.matches === false ? "false" : "null";
    // A baseline on another trainer count draws other curves by design (the server says so in
    // a note): what is judged then is the final accuracy.
    const what = v.curves_judged === false ? "final accuracy" : "curves";
    badge.textContent =
      v.matches === true ? `${what} match${what === "curves" ? "" : "es"} baseline #${b.id}` :
      v.matches === false ? `${what} differ${what === "curves" ? "" : "s"} from baseline #${b.id}` :
      `not enough data yet to compare with baseline #${b.id}`;
    badge.title = `compared by ${v.axis}`;
    const verdictNote = $("verdict-note");
    verdictNote.hidden = !v.note;
    verdictNote.textContent = v.note || "";
    for (const r of v.reasons || []) {
      const li = document.createElement("li");
      li.textContent = r;
      reasons.appendChild(li);
    }
  }

  function trainersOf(j) {
    const roles = j.roles || {};
    if (j.kvstore) return roles.worker ? roles.worker.instances : 0;
    return Object.values(roles).reduce((n, r) => n + r.instances, 0);
  }

  function renderBaselineOptions() {
    const select = $("baseline-select");
    const current = summary && summary.baseline ? summary.baseline.id : null;
    const options = [new Option("none", "")];
    let found = false;
    for (const j of jobsList) {
      if (j.id === jobId) continue;
      const n = trainersOf(j);
      options.push(new Option(`#${j.id} ${j.name} · ${n} trainer${n === 1 ? "" : "s"} · ${j.state}`, String(j.id)));
      if (j.id === current) found = true;
    }
    if (current !== null && !found) options.push(new Option(`#${current} ${summary.baseline.name}`, String(current)));
    const labels = options.map((o) => `${o.value}:${o.text}`).join("\n");
    if (select.dataset.labels !== labels) {
      select.replaceChildren(...options);
      select.dataset.labels = labels;
    }
    if (!select.matches(":focus") || select.disabled) select.value = current === null ? "" : String(current);
  }

  function renderScaling(scaling) {
    const rows = (scaling && scaling.rows) || [];
    $("scaling-section").hidden = rows.length === 0;
    $("scaling").querySelector("tbody").replaceChildren(...rows.map(scalingRow));
    $("scaling-hint").textContent = (scaling && scaling.hint) || "";
  }

  function scalingRow(r) {
    const tr = document.createElement("tr");
    tr.dataset.job = r.job_id;
    if (r.job_id === jobId) tr.className = "current";
    const cells = [
      String(r.workers),
      formatCount(r.global_sps),
      r.speedup != null ? two.format(r.speedup) : "–",
      r.global_speedup != null ? `${two.format(r.global_speedup)}×` : "–",
      r.efficiency != null ? `${int.format(r.efficiency * 100)} %` : "–",
      r.samples_per_dollar != null ? formatCompact(r.samples_per_dollar) : "–",
    ];
    for (const c of cells) {
      const td = document.createElement("td");
      td.textContent = c;
      td.className = "num";
      tr.appendChild(td);
    }
    const td = document.createElement("td");
    const a = document.createElement("a");
    a.href = `/jobs/${r.job_id}/`;
    a.textContent = `#${r.job_id}`;
    td.appendChild(a);
    if (r.job_id === jobId) td.append(" (this job)");
    tr.appendChild(td);
    return tr;
  }

  function renderExports() {
    const b = summary && summary.baseline;
    const link = $("export-baseline-tensorboard");
    link.hidden = !b;
    const own = `tar xzf trainyard-job-${jobId}-tb.tar.gz`;
    if (b) {
      link.href = `/api/v1/jobs/${b.id}/metrics.tensorboard.tar.gz`;
      link.textContent = `Baseline #${b.id} TensorBoard`;
      $("exports-hint").textContent = `${own}; tar xzf trainyard-job-${b.id}-tb.tar.gz; tensorboard --logdir run:job-${jobId},baseline:job-${b.id}`;
    } else {
      $("exports-hint").textContent = `${own}; tensorboard --logdir run:job-${jobId}`;
    }
  }

  // --- HTTP -----------------------------------------------------------------------------------
  function csrfToken() {
    const m = document.cookie.match(/(?:^|;\s*)csrftoken=([^;]+)/);
    if (m) return decodeURIComponent(m[1]);
    const input = document.querySelector("input[name=csrfmiddlewaretoken]");
    return input ? input.value : "";
  }

  async function api(path, options = {}) {
    const init = { credentials: "same-origin", headers: { Accept: "application/json" }, ...options };
    if (options.body !== undefined) {
      init.headers = { ...init.headers, "Content-Type": "application/json", "X-CSRFToken": csrfToken() };
    }
    const r = await fetch(path, init);
    let body;
    try { body = await r.json(); } catch { body = null; }
    if (!r.ok) {
      const errors = body && body.errors ? Object.values(body.errors).flat() : [];
      throw new Error(errors[0] || `${path}: HTTP ${r.status}`);
    }
    return body;
  }

  async function loadPoints() {
    const page = await api(`/api/v1/jobs/${jobId}/metrics?after=${run.next}`);
    addPoints(run, page.points);
    if (typeof page.next === "number" && page.next > run.next) run.next = page.next;
  }

  // Answers can overtake each other: only one newer than the last shown is shown.
  let summaryAsked = 0;
  let summaryShown = 0;
  let lastSummaryAt = 0;
  async function loadSummary() {
    const asked = ++summaryAsked;
    lastSummaryAt = Date.now();
    const answer = await api(`/api/v1/jobs/${jobId}/metrics/summary`);
    if (asked < summaryShown) return;
    summaryShown = asked;
    summary = answer;
    applySummary();
    section.dataset.summaries = String(asked); // summaries shown so far: for tests and tools
  }

  // New points may move the figures: ask for them again soon, not on every point.
  let summaryQueued = false;
  function summarySoon() {
    if (summaryQueued) return;
    summaryQueued = true;
    const wait = Math.max(0, lastSummaryAt + SUMMARY_AFTER_POINTS_MS - Date.now());
    setTimeout(() => {
      summaryQueued = false;
      loadSummary().catch(() => {}); // a blip: the next points or tick ask again
    }, wait);
  }

  function applySummary() {
    renderSummary();
    const wanted = summary.baseline ? summary.baseline.id : null;
    if (wanted !== baseId) switchBaseline(wanted);
    // The charts depend on the summary only through the curves' axis and the GPU state.
    const key = `${preferredAxis()} ${summary.gpu}`;
    if (key !== chartsKey) {
      chartsKey = key;
      scheduleDraw(true);
    }
  }

  async function loadJobs() {
    try {
      const body = await api("/api/v1/jobs");
      // {"jobs": [...]}, newest first; accept a bare list too.
      jobsList = Array.isArray(body) ? body : body.jobs || [];
    } catch {
      jobsList = [];
    }
    if (summary) renderBaselineOptions();
  }

  function switchBaseline(id) {
    baseGen++;
    baseId = id;
    base = store();
    baseState = null;
    scheduleDraw(true);
    if (id !== null) loadBaseline(baseGen);
  }

  async function loadBaseline(gen) {
    const id = baseId;
    try {
      const [page, job] = await Promise.all([
        api(`/api/v1/jobs/${id}/metrics?after=${base.next}`),
        api(`/api/v1/jobs/${id}`),
      ]);
      if (gen !== baseGen) return;
      addPoints(base, page.points);
      if (typeof page.next === "number" && page.next > base.next) base.next = page.next;
      const wasActive = baseActive();
      baseState = job.state;
      base.started = startOf(job);
      // A baseline that just ended: its figures are final now.
      if (wasActive && !baseActive()) loadSummary().catch(showError);
      else if (!wasActive && baseActive()) poll();
    } catch (e) {
      if (gen === baseGen) showError(e);
    }
  }

  const baseActive = () => baseId !== null && baseState !== null && !isTerminal(baseState);

  function showError(e) {
    $("baseline-error").textContent = e && e.message ? e.message : String(e);
  }

  async function setBaseline(id) {
    const select = $("baseline-select");
    select.disabled = true;
    $("baseline-error").textContent = "";
    try {
      summary = await api(`/api/v1/jobs/${jobId}/baseline`, { method: "POST", body: JSON.stringify({ baseline: id }) });
      applySummary();
    } catch (e) {
      showError(e);
      if (summary) renderBaselineOptions();
    } finally {
      select.disabled = false;
    }
  }

  $("baseline-select").addEventListener("change", (ev) => {
    const v = ev.target.value;
    setBaseline(v === "" ? null : Number(v));
  });

  $("baseline-launch").addEventListener("click", async (ev) => {
    const button = ev.currentTarget;
    button.disabled = true;
    $("baseline-error").textContent = "";
    try {
      const job = await api(`/api/v1/jobs/${jobId}/baseline-run`, { method: "POST", body: "{}" });
      const launched = $("baseline-launched");
      const a = document.createElement("a");
      a.href = `/jobs/${job.id}/`;
      a.textContent = `#${job.id} ${job.name}`;
      launched.replaceChildren("Launched ", a, ` (${job.state})`);
      launched.hidden = false;
      await loadJobs();
      await loadSummary();
    } catch (e) {
      showError(e);
    } finally {
      button.disabled = false;
    }
  });

  // --- live updates ---------------------------------------------------------------------------
  document.addEventListener("trainyard:metric", (ev) => {
    lastSocketPointsAt = Date.now();
    const detail = ev.detail || {};
    if (addPoints(run, detail.points)) summarySoon();
    if (typeof detail.next === "number" && detail.next > run.next) run.next = detail.next;
  });

  document.addEventListener("trainyard:state", (ev) => {
    sawStateEvent = true;
    if (ev.detail && ev.detail.started && run.started === null) {
      run.started = startOf(ev.detail);
      scheduleDraw(true);
    }
    const attempts = ev.detail && ev.detail.attempts;
    if (attempts) {
      const next = attemptBreaks(attempts);
      if (next.join() !== breaks.join()) {
        breaks = next;
        scheduleDraw(true);
      }
    }
    setState(ev.detail && ev.detail.state);
  });

  function setState(next) {
    if (!next || next === state) return;
    const wasActive = !isTerminal(state);
    state = next;
    section.dataset.state = state;
    if (wasActive && isTerminal(state)) {
      // The run is over: its last points and final figures, once.
      loadPoints().then(loadSummary).catch(showError);
    }
    scheduleDraw();
  }

  let polling = false;
  function poll() {
    if (polling) return;
    polling = true;
    setTimeout(tick, SUMMARY_EVERY_MS);
  }

  async function tick() {
    polling = false;
    const active = !isTerminal(state);
    if (!active && !baseActive()) return;
    try {
      if (active) {
        if (!sawStateEvent) {
          // No websocket state frames (yet): read the state over HTTP instead.
          const job = await api(`/api/v1/jobs/${jobId}`);
          setState(job.state);
        }
        if (Date.now() - lastSocketPointsAt > SOCKET_QUIET_MS) await loadPoints();
        if (!isTerminal(state)) await loadSummary();
      }
      if (baseActive()) await loadBaseline(baseGen);
    } catch {
      // A blip (the server restarting, say): try again next tick.
    }
    poll();
  }

  async function start() {
    try {
      await Promise.all([loadPoints(), loadSummary(), loadJobs()]);
    } catch (e) {
      $("training-status").textContent = `could not load the metrics: ${e.message}`;
    }
    poll();
  }

  start();
}

startCharts();
