// The compare page (templates/jobs/compare.html): 2 to 8 jobs' curves overlaid, one colour
// per job, and their figures in one table, from GET /api/v1/compare (jobs/services/
// comparison.py) and each job's GET /api/v1/jobs/ID/metrics. The bar over the charts
// (chart_controls.js) sets smoothing, log scale and x axis for them all; "time since start"
// counts each job from its own start. The configuration table is the server's; here it
// only gets its "only differences" switch.
//
// Everything shown is built with createElement / textContent: job and metric names are data.
import { chartControls } from "./chart_controls.js";
import { axesOf, curveOn, effectiveAxis, reports, timeOrigin, X_AXES } from "./curves.js";
import { formatCompact, formatCount, formatDuration, formatMoney, perMoney } from "./format.js";
import { align, chartSlot, COLOURS, formatValue, render, resizeWith, zoomOutOnDoubleClick } from "./plot.js";

const LABELS = {
  loss: "Loss",
  eval_accuracy: "Eval accuracy",
  lr: "Learning rate",
  samples_per_sec: "Samples/sec",
};

function startCompare() {
  const section = document.getElementById("compare");
  if (!section) return;
  const $ = (id) => document.getElementById(id);
  const two = new Intl.NumberFormat("en-US", { minimumFractionDigits: 2, maximumFractionDigits: 2 });
  const pct = new Intl.NumberFormat("en-US", { maximumFractionDigits: 0 });
  const colourOf = (i) => COLOURS[i % COLOURS.length];
  const charts = [];

  for (const swatch of section.querySelectorAll(".swatch[data-series]")) {
    swatch.style.background = colourOf(Number(swatch.dataset.series));
  }

  const only = $("only-differences");
  only.addEventListener("change", () => $("compare-config").classList.toggle("only-differences", only.checked));

  async function getJson(path) {
    const r = await fetch(path, { credentials: "same-origin", headers: { Accept: "application/json" } });
    let body;
    try { body = await r.json(); } catch { body = null; }
    if (!r.ok) {
      const errors = body && body.errors ? Object.values(body.errors).flat() : [];
      throw new Error(errors.join(" ") || `${path}: HTTP ${r.status}`);
    }
    return body;
  }

  // Every point of the job, page after page, as {name: [points]}.
  async function pointsOf(job) {
    const byName = new Map();
    let after = 0;
    for (;;) {
      const page = await getJson(`${job.metrics}?after=${after}`);
      for (const p of page.points || []) {
        if (typeof p.value !== "number" || !Number.isFinite(p.value)) continue;
        if (!byName.has(p.name)) byName.set(p.name, []);
        byName.get(p.name).push(p);
      }
      if (!page.points || page.points.length === 0 || typeof page.next !== "number" || page.next <= after) break;
      after = page.next;
    }
    return byName;
  }

  // Epochs line up runs of different sizes: the axis until the user picks another.
  const controls = chartControls("compare", () => "epoch", redrawAll);
  const group = controls.group;
  const drawn = []; // [slot, name] of every chart, to draw again under a new view
  let shown = null; // {jobs, points, firsts} once loaded

  // The axis every job's points of this metric have, the one asked for where they all do.
  function axisFor(perJob) {
    const shared = perJob.map((rs) => axesOf(rs));
    return effectiveAxis(group.view.x, X_AXES.filter((a) => shared.every((axes) => axes.includes(a))), "relative");
  }

  function specOf(name) {
    const { jobs, points, firsts } = shown;
    const perJob = points.map((byName) => reports(byName.get(name)));
    const axis = axisFor(perJob);
    return {
      axis,
      series: jobs.map((job, i) => ({ label: `#${job.id} ${job.name}`, stroke: colourOf(i), width: 2 })),
      data: align(perJob.map((rs, i) => curveOn(rs, axis, firsts[i]))),
    };
  }

  function drawChart(name) {
    const fig = document.createElement("figure");
    fig.className = "chart";
    fig.dataset.chart = name;
    fig.id = `compare-chart-${name}`;
    const caption = document.createElement("figcaption");
    caption.textContent = LABELS[name] || name;
    const plot = document.createElement("div");
    plot.className = "chart-plot";
    const empty = document.createElement("p");
    empty.className = "chart-empty muted";
    fig.append(caption, plot, empty);
    $("compare-charts").appendChild(fig);
    const slot = chartSlot(fig);
    charts.push(slot);
    zoomOutOnDoubleClick(slot, group);
    drawn.push([slot, name]);
    render(slot, specOf(name), group);
  }

  function redrawAll() {
    if (!shown) return;
    for (const [slot, name] of drawn) render(slot, specOf(name), group);
  }

  // --- figures ----------------------------------------------------------------------------------
  const dash = "–";
  const number = (v) => (v == null ? dash : formatValue(v));
  function figureRows(answer) {
    const rows = [["Duration", (f) => (f.duration_seconds == null ? "never started" : formatDuration(f.duration_seconds))]];
    for (const name of answer.charts) {
      const label = LABELS[name] || name;
      rows.push([`${label}, final`, (f) => number(f.curves[name] && f.curves[name].final)]);
      if (answer.jobs.some((j) => j.figures.curves[name] && j.figures.curves[name].best != null)) {
        rows.push([`${label}, best`, (f) => number(f.curves[name] && f.curves[name].best)]);
      }
    }
    rows.push(
      ["Global throughput, samples/s", (f) => (f.global_sps == null ? dash : formatCount(f.global_sps))],
      ["Per-trainer throughput, samples/s", (f) => (f.per_worker_sps == null ? dash : formatCount(f.per_worker_sps))],
      ["Speedup vs its baseline", (f) => (f.speedup == null ? dash : `${two.format(f.speedup)} (#${f.baseline})`)],
      ["Scaling efficiency", (f) => (f.efficiency == null ? dash : `${pct.format(f.efficiency * 100)} %`)],
      ["Cost", (f) => formatMoney(f.cost)],
      [`Samples ${perMoney}`, (f) => (f.samples_per_dollar == null ? dash : formatCompact(f.samples_per_dollar))],
      ["Progress", (f) => (f.progress == null ? dash : `${pct.format(Math.min(1, f.progress) * 100)} %`)],
    );
    return rows;
  }

  function renderFigures(answer) {
    const body = $("compare-figures").querySelector("tbody");
    body.replaceChildren(...figureRows(answer).map(([label, cell]) => {
      const tr = document.createElement("tr");
      const th = document.createElement("th");
      th.scope = "row";
      th.textContent = label;
      tr.appendChild(th);
      for (const job of answer.jobs) {
        const td = document.createElement("td");
        td.className = "num";
        td.textContent = cell(job.figures);
        tr.appendChild(td);
      }
      return tr;
    }));
  }

  async function start() {
    const status = $("compare-status");
    try {
      const answer = await getJson(`/api/v1/compare?jobs=${encodeURIComponent(section.dataset.jobs)}`);
      renderFigures(answer);
      const points = await Promise.all(answer.jobs.map(pointsOf));
      // Where each job's "time since start" counts from, as on its own page.
      const firsts = answer.jobs.map((job, i) =>
        timeOrigin(job.started ? Date.parse(job.started) / 1000 : null, Math.min(...[...points[i].values()].flat().map((p) => p.ts))));
      shown = { jobs: answer.jobs, points, firsts };
      $("compare-no-charts").hidden = answer.charts.length > 0;
      $("chart-controls").hidden = answer.charts.length === 0;
      const axes = new Set(["wall", "relative"]);
      for (const name of answer.charts) {
        for (const byName of points) for (const a of axesOf(reports(byName.get(name)))) axes.add(a);
        drawChart(name);
      }
      controls.offerAxes(X_AXES.filter((a) => axes.has(a)));
      status.textContent = `${answer.charts.length} shared metric${answer.charts.length === 1 ? "" : "s"}`;
      section.dataset.loaded = "true";
    } catch (e) {
      status.textContent = `could not load the comparison: ${e.message}`;
    }
  }

  resizeWith(() => charts);
  start();
}

startCompare();
