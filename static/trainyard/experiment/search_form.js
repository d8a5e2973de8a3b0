// The New job form's "Search…" part (templates/jobs/_search.html): rows of parameters to
// search, one added or removed at a time, and the names the job offers to search (its
// arguments' flags and its variables) as suggestions. It only helps to fill the form: the
// server (jobs/experiment_forms.py, then the experiment service) judges what is sent.

// The flags in an argument line ("--epochs 3 --lr=0.1" -> ["--epochs", "--lr"]), in order, once.
export function flagsOf(args) {
  const flags = [];
  for (const word of String(args || "").split(/\s+/)) {
    const flag = word.replace(/['"]/g, "").split("=")[0];
    if (/^--?[A-Za-z][\w-]*$/.test(flag) && !flags.includes(flag)) flags.push(flag);
  }
  return flags;
}

// The variables of the job's environment box ("NAME=value" a line) as "$NAME".
export function variablesOf(env) {
  const names = [];
  for (const line of String(env || "").split("\n")) {
    const name = line.split("=")[0].trim();
    if (/^[A-Za-z_][A-Za-z0-9_]*$/.test(name) && !names.includes(`$${name}`)) names.push(`$${name}`);
  }
  return names;
}

export function startSearchPart(form) {
  const part = document.getElementById("search");
  if (!part) return;
  const body = part.querySelector("#search-space tbody");

  // A row's boxes that mean something for its type (a range for numbers, a list for choices)
  // stand out; the others fade. Never disabled: a disabled box is not sent, and the rows are
  // sent as parallel lists, which would then no longer line up.
  function showRow(row) {
    const choice = row.querySelector("[name=search-space-type]").value === "choice";
    for (const name of ["low", "high", "scale", "step", "choices"]) {
      const box = row.querySelector(`[name=search-space-${name}]`);
      box.classList.toggle("unused", (name === "choices") !== choice);
    }
  }

  part.addEventListener("change", (event) => {
    const row = event.target.closest(".search-row");
    if (row) showRow(row);
  });
  part.addEventListener("click", (event) => {
    if (!event.target.classList.contains("search-row-remove")) return;
    const row = event.target.closest(".search-row");
    if (body.rows.length > 1) row.remove();
    else for (const input of row.querySelectorAll("input")) input.value = "";
  });
  document.getElementById("search-add-row").addEventListener("click", () => {
    const row = body.rows[body.rows.length - 1].cloneNode(true);
    for (const input of row.querySelectorAll("input")) input.value = "";
    for (const select of row.querySelectorAll("select")) select.selectedIndex = 0;
    body.append(row);
    showRow(row);
    row.querySelector("input").focus();
  });

  function offerKeys() {
    const keys = [...flagsOf(form.elements.args.value), ...(form.elements.env ? variablesOf(form.elements.env.value) : [])];
    document.getElementById("search-keys").replaceChildren(...keys.map((key) => {
      const option = document.createElement("option");
      option.value = key;
      return option;
    }));
  }
  // Only the settings the chosen pruner takes (the server sends only those).
  const prunerFields = JSON.parse(document.getElementById("search-pruner-fields").textContent);
  const pruner = form.elements["search-pruner"];
  function showPrunerFields() {
    const shown = prunerFields[pruner.value] || [];
    for (const fields of Object.values(prunerFields)) {
      for (const name of fields) document.getElementById(`field-search-${name}`).hidden = !shown.includes(name);
    }
  }
  pruner.addEventListener("change", showPrunerFields);
  showPrunerFields();

  form.elements.args.addEventListener("input", offerKeys);
  if (form.elements.env) form.elements.env.addEventListener("input", offerKeys);
  offerKeys();
  for (const row of body.rows) showRow(row);
}
