// What the job page's Artifacts section shows of GET /api/v1/jobs/ID/artifacts: no DOM here,
// so that tests/js can check it.

// "778 B", "3.4 kB", "12 MB", "1.2 GB": as the CLI says sizes (trainyard_cli/render.py).
export function formatBytes(size) {
  for (const [unit, suffix] of [[1e9, "GB"], [1e6, "MB"], [1e3, "kB"]]) {
    if (size >= unit) return `${Number((size / unit).toPrecision(3))} ${suffix}`;
  }
  return `${size} B`;
}

// The download address of a file of the job's: each name of its path encoded on its own, so
// that a name the job chose ("epoch #1?.pt") stays one name and never a query or a fragment.
export function artifactHref(jobId, path) {
  const names = path.split("/").map((name) => encodeURIComponent(name));
  return `/api/v1/jobs/${encodeURIComponent(jobId)}/artifacts/${names.join("/")}`;
}

// The file name a download is saved under: the path's last name.
export const fileName = (path) => path.slice(path.lastIndexOf("/") + 1);

// What to say above the list: how many files, and where the listing came from.
export function summaryOf(listing) {
  const n = listing.files.length;
  const files = n === 0 ? "No files" : n === 1 ? "1 file" : `${n} files`;
  return `${files}, as ${listing.node} sees the job's folders.`;
}

// An API refusal ({"errors": {field: [message]}}) as one sentence for the page.
export function refusalText(status, body) {
  const messages = body && body.errors ? Object.values(body.errors).flat() : [];
  return messages.length ? messages.join(" ") : `The console answered ${status}.`;
}
