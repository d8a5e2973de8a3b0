// The job page's Artifacts section: sizes, download addresses and messages (artifact_list.js).
import assert from "node:assert/strict";
import { test } from "node:test";

import { artifactHref, fileName, formatBytes, refusalText, summaryOf } from "../../static/trainyard/job/artifact_list.js";

test("sizes read as the CLI writes them", () => {
  assert.equal(formatBytes(778), "778 B");
  assert.equal(formatBytes(3400), "3.4 kB");
  assert.equal(formatBytes(12_000_000), "12 MB");
  assert.equal(formatBytes(1_234_567_890), "1.23 GB");
});

test("each name of a path stays one name in the download address", () => {
  assert.equal(artifactHref(42, "checkpoints/latest.pt"), "/api/v1/jobs/42/artifacts/checkpoints/latest.pt");
  assert.equal(
    artifactHref(42, "outputs/epoch #1?/a b.pt"),
    "/api/v1/jobs/42/artifacts/outputs/epoch%20%231%3F/a%20b.pt",
  );
  assert.equal(fileName("outputs/eval/predictions.csv"), "predictions.csv");
});

test("the summary and refusals say what happened", () => {
  assert.equal(summaryOf({ files: [], node: "node-1" }), "No files, as node-1 sees the job's folders.");
  assert.equal(summaryOf({ files: [{}], node: "node-2" }), "1 file, as node-2 sees the job's folders.");
  assert.equal(
    refusalText(503, { errors: { artifacts: ["node-1 did not answer within 15 s."] } }),
    "node-1 did not answer within 15 s.",
  );
  assert.equal(refusalText(502, null), "The console answered 502.");
});
