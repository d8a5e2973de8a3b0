// The log's one request to the server: a page of lines (GET /api/v1/jobs/<id>/logs) under
// the view's filters, each line tagged as the page shows it.
import { tagOf } from "../../rules.js";
import { filterParams } from "./filters.js";

export async function getLogs(v, params) {
  const q = new URLSearchParams({ ...filterParams(v.s.filter), ...params });
  const r = await fetch(`/api/v1/jobs/${v.jobId}/logs?${q}`, { credentials: "same-origin" });
  if (!r.ok) throw new Error(`the server answered ${r.status}`);
  const page = await r.json();
  for (const line of page.lines) line.tag = tagOf(line.role, line.index);
  return page;
}
