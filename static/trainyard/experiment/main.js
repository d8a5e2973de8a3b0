// The experiment page (templates/jobs/experiment_detail.html): its state and reason, the budget
// used and left, the best trial so far with Run again / Edit and run again / Compare, the
// objective's curves of every trial on one chart (../plot.js, as the job and compare pages
// draw), parallel coordinates of the parameters against the objective (an SVG of our own,
// ./parcoords.js), and the trials' table.
//
// It starts from the answer the server put in the page and, while the experiment is active,
// asks again every REFRESH_MS: GET /api/v1/experiments/ID (the same presenter), and each trial
// job's new points of the objective, GET /api/v1/jobs/J/metrics?name=METRIC&after=CURSOR.
// Experiments have no websocket channel; a refresh every few seconds is what a search needs.
// Once the experiment has ended and every ended trial's points are read, it stops asking.
//
// Everything shown is built with createElement / textContent: names, parameters and reasons
// are data, never markup.
import { formatClockTime, formatCompact, formatLocalTime, formatMoney } from "../format.js";
import { chartSlot, COLOURS, render, resizeWith } from "../plot.js";
import { axesOf, layout } from "./parcoords.js";
import {
  bestJobs, budgetRows, curveSpec, EXPERIMENT_ENDED, objectiveText, paramsText, paramValue, TRIAL_ENDED,
} from "./trials.js";

const REFRESH_MS = 5000;
const SVG = "http://www.w3.org/2000/svg";
const PARCOORDS_HEIGHT = 260;
const PARCOORDS_PAD = { top: 34, right: 48, bottom: 16, left: 48 };

