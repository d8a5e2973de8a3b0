// Every part of the log view links (each name it imports is exported where it says) and the
// entry main.js imports keeps its shape. The parts that touch the DOM need a document only
// when called; rules.js reads the server's rules block when loaded, so this gives it one.
import assert from "node:assert/strict";
import { test } from "node:test";

test("the log view's modules link and the entry is the one main.js imports", async () => {
  const rules = { tags: { solo_roles: [], format: "{role}-{index}" }, states: { terminal: [], waiting: [] }, quota: {}, money: {}, log: { casefold: {} } };
  globalThis.document = { getElementById: () => ({ textContent: JSON.stringify(rules) }) };
  try {
    const logview = await import("../../static/trainyard/job/logview.js");
    assert.equal(typeof logview.createLogView, "function");
    assert.equal(logview.TAIL, 2000);
  } finally {
    delete globalThis.document;
  }
});
