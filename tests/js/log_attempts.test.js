import assert from "node:assert/strict";
import { test } from "node:test";

import { attemptSeparator, olderWithSeparators, tagText, withSeparators } from "../../static/trainyard/job/log/attempts.js";

const line = (cursor, attempt = 0) => ({ cursor, attempt, tag: "worker-1" });
const kinds = (items) => items.map((it) => (it.notice ? `sep${it.attempt + 1}` : it.cursor));

test("a tag names the attempt after the first", () => {
  assert.equal(tagText(line(1)), "[worker-1] ");
  assert.equal(tagText(line(1, 1)), "[worker-1 · attempt 2] ");
});

test("a separator sits before the first line of another attempt", () => {
  const sep = attemptSeparator(line(7, 2));
  assert.deepEqual(sep, { notice: "attempt", attempt: 2, cursor: 6.5, text: "— attempt 3 —" });
  assert.deepEqual(kinds(withSeparators([line(1), line(2), line(3, 1), line(4, 1)], null)), [1, 2, "sep2", 3, 4]);
});

test("lines of one attempt come back as they are", () => {
  const items = [line(1), line(2)];
  assert.equal(withSeparators(items, null), items);
});

test("the line before the new items decides the first separator", () => {
  assert.deepEqual(kinds(withSeparators([line(5, 1)], line(4, 0))), ["sep2", 5]);
  assert.deepEqual(kinds(withSeparators([line(5, 1)], null)), [5]);
});

test("older items get a separator before the window when the attempt changes there", () => {
  assert.deepEqual(kinds(olderWithSeparators([line(1), line(2)], [line(3, 1)])), [1, 2, "sep2"]);
  assert.deepEqual(kinds(olderWithSeparators([line(1), line(2)], [line(3)])), [1, 2]);
});
