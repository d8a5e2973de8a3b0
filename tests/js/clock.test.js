import assert from "node:assert/strict";
import { test } from "node:test";

import { formatElapsed, formatElapsedTicks } from "../../static/trainyard/clock.js";

test("time since start reads as a clock of the run", () => {
  assert.equal(formatElapsed(45), "0:45");
  assert.equal(formatElapsed(725), "12:05");
  assert.equal(formatElapsed(3720), "1:02:00");
  assert.equal(formatElapsed(7.25, 1), "0:07.3");
});

test("ticks under a second apart are told apart by their tenths", () => {
  assert.deepEqual(formatElapsedTicks([7.2, 7.4, 7.6]), ["0:07.2", "0:07.4", "0:07.6"]);
  assert.deepEqual(formatElapsedTicks([0, 30, 60]), ["0:00", "0:30", "1:00"]);
});
