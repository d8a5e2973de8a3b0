import assert from "node:assert/strict";
import { test } from "node:test";

import { bestJobs, budgetRows, curveSpec, faded, objectiveText, paramsText } from "../../static/trainyard/experiment/trials.js";

test("parameters read as the job gets them: arguments with their value, variables as NAME=value", () => {
  assert.equal(paramsText({ "--lr": 0.031622776, "--batch-size": 32, $OPTIMIZER: "adam" }), "--lr 0.0316 --batch-size 32 $OPTIMIZER=adam");
  assert.equal(objectiveText(0.953333), "0.9533");
  assert.equal(objectiveText(null), "–");
});

test("the budget says what was used and what is left, and a missing limit is no limit", () => {
  const rows = budgetRows({ trials: 12, parallel: 3, core_hours: 2, gpu_hours: null }, { trials: 5, running: 2, core_hours: 0.5, gpu_hours: 0 });
  assert.deepEqual(rows.map((r) => [r.key, r.used, r.limit, r.left]), [
    ["trials", "5", "12", "7"], ["parallel", "2", "3", "1"], ["core_hours", "0.5 h", "2 h", "1.5 h"],
  ]);
  assert.equal(rows[0].fraction, 5 / 12);
  const unlimited = budgetRows({ trials: 4, parallel: 2, core_hours: null, gpu_hours: 1 }, { trials: 4, running: 0, core_hours: 0.01, gpu_hours: 0 });
  assert.deepEqual(unlimited.map((r) => [r.key, r.limit, r.left, r.fraction]), [
    ["trials", "4", "0", 1], ["parallel", "2", "2", 0], ["core_hours", "no limit", "", null], ["gpu_hours", "1 h", "1 h", 0],
  ]);
});

const point = (epoch, value, ts) => ({ role: "master", index: 0, step: epoch * 10, epoch, ts, value });

test("every trial with points is one series on the epoch axis; pruned ones are faded, the best is thicker", () => {
  const trials = [
    { number: 0, state: "completed", job: 10 },
    { number: 1, state: "pruned", job: 11 },
    { number: 2, state: "waiting", job: null },
  ];
  const points = new Map([[10, [point(1, 0.5, 1), point(2, 0.8, 2)]], [11, [point(1, 0.3, 5)]]]);
  const spec = curveSpec(trials, points, "epoch", ["#111111", "#222222"], 0);
  assert.equal(spec.axis, "epoch");
  assert.deepEqual(spec.trials, [0, 1]);
  assert.deepEqual(spec.series.map((s) => [s.label, s.stroke, s.width]), [["#0", "#111111", 3], ["#1", faded("#222222"), 1]]);
  assert.deepEqual(spec.data, [[1, 2], [0.5, 0.8], [0.3, undefined]]);
});

test("Compare opens the best trials by the goal, and nothing with fewer than two", () => {
  const trials = [
    { number: 0, job: 10, objective_best: 0.5 },
    { number: 1, job: 11, objective_best: 0.9 },
    { number: 2, job: null, objective_best: null },
    { number: 3, job: 13, objective_best: 0.7 },
  ];
  assert.deepEqual(bestJobs(trials, "max"), [11, 13, 10]);
  assert.deepEqual(bestJobs(trials, "min", 2), [10, 13]);
  assert.deepEqual(bestJobs(trials.slice(0, 1), "max"), []);
});

test("the search offers the job's flags and variables, each once", async () => {
  const { flagsOf, variablesOf } = await import("../../static/trainyard/experiment/search_form.js");
  assert.deepEqual(flagsOf("--epochs 3 --lr=0.1 data.csv -v --epochs 4 '--batch-size'"), ["--epochs", "--lr", "-v", "--batch-size"]);
  assert.deepEqual(variablesOf("OPTIMIZER=adam\n\n bad line\nSEED=1\nOPTIMIZER=sgd"), ["$OPTIMIZER", "$SEED"]);
});
