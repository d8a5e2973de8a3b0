// What the experiment page says about its budget and its trials, and the objective's curves of
// all trials on one chart: pure functions of the experiment's answer (GET /api/v1/experiments/
// ID, jobs/services/views/experiments.py) and the trials' metric points, with no page in them
// (tests/js/experiment_trials.test.js runs them in Node). ./main.js shows what they return.
import { align, curveOn, reports } from "../curves.js";
import { shortNumber } from "./parcoords.js";

// The trial states that have ended, and the experiment states that will change no more.
export const TRIAL_ENDED = ["completed", "pruned", "failed"];
export const EXPERIMENT_ENDED = ["stopped", "finished", "failed"];

// A parameter's value as the table and the best trial show it: numbers in three significant
// digits (0.0316), choices as they are.
export function paramValue(value) {
  if (typeof value === "number") return Number.isInteger(value) ? String(value) : shortNumber(value);
  if (value == null) return "–";
  return String(value);
}

// A space key naming a variable of the job ($OPTIMIZER) rather than an argument (--lr).
const isVariable = (key) => /^\$/.test(key);

// "--lr 0.0316 --batch-size 32 $OPTIMIZER=adam": a trial's parameters as its job gets them.
export function paramsText(params) {
  return Object.entries(params || {})
    .map(([key, value]) => (isVariable(key) ? `${key}=${paramValue(value)}` : `${key} ${paramValue(value)}`))
    .join(" ");
}

// "0.953", "–" for none.
export function objectiveText(value) {
  return typeof value === "number" && Number.isFinite(value) ? String(Number(value.toPrecision(4))) : "–";
}

const hours = (h) => `${Number((h || 0).toFixed(h >= 10 ? 1 : 3))} h`;

// The budget as rows {key, label, used, limit, left, fraction}: trials, trials at once, core-
// and GPU-hours; a limit of null is "no limit" (no fraction). `fraction` (0 to 1) draws the bar.
export function budgetRows(budget, used) {
  const rows = [];
  const row = (key, label, spent, limit, text) => {
    const fraction = limit ? Math.min(1, spent / limit) : null;
    rows.push({
      key,
      label,
      used: text(spent),
      limit: limit == null ? "no limit" : text(limit),
      left: limit == null ? "" : text(Math.max(0, limit - spent)),
      fraction,
    });
  };
  row("trials", "Trials", used.trials, budget.trials, String);
  row("parallel", "Running now", used.running, budget.parallel, String);
  row("core_hours", "Core-hours", used.core_hours, budget.core_hours, hours);
  if (budget.gpu_hours != null || used.gpu_hours) row("gpu_hours", "GPU-hours", used.gpu_hours, budget.gpu_hours, hours);
  return rows;
}

// A colour faded for a pruned trial's curve: the same hue, a quarter as strong.
export const faded = (colour) => `${colour}40`;

// The objective's curve of every trial with points on one axis (the experiment's unit: epoch
// or step, else time since the trial's first report), as plot.js draws a spec: one series per
// trial, labelled "#N", in `colours` by trial number, pruned ones faded and thinner, the best
// trial thicker. pointsByJob: Map job id -> that job's points of the objective metric.
export function curveSpec(trials, pointsByJob, unit, colours, bestTrial = null) {
  const drawn = [];
  for (const trial of trials) {
    const points = trial.job == null ? null : pointsByJob.get(trial.job);
    if (!points || !points.length) continue;
    drawn.push({ trial, reports: reports(points) });
  }
  const wanted = unit === "step" ? "step" : "epoch";
  const hasAxis = (axis) => drawn.every(({ reports: rs }) => rs.some((r) => (axis === "step" ? r.step : r.epoch) != null));
  const axis = drawn.length && hasAxis(wanted) ? wanted : drawn.length && hasAxis("step") ? "step" : "relative";
  const curves = drawn.map(({ reports: rs }) => curveOn(rs, axis, rs.length ? Math.min(...rs.map((r) => r.ts)) : 0));
  const series = drawn.map(({ trial }) => {
    const colour = colours[trial.number % colours.length];
    const pruned = trial.state === "pruned";
    return {
      label: `#${trial.number}`,
      stroke: pruned ? faded(colour) : colour,
      width: trial.number === bestTrial ? 3 : pruned ? 1 : 1.5,
      dash: trial.state === "failed" ? [4, 4] : undefined,
    };
  });
  return { axis, series, data: align(curves), trials: drawn.map(({ trial }) => trial.number) };
}

// The trials a "Compare" of the best ones opens: those with a job and an objective, best first
// by the goal, at most `limit` (the compare page takes 2 to 8); [] where fewer than two.
export function bestJobs(trials, goal, limit = 4) {
  const scored = trials.filter((t) => t.job != null && typeof t.objective_best === "number");
  scored.sort((a, b) => (goal === "min" ? a.objective_best - b.objective_best : b.objective_best - a.objective_best));
  const jobs = scored.slice(0, limit).map((t) => t.job);
  return jobs.length >= 2 ? jobs : [];
}