function startExperimentPage() {
  const section = document.getElementById("experiment");
  if (!section) return;
  const $ = (id) => document.getElementById(id);
  const urlOf = (template, id) => template.replace("/0/", `/${id}/`);
  const colourOf = (number) => COLOURS[number % COLOURS.length];
  let detail = JSON.parse($("experiment-detail").textContent);
  const metric = detail.objective.metric;
  const keys = Object.keys(detail.space || {});
  const pointsByJob = new Map(); // job id -> its points of the objective
  const cursorOf = new Map(); // job id -> the metrics cursor read up to
  const settled = new Set(); // jobs whose trial had ended when their points were last read
  const chart = chartSlot($("objective-chart"));

  const cell = (text, className = "") => {
    const td = document.createElement("td");
    td.textContent = text;
    if (className) td.className = className;
    return td;
  };
  const link = (href, text) => {
    const a = document.createElement("a");
    a.href = href;
    a.textContent = text;
    return a;
  };

  function showState() {
    const state = detail.state;
    section.dataset.state = state;
    const badge = $("experiment-state");
    badge.textContent = state;
    badge.className = `state state-${state}`;
    $("experiment-reason").textContent = detail.reason || "";
    for (const control of section.querySelectorAll("[data-when]")) {
      control.hidden = !control.dataset.when.split(" ").includes(state);
    }
    const ended = $("experiment-ended");
    if (detail.ended && ended && !ended.dateTime) {
      ended.dateTime = detail.ended;
      ended.textContent = formatLocalTime(new Date(detail.ended));
    }
  }

  function showBudget() {
    const body = $("budget").tBodies[0];
    body.replaceChildren(...budgetRows(detail.budget, detail.used).map((row) => {
      const tr = document.createElement("tr");
      tr.dataset.budget = row.key;
      const th = document.createElement("th");
      th.textContent = row.label;
      const bar = document.createElement("td");
      if (row.fraction !== null) {
        const track = document.createElement("div");
        track.className = "progress-track";
        const fill = document.createElement("div");
        fill.className = "progress-fill";
        fill.style.width = `${Math.round(row.fraction * 100)}%`;
        track.append(fill);
        bar.append(track);
      }
      tr.append(th, cell(row.used, "num"), cell(row.limit, "num"), cell(row.left, "num"), bar);
      return tr;
    }));
  }

  function showBest() {
    const best = detail.best;
    $("best").hidden = !best;
    $("best-none").hidden = !!best;
    if (!best) return;
    $("best-value").textContent = `${metric} ${objectiveText(best.value)}`;
    $("best-trial").textContent = best.job == null ? `trial #${best.trial}` : `trial #${best.trial}, job #${best.job}`;
    $("best-params").textContent = paramsText(best.params);
    // A trial whose job was deleted keeps its figures, but there is nothing to run again.
    $("best-run-again-form").hidden = best.job == null;
    $("best-edit-again").hidden = best.job == null;
    if (best.job != null) {
      $("best-run-again-form").action = urlOf(section.dataset.runAgainUrl, best.job);
      $("best-edit-again").href = urlOf(section.dataset.editAgainUrl, best.job);
    }
    const compared = bestJobs(detail.trials || [], detail.objective.goal);
    const compare = $("best-compare");
    compare.hidden = compared.length < 2;
    compare.href = `${section.dataset.compareUrl}?jobs=${compared.join(",")}`;
    compare.textContent = `Compare the best ${compared.length}`;
  }

  function showTrials() {
    const trials = detail.trials || [];
    const bestTrial = detail.best ? detail.best.trial : null;
    $("trials-count").textContent = `${trials.length} of ${detail.budget.trials}`;
    $("trials").tBodies[0].replaceChildren(...trials.map((t) => {
      const tr = document.createElement("tr");
      tr.dataset.trial = t.number;
      tr.className = `trial-${t.state}${t.number === bestTrial ? " best" : ""}`;
      const number = cell(`#${t.number}`);
      const swatch = document.createElement("span");
      swatch.className = "swatch";
      swatch.style.background = colourOf(t.number);
      number.prepend(swatch, " ");
      const state = document.createElement("td");
      const badge = document.createElement("span");
      badge.className = `state state-${t.state}`;
      badge.textContent = t.state;
      state.append(badge);
      const job = document.createElement("td");
      job.className = "trial-job";
      if (t.job != null) {
        job.append(link(urlOf(section.dataset.jobUrl, t.job), `#${t.job}`));
        if (t.job_state) job.append(` ${t.job_state}`);
      } else job.textContent = "–";
      const reason = cell((t.reason || "").split("\n")[0], "trial-reason");
      reason.title = t.reason || "";
      tr.append(
        number,
        state,
        ...keys.map((key) => cell(paramValue((t.params || {})[key]), "num param")),
        cell(objectiveText(t.objective_best), "num"),
        cell(objectiveText(t.objective_last), "num"),
        cell(t.judged_through == null ? "–" : String(t.judged_through), "num"),
        cell(typeof t.cost === "number" ? formatMoney(t.cost) : "–", "num"),
        cell(typeof t.samples_per_dollar === "number" ? formatCompact(t.samples_per_dollar) : "–", "num"),
        job,
        reason,
      );
      return tr;
    }));
  }

  function showCurves() {
    const trials = detail.trials || [];
    const spec = curveSpec(trials, pointsByJob, detail.objective.unit, COLOURS, detail.best ? detail.best.trial : null);
    render(chart, spec);
    chart.fig.dataset.trials = spec.trials.join(",");
  }

  function svg(tag, attrs) {
    const el = document.createElementNS(SVG, tag);
    for (const [name, value] of Object.entries(attrs)) el.setAttribute(name, String(value));
    return el;
  }

  function showParallelCoordinates() {
    const box = $("parcoords-plot");
    const trials = (detail.trials || []).filter((t) => t.state !== "waiting");
    const values = trials.map((t) => t.objective_best);
    const axes = axesOf(detail.space, detail.objective, values);
    const width = Math.max(320, box.clientWidth);
    const drawing = layout(axes, trials.map((t) => ({ ...t, value: t.objective_best })), width, PARCOORDS_HEIGHT, PARCOORDS_PAD);
    const root = svg("svg", { width, height: PARCOORDS_HEIGHT, viewBox: `0 0 ${width} ${PARCOORDS_HEIGHT}`, role: "img", class: "parcoords" });
    const title = document.createElementNS(SVG, "title");
    title.textContent = `Parameters against ${metric}, one line per trial`;
    root.append(title);
    drawing.axes.forEach((axis, i) => {
      root.append(svg("line", { x1: axis.x, x2: axis.x, y1: axis.top, y2: axis.bottom, class: "pc-axis" }));
      // The first and last labels run inwards, so that neither is cut at the edge.
      const last = i === drawing.axes.length - 1;
      const anchor = i === 0 ? "start" : last ? "end" : "middle";
      const label = svg("text", { x: axis.x + (i === 0 ? -6 : last ? 6 : 0), y: 14, class: "pc-label", "text-anchor": anchor });
      label.textContent = axis.label;
      root.append(label);
      for (const tick of axis.ticks) {
        const text = svg("text", { x: axis.x + 5, y: tick.y + 4, class: "pc-tick", "text-anchor": "start" });
        text.textContent = tick.text;
        root.append(svg("line", { x1: axis.x, x2: axis.x + 3, y1: tick.y, y2: tick.y, class: "pc-axis" }), text);
      }
    });
    const bestTrial = detail.best ? detail.best.trial : null;
    // The best last, so that it is drawn over the others.
    const lines = [...drawing.lines].sort((a, b) => (a.number === bestTrial) - (b.number === bestTrial));
    for (const line of lines) {
      const group = svg("g", { class: `pc-trial pc-${line.state}${line.number === bestTrial ? " pc-best" : ""}`, "data-trial": line.number, stroke: colourOf(line.number), fill: colourOf(line.number) });
      const name = document.createElementNS(SVG, "title");
      const trial = trials.find((t) => t.number === line.number);
      name.textContent = `#${line.number} ${line.state}: ${paramsText(trial.params)} → ${metric} ${objectiveText(trial.objective_best)}`;
      group.append(name);
      for (const segment of line.segments) {
        group.append(svg("polyline", { points: segment }));
        for (const point of segment.split(" ")) {
          const [cx, cy] = point.split(",");
          group.append(svg("circle", { cx, cy, r: 2.5 }));
        }
      }
      root.append(group);
    }
    box.replaceChildren(root);
    box.dataset.lines = String(drawing.lines.length);
  }

  function showAll() {
    showState();
    showBudget();
    showBest();
    showTrials();
    showCurves();
    showParallelCoordinates();
  }

  async function getJson(path) {
    const response = await fetch(path, { credentials: "same-origin", headers: { Accept: "application/json" } });
    if (!response.ok) throw new Error(`${path}: HTTP ${response.status}`);
    return response.json();
  }

  // Each trial job's new points of the objective; a trial that has ended is read once more
  // after its end, then no longer.
  async function readPoints() {
    for (const trial of detail.trials || []) {
      const job = trial.job;
      if (job == null || settled.has(job)) continue;
      const ended = TRIAL_ENDED.includes(trial.state);
      for (;;) {
        const after = cursorOf.get(job) || 0;
        const base = urlOf(section.dataset.metricsUrl, job);
        const page = await getJson(`${base}?name=${encodeURIComponent(metric)}&after=${after}`);
        const list = pointsByJob.get(job) || [];
        for (const p of page.points || []) if (typeof p.value === "number" && Number.isFinite(p.value)) list.push(p);
        pointsByJob.set(job, list);
        if (typeof page.next !== "number" || page.next <= after) break;
        cursorOf.set(job, page.next);
      }
      if (ended) settled.add(job);
    }
  }

  const finished = () => EXPERIMENT_ENDED.includes(detail.state)
    && (detail.trials || []).every((t) => t.job == null || settled.has(t.job));

  async function refresh(askExperiment) {
    const note = $("refresh-note");
    try {
      if (askExperiment) detail = await getJson(section.dataset.api);
      await readPoints();
      showAll();
      note.textContent = finished()
        ? ""
        : `Refreshed every ${REFRESH_MS / 1000} s while it runs · last at ${formatClockTime(new Date())}`;
    } catch (error) {
      note.textContent = `Not refreshed: ${error.message}; trying again in ${REFRESH_MS / 1000} s.`;
    }
    section.dataset.loaded = "true";
    // "true" once nothing more will change: the page asks no more (tests wait for it).
    section.dataset.settled = String(finished());
    if (!finished()) setTimeout(() => refresh(true), REFRESH_MS);
  }

  showAll();
  resizeWith(() => [chart]);
  window.addEventListener("resize", () => showParallelCoordinates());
  refresh(false);
}

startExperimentPage();
