import assert from "node:assert/strict";
import { test } from "node:test";

import {
  align, attemptBreaks, axesOf, breakAt, completeTotals, curveOn, effectiveAxis, forLogScale, reports, smooth, tickSteps, timeOrigin,
  viewFrom,
} from "../../static/trainyard/curves.js";

const point = (role, index, step, epoch, ts, value) => ({ role, index, step, epoch, ts, value });

test("reports are the mean over the processes that reported a step, at the latest of their times", () => {
  const rs = reports([point("master", 0, 10, 1, 100, 2), point("worker", 1, 10, 1, 103, 4), point("master", 0, 20, 2, 110, 1)]);
  assert.deepEqual(rs.map((r) => [r.step, r.epoch, r.ts, r.value, r.processes]), [[10, 1, 103, 3, 2], [20, 2, 110, 1, 1]]);
});

test("a process that reported a step twice (a restart going over it again) counts once, with its later value", () => {
  const rs = reports([point("master", 0, 10, 1, 100, 9), point("worker", 1, 10, 1, 101, 4), point("master", 0, 10, 1, 200, 2)]);
  assert.deepEqual(rs.map((r) => [r.value, r.sum, r.processes, r.ts]), [[3, 6, 2, 200]]);
  assert.deepEqual(completeTotals([point("master", 0, 5, null, 1, 100), point("master", 0, 5, null, 2, 120)]).map((r) => r.value), [120]);
});

test("a point with no step is keyed by its epoch, and one with neither by its time", () => {
  const rs = reports([point("w", 0, null, 0.5, 1, 1), point("w", 1, null, 0.5, 2, 3), point("w", 0, null, null, 5, 7)]);
  assert.deepEqual(rs.map((r) => [r.epoch, r.value]), [[0.5, 2], [null, 7]]);
});

test("global throughput sums a step only once every process has reported it: no staircase", () => {
  // Rank 0 reports epoch 1, rank 1 has not yet; then both; then rank 0 alone at epoch 2.
  const points = [
    point("master", 0, 50, 1, 100, 300),
    point("worker", 1, 50, 1, 101, 280),
    point("master", 0, 100, 2, 110, 310),
  ];
  assert.deepEqual(completeTotals(points).map((r) => [r.step, r.value]), [[50, 580]]);
  points.push(point("worker", 1, 100, 2, 112, 290));
  const totals = completeTotals(points);
  assert.deepEqual(totals.map((r) => [r.epoch, r.ts, r.value]), [[1, 101, 580], [2, 112, 600]]);
  // The totals only rise and fall with the throughput, never with who has reported.
  assert.deepEqual(curveOn(totals, "epoch"), [[1, 580], [2, 600]]);
});

test("a report sits on each axis where it has that coordinate; time since start counts from the origin", () => {
  const rs = reports([point("w", 0, 4, 0.5, 1000, 1), point("w", 0, null, null, 1010, 2)]);
  assert.deepEqual(curveOn(rs, "step"), [[4, 1]]);
  assert.deepEqual(curveOn(rs, "epoch"), [[0.5, 1]]);
  assert.deepEqual(curveOn(rs, "wall"), [[1000, 1], [1010, 2]]);
  assert.deepEqual(curveOn(rs, "relative", 990), [[10, 1], [20, 2]]);
  assert.deepEqual(axesOf(rs), ["step", "epoch", "wall", "relative"]);
  assert.deepEqual(axesOf(reports([point("w", 0, null, null, 5, 1)])), ["wall", "relative"]);
});

test("a chart falls back to an axis its data has", () => {
  assert.equal(effectiveAxis("epoch", ["step", "epoch", "wall", "relative"]), "epoch");
  assert.equal(effectiveAxis("epoch", ["step", "wall", "relative"]), "step");
  assert.equal(effectiveAxis("step", ["wall", "relative"]), "wall");
  assert.equal(effectiveAxis("step", ["wall", "relative"], "relative"), "relative");
  assert.equal(effectiveAxis("relative", ["wall", "relative"]), "relative");
});

