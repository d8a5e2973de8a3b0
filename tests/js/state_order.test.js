import assert from "node:assert/strict";
import { test } from "node:test";

import { isOlderState } from "../../static/trainyard/state_order.js";

const at = (ended, attempt, step) => ({ state_order: [ended, attempt, step] });

test("a state from earlier in the same attempt is older", () => {
  assert.equal(isOlderState(at(0, 0, 3), at(0, 0, 2)), true); // running, then a late queued
  assert.equal(isOlderState(at(0, 0, 2), at(0, 0, 3)), false);
});

test("the same state again is taken: its replicas may have changed", () => {
  assert.equal(isOlderState(at(0, 0, 3), at(0, 0, 3)), false);
});

test("a later attempt is newer whatever its step; an end is newer than any attempt", () => {
  assert.equal(isOlderState(at(0, 1, 1), at(0, 0, 3)), true);
  assert.equal(isOlderState(at(0, 0, 3), at(0, 1, 1)), false);
  assert.equal(isOlderState(at(0, 2, 1), at(1, 1, 0)), false); // succeeded before its stop
  assert.equal(isOlderState(at(1, 1, 0), at(0, 2, 1)), true);
});

test("a state without an order is always taken", () => {
  assert.equal(isOlderState(at(0, 0, 3), { state: "queued" }), false);
  assert.equal(isOlderState({ state: "running" }, at(0, 0, 2)), false);
});
