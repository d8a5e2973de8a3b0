import assert from "node:assert/strict";
import { test } from "node:test";

import { filterOf, filterParams, isFiltered, lineMatches, nothingSelected, sameFilter, tabOffered } from "../../static/trainyard/job/log/filters.js";
import { ALL } from "../../static/trainyard/job/log/state.js";

const controls = { tab: null, role: "", node: "", stdout: true, stderr: true };
const line = { tag: "worker-1", role: "worker", index: 1, node: "node-a", stream: "stdout" };

test("no choice is every line and no query parameter", () => {
  const f = filterOf(controls);
  assert.ok(sameFilter(f, ALL));
  assert.deepEqual(filterParams(f), {});
  assert.ok(!isFiltered(f));
  assert.ok(lineMatches(f, line));
});

test("an instance tab overrides the role select", () => {
  const f = filterOf({ ...controls, role: "master", tab: { tag: "worker-2", role: "worker", index: "2" } });
  assert.deepEqual(filterParams(f), { role: "worker", index: "2" });
  assert.ok(!lineMatches(f, line));
  assert.ok(lineMatches(f, { ...line, tag: "worker-2", index: 2 }));
  // The "all" tab (tag "") leaves the role select in charge.
  assert.deepEqual(filterParams(filterOf({ ...controls, role: "master", tab: { tag: "" } })), { role: "master" });
});

test("one stream is a stream parameter; neither is nothing to show", () => {
  const stderr = filterOf({ ...controls, stdout: false });
  assert.deepEqual(filterParams(stderr), { stream: "stderr" });
  assert.ok(!lineMatches(stderr, line));
  assert.ok(lineMatches(stderr, { ...line, stream: "stderr" }));
  const none = filterOf({ ...controls, stdout: false, stderr: false });
  assert.ok(nothingSelected(none));
  assert.deepEqual(filterParams(none), {});
});

test("a node filters by node", () => {
  const f = filterOf({ ...controls, node: "node-b" });
  assert.deepEqual(filterParams(f), { node: "node-b" });
  assert.ok(!lineMatches(f, line));
});

test("a tab is offered when its instance fits the role and node chosen", () => {
  const r = { role: "worker", node: "node-a" };
  assert.ok(tabOffered(r, "", ""));
  assert.ok(tabOffered(r, "worker", "node-a"));
  assert.ok(!tabOffered(r, "master", ""));
  assert.ok(!tabOffered(r, "", "node-b"));
  assert.ok(tabOffered(undefined, "master", "node-b")); // the "all" tab
});