test("smoothing is TensorBoard's debiased EMA: 0 is the raw curve, the first point is itself", () => {
  const ys = [1, 0, 1, 0];
  assert.deepEqual(smooth(ys, 0), ys);
  const s = smooth(ys, 0.5);
  assert.equal(s[0], 1); // debiased: not pulled towards 0
  assert.ok(Math.abs(s[1] - 1 / 3) < 1e-12); // (0.25 + 0) / 0.75
  assert.ok(Math.abs(s[2] - 5 / 7) < 1e-12);
  // Holes and breaks stay where they are and do not move the average.
  const holed = smooth([2, undefined, null, 4], 0.5);
  assert.deepEqual(holed.slice(0, 3), [2, undefined, null]);
  assert.ok(Math.abs(holed[3] - (0.5 * 0.5 * 2 + 0.5 * 4) / 0.75) < 1e-12); // as if next to 2
  // A constant stays constant at any weight.
  for (const y of smooth([5, 5, 5, 5], 0.99)) assert.ok(Math.abs(y - 5) < 1e-9);
  assert.deepEqual(smooth([3, 4], "nonsense"), [3, 4]);
});

test("a log scale leaves out 0 and below, and says whether anything is left", () => {
  const { ys, dropped, drawable } = forLogScale([1, 0, -2, null, 10]);
  assert.deepEqual(ys, [1, undefined, undefined, null, 10]);
  assert.equal(dropped, 2);
  assert.equal(drawable, true);
  assert.equal(forLogScale([0, -1, null]).drawable, false);
});

test("lines break between attempts on a time axis", () => {
  const attempts = [
    { started: "2026-01-01T00:00:00+00:00", finished: "2026-01-01T00:01:40+00:00" },
    { started: "2026-01-01T00:05:00+00:00", finished: null },
  ];
  const [end] = attemptBreaks(attempts);
  const t0 = Date.parse("2026-01-01T00:00:00Z") / 1000;
  assert.equal(end, t0 + 100);
  assert.deepEqual(attemptBreaks(attempts.slice(1)), []);
  const line = [[t0 + 90, 1], [t0 + 98, 2], [t0 + 310, 3]];
  assert.deepEqual(breakAt(line, [end]), [[t0 + 90, 1], [t0 + 98, 2], [end, null], [t0 + 310, 3]]);
  assert.deepEqual(breakAt(line, []), line);
});

test("aligned series join across another's x values (undefined) but not across a break (null)", () => {
  const data = align([[[1, 10], [3, 30]], [[2, 20], [2.5, null], [3, 31]]]);
  assert.deepEqual(data, [[1, 2, 2.5, 3], [10, undefined, undefined, 30], [undefined, 20, null, 31]]);
});


test("a kept view is made safe before it is used", () => {
  assert.deepEqual(viewFrom({ smoothing: 0.6, log: true, x: "epoch" }), { smoothing: 0.6, log: true, x: "epoch" });
  assert.deepEqual(viewFrom({ smoothing: 7, log: "yes", x: "<img>" }), { smoothing: 0.99, log: false, x: null });
  assert.deepEqual(viewFrom(null), { smoothing: 0, log: false, x: null });
  assert.deepEqual(viewFrom({ smoothing: "NaN" }), { smoothing: 0, log: false, x: null });
});

test("steps and epochs tick on whole numbers only; time since start in round seconds", () => {
  for (const axis of ["step", "epoch"]) assert.ok(tickSteps(axis).every((s) => Number.isInteger(s) && s >= 1));
  assert.ok(tickSteps("relative").includes(60));
  assert.equal(tickSteps("wall"), null);
  // A run whose training took a second still gets ticks.
  assert.ok(tickSteps("relative").includes(0.1));
});

test("time since start counts from the job's start, or from its first report where that came earlier", () => {
  assert.equal(timeOrigin(100, 100.5), 100);
  // The trainer reported 19 ms before the console heard that the job had started: no point at -0.019 s.
  assert.equal(timeOrigin(100, 99.981), 99.981);
  assert.equal(timeOrigin(null, 42), 42);
  assert.equal(timeOrigin(100, Infinity), 100); // no report yet
  assert.deepEqual(curveOn([point("master", 0, 1, null, 99.981, 2)], "relative", timeOrigin(100, 99.981)), [[0, 2]]);
});
