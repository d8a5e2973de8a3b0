import assert from "node:assert/strict";
import { test } from "node:test";

import { axesOf, layout, position, shortNumber, ticksOf } from "../../static/trainyard/experiment/parcoords.js";

const SPACE = {
  "--lr": { type: "float", low: 0.01, high: 1, log: true },
  "--batch-size": { type: "int", low: 16, high: 128 },
  $OPTIMIZER: { type: "choice", choices: ["sgd", "adam"] },
};
const OBJECTIVE = { metric: "eval_accuracy", goal: "max", unit: "epoch" };

test("the axes are the space's keys in order, on their own scales, then the objective over what was reached", () => {
  const axes = axesOf(SPACE, OBJECTIVE, [0.5, null, 0.9]);
  assert.deepEqual(axes.map((a) => [a.key, a.kind]), [["--lr", "log"], ["--batch-size", "linear"], ["$OPTIMIZER", "choice"], [null, "linear"]]);
  assert.equal(axes[3].label, "eval_accuracy ↑");
  assert.deepEqual([axes[3].low, axes[3].high], [0.5, 0.9]);
});

test("a log axis puts the geometric middle in the middle; choices are spread from bottom to top", () => {
  const [lr, batch, optimizer] = axesOf(SPACE, OBJECTIVE, []);
  assert.ok(Math.abs(position(lr, 0.1) - 0.5) < 1e-9);
  assert.equal(position(batch, 72), 0.5);
  assert.equal(position(optimizer, "sgd"), 0);
  assert.equal(position(optimizer, "adam"), 1);
  assert.equal(position(optimizer, "rmsprop"), null);
  assert.equal(position(lr, null), null);
  assert.equal(position(lr, 5), 1, "a value outside the range sits at its end");
});

test("a log scale with a bound at 0 or below is drawn linear, not as NaN", () => {
  const [axis] = axesOf({ "--x": { type: "float", low: 0, high: 1, log: true } }, OBJECTIVE, []);
  assert.equal(axis.kind, "linear");
});

test("ticks name every choice, or a range's ends and middle in short numbers", () => {
  const [lr, , optimizer] = axesOf(SPACE, OBJECTIVE, []);
  assert.deepEqual(ticksOf(lr).map((t) => t.text), ["0.01", "0.1", "1"]);
  assert.deepEqual(ticksOf(optimizer).map((t) => t.text), ["sgd", "adam"]);
  assert.equal(shortNumber(0.031622776), "0.0316");
  assert.equal(shortNumber(0.00001234), "1.2e-5");
});

test("each trial is one line across the axes, broken where it has no value yet", () => {
  const axes = axesOf({ "--lr": SPACE["--lr"] }, OBJECTIVE, [0, 1]);
  const drawing = layout(axes, [
    { number: 0, state: "completed", params: { "--lr": 0.01 }, value: 1 },
    { number: 1, state: "running", params: { "--lr": 1 }, value: null },
  ], 220, 120, { top: 10, right: 10, bottom: 10, left: 10 });
  assert.deepEqual(drawing.axes.map((a) => a.x), [10, 210]);
  assert.deepEqual(drawing.lines[0].segments, ["10,110 210,10"]);
  assert.deepEqual(drawing.lines[1].segments, ["10,10"]);
});
