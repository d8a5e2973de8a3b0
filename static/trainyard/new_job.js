// New job form: the fields of the chosen image's framework, the program picker, the health-rule
// editor (rule_editor.js), and live totals (total = Σ package × instances per role) against what
// the quota has left. The totals, price, formula, advice, the instances' names and what a
// parameter-server job's batch size means are the server's answer (POST data-preview, the
// functions Launch is judged by): this script computes none of them.
//
// The program picker offers the built-in examples (with what each does and takes), the
// scripts under the code root, the user's uploaded code (then a script in it) and a typed
// path. It only helps choose: the server checks whatever is sent.
import { formatPrice } from "./format.js";
import { startRuleEditor } from "./rule_editor.js";
import { startSearchPart } from "./experiment/search_form.js";

{
  const catalog = JSON.parse(document.getElementById("catalog").textContent);
  const form = document.getElementById("new-job");
  const images = Object.fromEntries(catalog.images.map((i) => [i.name, i]));
  // The first example written for each framework (digits-ddp for PyTorch) is its default.
  const exampleFor = {};
  for (const e of catalog.examples) exampleFor[e.framework] ??= e.name;
  const value = (name) => form.elements[name].value;
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

  // The chosen image's notes (rendered by the server, one line per image): its default
  // variables, where its trainers run, and which images of their own users may bring, whose
  // field shows only where the image lets one in (a value typed there stays, to be refused
  // with its reason, rather than vanish unseen).
  function showImageNotes() {
    for (const line of document.querySelectorAll(".image-env[data-image], .image-runs-in[data-image], .image-brought[data-image]")) {
      line.hidden = line.dataset.image !== value("image");
    }
    const brought = document.getElementById("field-container_image");
    const lets = ((images[value("image")] || {}).user_image_prefixes || []).length > 0;
    if (brought) brought.hidden = !lets && !form.elements.container_image.value;
  }

  // The fields the preview needs; a change to any other does not ask the server again.
  const SHAPE = ["image", "package", "instances", "kvstore", "server_package", "servers",
    "worker_package", "workers", "args"];
  const PREVIEW_WAIT_MS = 250; // typing "12" asks once, not for "1" and then "12"
  let previewWaiting = null;
  let previewAsked = null;
  let previewNumber = 0;

  function askPreview() {
    const body = new URLSearchParams();
    body.set("csrfmiddlewaretoken", value("csrfmiddlewaretoken"));
    for (const name of SHAPE) body.set(name, value(name));
    if (form.elements.one_instance_per_node.checked) body.set("one_instance_per_node", "on");
    const key = body.toString();
    if (key === previewAsked) return;
    previewAsked = key;
    // Numbered at the change: an answer about the fields as they were before it is dropped.
    const number = ++previewNumber;
    clearTimeout(previewWaiting);
    previewWaiting = setTimeout(() => fetchPreview(body, number), PREVIEW_WAIT_MS);
  }

  // Answers can arrive out of order: only the latest change's answer is shown.
  async function fetchPreview(body, number) {
    const totals = document.getElementById("totals");
    totals.setAttribute("aria-busy", "true");
    let answer;
    try {
      const response = await fetch(form.dataset.preview, {
        method: "POST", body, credentials: "same-origin", headers: { Accept: "application/json" },
      });
      answer = { ok: response.ok, ...(await response.json()) };
    } catch (error) {
      answer = { ok: false, errors: { __all__: [`No preview: ${error.message}`] } };
    }
    if (number !== previewNumber) return;
    totals.removeAttribute("aria-busy");
    showPreview(answer);
  }

  function showPreview(answer) {
    const rows = document.querySelectorAll("#totals tbody tr");
    const advice = document.getElementById("advice");
    const lines = [];
    if (!answer.ok) {
      rows.forEach((r) => { r.querySelector(".need").textContent = "–"; r.classList.remove("over"); });
      for (const [field, messages] of Object.entries(answer.errors || {})) {
        const label = document.querySelector(`#field-${field} label`);
        for (const m of messages) lines.push(label ? `${label.textContent}: ${m}` : m);
      }
      for (const id of ["price", "formula", "roles-preview"]) document.getElementById(id).textContent = "";
      document.getElementById("ps-notes").hidden = true;
    } else {
      rows.forEach((row) => {
        const res = row.dataset.resource;
        const need = answer.need[res];
        const left = answer.left ? answer.left[res] : null;
        row.querySelector(".need").textContent = need;
        row.querySelector(".left").textContent = left === null ? "no quota" : left;
        const over = left === null || need > left;
        row.classList.toggle("over", over);
        row.title = over && left !== null ? `over by ${need - left}` : "";
      });
      document.getElementById("price").textContent = formatPrice(Number(answer.price_per_hour));
      document.getElementById("formula").textContent = answer.formula;
      document.getElementById("roles-preview").textContent = `Instances: ${answer.instances.join(" ")}`;
      const notes = document.getElementById("ps-notes");
      notes.hidden = !answer.notes;
      notes.textContent = answer.notes || "";
      lines.push(...answer.over, ...answer.never);
    }
    advice.replaceChildren(...lines.map((text) => {
      const p = document.createElement("p");
      p.textContent = text;
      return p;
    }));
    if (answer.fits_with) {
      const fits = document.createElement("p");
      fits.id = "fits-with";
      fits.textContent = answer.fits_with;
      advice.append(fits);
    }
    advice.hidden = !advice.childElementCount;
  }

  // The Slurm options the chosen pool lets a job choose, with only its values: none on
  // Trainyard's own nodes. The server checks the choice against the pool whatever is sent.
  const pools = Object.fromEntries((catalog.pools || []).map((p) => [p.name, p.choices]));
  function showSlurmOptions() {
    const choices = pools[form.elements.pool ? value("pool") : ""];
    for (const option of ["partition", "account", "qos", "constraint", "reservation"]) {
      const select = form.elements[`slurm_${option}`];
      if (!select) continue;
      const allowed = (choices && choices[option]) || [];
      document.getElementById(`field-slurm_${option}`).hidden = !allowed.length;
      for (const choice of select.options) choice.hidden = choice.value !== "" && !allowed.includes(choice.value);
      if (!allowed.includes(select.value)) select.value = "";
    }
    const exclusive = form.elements.slurm_exclusive;
    if (exclusive) {
      const offered = Boolean(choices && choices.exclusive);
      document.getElementById("field-slurm_exclusive").hidden = !offered;
      if (!offered) exclusive.checked = false;
    }
  }

  function update() {
    const fw = framework();
    showFields(fw);
    showSlurmOptions();
    showRestartDefault();
    showImageNotes();
    askPreview();
  }

  form.addEventListener("input", update);
  form.addEventListener("change", update);
  update();
  startRuleEditor(form, () => (images[value("image")] || {}).health_rules || []);
  startSearchPart(form);
}
