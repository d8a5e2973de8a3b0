// The viewer's side of "what a log line shows" against the server's: the same cases
// (tests/fixtures/logtext/cases.json, pinned by tests/unit/test_logshape.py) and the server's
// casefold table (casefold.json, checked there to be jobs/logshape.casefold_exceptions()).
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import { casefold, findRanges, pieces, plainOf, segmentsOf } from "../../static/trainyard/job/log/text.js";

const fixture = (name) => JSON.parse(readFileSync(new URL(`../fixtures/logtext/${name}`, import.meta.url), "utf8"));
const cases = fixture("cases.json");
const fold = fixture("casefold.json");

// A line as the server sends it: `shown` only when the text does not show as it is.
const served = (c) => (c.segments.length === 1 && c.segments[0][0] === c.text ? { text: c.text } : { text: c.text, shown: c.segments });

for (const c of cases) {
  test(`shows and finds as the server does: ${c.name}`, () => {
    const segments = segmentsOf(served(c));
    assert.deepEqual(segments, c.segments);
    assert.equal(plainOf(segments), c.shown);
    assert.deepEqual(findRanges(c.needle, c.shown, fold), c.hits);
  });
}

test("folds as str.casefold: lowercase but for the server's exceptions", () => {
  assert.equal(casefold("Straße ΣΑΣ ς", fold), "strasse σασ σ");
  assert.equal(casefold("ABC", {}), "abc");
});

test("an empty query or line matches nothing", () => {
  assert.deepEqual(findRanges("", "anything", fold), []);
  assert.deepEqual(findRanges("x", "", fold), []);
  assert.deepEqual(segmentsOf({ text: "" }), []);
});

test("pieces cut segments where matches start and end", () => {
  const segments = [["ab", ""], ["cd", "ansi-red"], ["ef", ""]];
  assert.deepEqual(pieces(segments, [[1, 5]]), [
    { text: "a", cls: "", marked: false },
    { text: "b", cls: "", marked: true },
    { text: "cd", cls: "ansi-red", marked: true },
    { text: "e", cls: "", marked: true },
    { text: "f", cls: "", marked: false },
  ]);
  assert.deepEqual(pieces(segments, []).map((p) => p.text), ["ab", "cd", "ef"]);
});

test("pieces count code points, as the server's hits do", () => {
  assert.deepEqual(pieces([["😀 hi", ""]], [[2, 4]]), [
    { text: "😀 ", cls: "", marked: false },
    { text: "hi", cls: "", marked: true },
  ]);
});
