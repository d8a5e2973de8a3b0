// New job form: the fields of the chosen image's framework, and live totals by seed 004's
// formula (total = Σ package × instances per role) against what the quota has left. The
// formula's terms and the instance names are the server's (rules.js).
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
  let shownFramework = null;

  function framework() {
    const image = images[value("image")];
    return image ? image.framework : "pytorch";
  }

  function showFields(fw) {
    for (const el of form.querySelectorAll("[data-framework]")) el.hidden = el.dataset.framework !== fw;
    document.getElementById("field-script_path").hidden = value("script") !== "__path__";
    // Switching image picks the built-in example written for it, unless a path is chosen; on
    // the first showing, a script already chosen (a form sent back with an error, say) stays
    // unless it is an example for another framework.
    const script = value("script");
    const switched = shownFramework !== null && fw !== shownFramework;
    const misfit = script in frameworkOf && frameworkOf[script] !== fw;
    if ((switched || misfit) && script !== "__path__" && exampleFor[fw]) {
      form.elements.script.value = exampleFor[fw];
    }
    shownFramework = fw;
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
    document.getElementById("price").textContent = price.toFixed(2);
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
