// New job form: the fields of the chosen image's framework, the program picker, and live
// totals by seed 004's formula (total = Σ package × instances per role) against what the quota
// has left. The formula's terms and the instance names are the server's (rules.js).
//
// The program picker offers the built-in examples (with what each does and takes), the
// scripts under the code root, the user's uploaded code (then a script in it) and a typed
// path. It only helps choose: the server checks whatever is sent.
import { formatPrice } from "./format.js";
import { isCharged, quotaResources, tagOf } from "./rules.js";

{
  const catalog = JSON.parse(document.getElementById("catalog").textContent);
  const form = document.getElementById("new-job");
  const packages = Object.fromEntries(catalog.packages.map((p) => [p.name, p]));
  const images = Object.fromEntries(catalog.images.map((i) => [i.name, i]));
  // The first example written for each framework (digits-ddp for PyTorch) is its default.
  const exampleFor = {};
  for (const e of catalog.examples) exampleFor[e.framework] ??= e.name;
  const value = (name) => form.elements[name].value;
  const count = (name) => parseInt(value(name), 10);
  const frameworkOf = Object.fromEntries(catalog.examples.map((e) => [e.name, e.framework]));
  // The menu's values besides examples and paths under the code root (jobs/forms.py).
  const PATH = "__path__";
  const SNAPSHOT = "snapshot:";
  // {sha256: {scripts: [...], entry_point}} for each upload of the user's.
  const snapshotFiles = JSON.parse(document.getElementById("snapshot-files").textContent);
  let shownFramework = null;
  let offeredSnapshot = null;

  function framework() {
    const image = images[value("image")];
    return image ? image.framework : "pytorch";
  }

  function programKind(script) {
    if (script === PATH) return "path";
    if (script.startsWith(SNAPSHOT)) return "snapshot";
    if (script in frameworkOf) return "example";
    return "code-root";
  }

  function showFields(fw) {
    for (const el of form.querySelectorAll("[data-framework]")) el.hidden = el.dataset.framework !== fw;
    // Switching image picks the built-in example written for it, unless a script of the
    // user's is chosen; on the first showing, a script already chosen (a form sent back with
    // an error, say) stays unless it is an example for another framework.
    const script = value("script");
    const switched = shownFramework !== null && fw !== shownFramework;
    const misfit = script in frameworkOf && frameworkOf[script] !== fw;
    if ((switched || misfit) && programKind(script) === "example" && exampleFor[fw]) {
      form.elements.script.value = exampleFor[fw];
    }
    shownFramework = fw;
    showProgram(value("script"));
  }

  // The boxes the choice needs (a typed path, a script in the upload) and what it is.
  function showProgram(script) {
    const kind = programKind(script);
    document.getElementById("field-script_path").hidden = kind !== "path";
    document.getElementById("field-snapshot_script").hidden = kind !== "snapshot";
    const about = kind === "example" ? script : kind;
    for (const el of document.querySelectorAll("#program-info [data-program]")) {
      el.hidden = el.dataset.program !== about;
    }
    if (kind === "snapshot") offerSnapshotScripts(script.slice(SNAPSHOT.length));
  }

  // The upload's Python files as suggestions, its likely entry point filled in unless the
  // box names one of its files (or, on the first showing, whatever was sent back).
  function offerSnapshotScripts(sha) {
    if (offeredSnapshot === sha) return;
    const first = offeredSnapshot === null;
    offeredSnapshot = sha;
    const files = snapshotFiles[sha] || { scripts: [], entry_point: "" };
    document.getElementById("snapshot-scripts").replaceChildren(...files.scripts.map((path) => {
      const option = document.createElement("option");
      option.value = path;
      return option;
    }));
    const input = form.elements.snapshot_script;
    if (!input.value || (!first && !files.scripts.includes(input.value))) input.value = files.entry_point;
  }

  // "the image's default" says what that default is; the restart fields only matter on failure.
  function showRestartDefault() {
    const image = images[value("image")];
    const option = form.elements.restart_policy.options[0];
    const r = image && image.restart;
    if (!r) return;
    option.textContent = r.policy === "on-failure"
      ? `the image's default: restart, up to ${r.max_restarts} times`
      : "the image's default: the job fails";
    const restarts = value("restart_policy") === "on-failure";
    for (const name of ["max_restarts", "restart_backoff_seconds", "exclude_failed_node"]) {
      document.getElementById(`field-${name}`).hidden = !restarts;
    }
  }

  // [(role, package, instances)] as the request will be made; the scheduler is not charged.
  function roleTerms(fw) {
    if (fw === "kvstore") {
      return [["server", packages[value("server_package")], count("servers")],
              ["worker", packages[value("worker_package")], count("workers")]];
    }
    const n = count("instances");
    const pkg = packages[value("package")];
    return n > 1 ? [["master", pkg, 1], ["worker", pkg, n - 1]] : [["master", pkg, 1]];
  }

  function chargedTerms(fw) {
    return roleTerms(fw).filter(([role]) => isCharged(role));
  }

  function tags(fw, terms) {
    const list = (role, n, from) => {
      const out = [];
      for (let i = from; i < from + Math.min(n, 3); i++) out.push(`[${tagOf(role, i)}]`);
      if (n > 3) out.push("…", `[${tagOf(role, from + n - 1)}]`);
      return out;
    };
    if (fw === "kvstore") {
      return [`[${tagOf("scheduler", 0)}]`, ...list("server", terms[0][2], 0), ...list("worker", terms[1][2], 0)];
    }
    return [`[${tagOf("master", 0)}]`, ...(terms[1] ? list("worker", terms[1][2], 1) : [])];
  }

  function batchNote(workers) {
    const match = value("args").match(/--batch-size[ =](\d+)/);
    const b = match ? parseInt(match[1], 10) : null;
    const mode = value("kvstore");
    if (mode === "dist_async") return "dist_async: each push updates the parameters at once; workers never wait for each other.";
    const global = b ? `${workers} × ${b} = ${workers * b}` : `${workers} × the per-worker batch`;
    const device = mode === "dist_device_sync" ? " On CPU, dist_device_sync behaves exactly like dist_sync." : "";
    return `Batch size means per worker: global batch = ${global}.${device}`;
  }

  function update() {
    const fw = framework();
    showFields(fw);
    showRestartDefault();
    const terms = roleTerms(fw);
    const rows = document.querySelectorAll("#totals tbody tr");
    if (terms.some(([, pkg, n]) => !pkg || !Number.isInteger(n) || n < 1)) {
      rows.forEach((r) => { r.querySelector(".need").textContent = "–"; });
      return;
    }
    const charged = chargedTerms(fw);
    const sum = (res) => charged.reduce((acc, [, pkg, n]) => acc + pkg[res] * n, 0);
    const need = { jobs: 1 };
    for (const r of quotaResources) need[r.key] = sum(r.key);
    const quota = catalog.quota;
    rows.forEach((row) => {
      const res = row.dataset.resource;
      row.querySelector(".need").textContent = need[res];
      const left = quota ? quota.left[res] : null;
      row.querySelector(".left").textContent = left === null ? "no quota" : left;
      const over = left === null || need[res] > left;
      row.classList.toggle("over", over);
      row.title = over && left !== null ? `over by ${need[res] - left}` : "";
    });
    const price = charged.reduce((acc, [, pkg, n]) => acc + parseFloat(pkg.price_per_hour) * n, 0);
    document.getElementById("price").textContent = formatPrice(price);
    const expr = (res) => charged.map(([role, pkg, n]) => `${role} ${pkg[res]}×${n}`).join(" + ") || "0";
    document.getElementById("formula").textContent = quotaResources
      .map((r) => `${r.formula_name} = ${expr(r.key)} = ${need[r.key]}${r.unit}`)
      .join("; ");
    document.getElementById("roles-preview").textContent = `Instances: ${tags(fw, terms).join(" ")}`;
    const notes = document.getElementById("ps-notes");
    notes.hidden = fw !== "kvstore";
    if (fw === "kvstore") {
      notes.textContent = "The scheduler (1 instance) is not charged: it only coordinates, beside server-0. " +
        batchNote(terms[1][2]);
    }
  }

  form.addEventListener("input", update);
  form.addEventListener("change", update);
  update();
}
