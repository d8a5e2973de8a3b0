// Job page: the Artifacts section. The files are listed only when asked (the button): a node
// agent reads the job's folders for each listing, which takes a moment and most visits never
// need. Every name is the job's own text, so it is set as text, never as markup.
import { formatLocalTime } from "../format.js";
import { artifactHref, fileName, formatBytes, refusalText, summaryOf } from "./artifact_list.js";

const section = document.getElementById("artifacts-section");
const button = document.getElementById("artifacts-load");
const status = document.getElementById("artifacts-status");
const table = document.getElementById("artifacts-table");
const notes = document.getElementById("artifacts-notes");
const jobId = section.dataset.job;

function cell(row, text) {
  const td = row.insertCell();
  td.textContent = text;
  return td;
}

function showFiles(listing) {
  const body = table.tBodies[0];
  body.replaceChildren();
  for (const file of listing.files) {
    const row = body.insertRow();
    row.dataset.path = file.path;
    cell(row, file.path);
    cell(row, file.kind);
    cell(row, formatBytes(file.size)).title = `${file.size} bytes`;
    cell(row, formatLocalTime(new Date(file.modified)));
    const link = document.createElement("a");
    link.href = artifactHref(jobId, file.path);
    link.download = fileName(file.path);
    link.textContent = "Download";
    row.insertCell().append(link);
  }
  table.hidden = listing.files.length === 0;
  const lines = [
    ...listing.refused.map((r) => `Not served: ${r.path}: ${r.reason}`),
    ...listing.notes,
  ];
  notes.replaceChildren(...lines.map((text) => Object.assign(document.createElement("li"), { textContent: text })));
}

async function load() {
  button.disabled = true;
  status.textContent = "Asking a node for the job's files…";
  try {
    const r = await fetch(`/api/v1/jobs/${jobId}/artifacts`, { credentials: "same-origin" });
    const body = await r.json().catch(() => null);
    if (!r.ok) {
      status.textContent = refusalText(r.status, body);
      return;
    }
    showFiles(body);
    status.textContent = summaryOf(body);
    button.textContent = "Refresh";
  } catch (e) {
    status.textContent = `The console could not be reached (${e.message}).`;
  } finally {
    button.disabled = false;
  }
}

button.addEventListener("click", load);
