import assert from "node:assert/strict";
import { test } from "node:test";

import { attemptSeparator } from "../../static/trainyard/job/log/attempts.js";
import { END } from "../../static/trainyard/job/log/state.js";
import {
  firstLineCursor, indexAt, lastCursor, lastLineCursor, matchIndex, nextMatch, pendingLines, reachesLive, takeFromBottom, takeFromTop,
} from "../../static/trainyard/job/log/window.js";

const line = (cursor, attempt = 0) => ({ cursor, attempt });
const cursorsOf = (items) => items.map((it) => it.cursor);

test("the window's edges", () => {
  const end = { notice: "end", cursor: END };
  const win = [{ notice: "gap", cursor: 0.5 }, line(1), line(2), end];
  assert.equal(firstLineCursor(win), 1);
  assert.equal(lastLineCursor(win, end), 2);
  assert.equal(lastCursor(win), END);
  assert.equal(firstLineCursor([]), null);
  assert.equal(lastLineCursor([], null), null);
  assert.equal(lastCursor([]), -1);
});

test("dropping from the top takes a separator left before the first line", () => {
  const win = [line(1), attemptSeparator(line(2, 1)), line(2, 1), line(3, 1)];
  const gone = takeFromTop(win, 1);
  assert.deepEqual(cursorsOf(gone), [1, 1.5]);
  assert.deepEqual(cursorsOf(win), [2, 3]);
  assert.deepEqual(takeFromTop(win, 0), []);
});

test("dropping from the bottom takes a separator left after the last line", () => {
  const win = [line(1), attemptSeparator(line(2, 1)), line(2, 1)];
  const gone = takeFromBottom(win, 1);
  assert.deepEqual(cursorsOf(gone), [2, 1.5]);
  assert.deepEqual(cursorsOf(win), [1]);
});

test("indexAt finds the first item reaching below y", () => {
  const win = [0, 1, 2, 3].map((i) => ({ bottom: (i + 1) * 10 }));
  const bottomOf = (it) => it.bottom;
  assert.equal(indexAt(win, 0, bottomOf), 0);
  assert.equal(indexAt(win, 10, bottomOf), 1);
  assert.equal(indexAt(win, 15, bottomOf), 1);
  assert.equal(indexAt(win, 40, bottomOf), 4);
});

test("pending lines count lines, not notices", () => {
  assert.equal(pendingLines([line(1), { notice: "gap", cursor: 1.5 }, line(2)]), 2);
});

test("a page reaches the live lines when it is short, complete, or meets them", () => {
  const full = (next) => ({ lines: new Array(3), next, complete: false });
  assert.ok(reachesLive({ lines: [], next: 0, complete: false }, 3, [], null, 10));
  assert.ok(reachesLive({ ...full(5), complete: true }, 3, [], null, 10));
  assert.ok(!reachesLive(full(5), 3, [], null, 10));
  assert.ok(reachesLive(full(10), 3, [], null, 10));
  assert.ok(reachesLive(full(6), 3, [line(7)], null, 10)); // the buffer starts right after it
  assert.ok(!reachesLive(full(6), 3, [], null, null)); // nothing came over the websocket yet
});

test("matches: which one an item is, and the next in either direction", () => {
  const win = [{ match: false }, { match: true }, { match: false }, { match: true }];
  assert.equal(matchIndex(win, win[3]), 2);
  assert.equal(matchIndex(win, win[0]), 0);
  assert.equal(nextMatch(win, 1, 1), 3);
  assert.equal(nextMatch(win, 3, 1), -1);
  assert.equal(nextMatch(win, 3, -1), 1);
  assert.equal(nextMatch(win, -1, 1), 1);
});
