// The New-job form's health-rule editor. Its fields are built from the server's description of
// the rule kinds (jobs/healthrules.describe_kinds, sent as #health-rule-kinds): each kind's
// parameters with their type, default, bounds and help, and the actions. What it writes is the
// form's JSON box (#id_health_rules, in "As JSON"), which Launch sends and which stays open to
// editing; the box is the one truth, and the rows are rebuilt from it when it is typed in.
//
// No rule is judged here: every change sends the box to the server (data-check-rules), whose
// parser says what is wrong with each rule, and with the list. Launch is judged again in full.

const CHECK_WAIT_MS = 300;

export function startRuleEditor(form, imageRules) {
  const described = JSON.parse(document.getElementById("health-rule-kinds").textContent);
  const kinds = Object.fromEntries(described.kinds.map((k) => [k.kind, k]));
  const box = form.elements.health_rules;
  const list = document.getElementById("rule-list");
  const note = document.getElementById("rules-note");
  const listError = document.getElementById("rules-error");
  const addButton = document.getElementById("add-rule");
  const imageButton = document.getElementById("image-rules");
  let checkWaiting = null;
  let checkNumber = 0;

  const option = (value, text, title) => {
    const o = document.createElement("option");
    o.value = value;
    o.textContent = text;
    if (title) o.title = title;
    return o;
  };

  // A select of the server's choices; a value it does not list (typed in the JSON) is kept, so
  // that the server can say what is wrong with it.
  function choiceSelect(choices, chosen, role) {
    const select = document.createElement("select");
    select.dataset.role = role;
    for (const [value, text, title] of choices) select.append(option(value, text, title));
    if (chosen !== undefined && !choices.some(([value]) => value === chosen)) {
      select.append(option(String(chosen), String(chosen)));
    }
    if (chosen !== undefined) select.value = String(chosen);
    return select;
  }

  function labelled(text, control, help) {
    const label = document.createElement("label");
    label.className = "rule-param";
    const words = document.createElement("span");
    words.textContent = text;
    label.append(words, control);
    if (help) label.title = help;
    return label;
  }

  function paramInput(param, value) {
    if (param.type === "choice") {
      const select = choiceSelect(param.choices.map((c) => [c, c]), value ?? param.default, "param");
      select.dataset.param = param.name;
      return select;
    }
    const input = document.createElement("input");
    input.type = "text";
    input.dataset.role = "param";
    input.dataset.param = param.name;
    input.spellcheck = false;
    if (param.type === "number") input.inputMode = "decimal";
    if (value !== undefined && value !== null) input.value = typeof value === "string" ? value : JSON.stringify(value);
    if (param.default !== null) input.placeholder = String(param.default);
    else if (param.type === "metric") input.placeholder = "any metric";
    else if (param.required) input.placeholder = "required";
    return input;
  }

  // One row: kind, action, the kind's parameters, a name, Remove, and the server's verdict.
  function ruleRow(rule) {
    const row = document.createElement("li");
    row.className = "rule";
    const verdict = document.createElement("p");
    verdict.className = "error rule-verdict";
    verdict.hidden = true;
    const remove = document.createElement("button");
    remove.type = "button";
    remove.className = "remove-rule";
    remove.textContent = "Remove";
    remove.addEventListener("click", () => { row.remove(); written(); });
    const kind = rule && typeof rule === "object" && !Array.isArray(rule) ? kinds[rule.kind] : undefined;
    if (!kind) {
      // Not a rule the editor can lay out (a typo'd kind, not an object): the JSON box edits it.
      row.dataset.raw = JSON.stringify(rule);
      const words = document.createElement("code");
      words.textContent = row.dataset.raw;
      row.append(words, remove, verdict);
      return row;
    }
    const kindSelect = choiceSelect(described.kinds.map((k) => [k.kind, k.kind, k.help]), rule.kind, "kind");
    // Another kind takes other parameters: the row is laid out again for it.
    kindSelect.addEventListener("change", () => {
      const next = ruleRow({ ...readRow(row), kind: kindSelect.value });
      row.replaceWith(next);
      written();
    });
    const actionSelect = choiceSelect(
      described.actions.map((a) => [a.action, a.action, a.help]), rule.action ?? described.actions[0].action, "action");
    const help = document.createElement("small");
    help.className = "muted rule-help";
    help.textContent = kind.help;
    const params = kind.params.map((p) => labelled(
      p.name, paramInput(p, rule[p.name]), [p.help, p.bounds].filter(Boolean).join(" ")));
    const name = document.createElement("input");
    name.type = "text";
    name.dataset.role = "name";
    name.maxLength = described.max_name_chars;
    if (typeof rule.name === "string") name.value = rule.name;
    row.append(
      labelled("kind", kindSelect), labelled("action", actionSelect), ...params,
      labelled("name", name, "Optional: how the job page and the log call this rule"),
      remove, help, verdict,
    );
    return row;
  }

  // What a row says, as the JSON the server reads: a parameter left empty is left out (the
  // server fills its default); a number that does not read as one is sent as typed, for the
  // server to name.
  function readRow(row) {
    if (row.dataset.raw !== undefined) return JSON.parse(row.dataset.raw);
    const rule = {};
    for (const control of row.querySelectorAll("[data-role]")) {
      const text = control.value.trim();
      if (control.dataset.role === "kind" || control.dataset.role === "action") {
        rule[control.dataset.role] = control.value;
      } else if (control.dataset.role === "name") {
        if (text) rule.name = text;
      } else if (text) {
        // Right after a change of kind the row still shows the old kind's parameters.
        const param = kinds[rule.kind].params.find((p) => p.name === control.dataset.param);
        if (!param) continue;
        const number = Number(text);
        rule[param.name] = param.type === "number" && Number.isFinite(number) ? number : text;
      }
    }
    return rule;
  }

  function showRows(rules) {
    list.replaceChildren(...(rules || []).map(ruleRow));
    showNote(rules);
  }

  function showNote(rules) {
    if (rules === null) {
      const count = imageRules().length;
      note.textContent = `None of your own: the job gets its image's rules (${count}).`;
    } else if (!rules.length) {
      note.textContent = "No health rules at all: nothing is watched.";
    } else {
      note.textContent = "These rules replace the image's.";
    }
    imageButton.hidden = Array.isArray(rules) && rules.length > 0;
  }

  // The rows changed: write the box, then have the server check it.
  function written() {
    const rules = [...list.children].map(readRow);
    box.value = rules.length ? `[\n${rules.map((r) => `  ${JSON.stringify(r)}`).join(",\n")}\n]` : "";
    showNote(rules.length ? rules : null);
    check(false);
  }

  // Numbered when the change is made, so that an answer still on its way about an earlier
  // state of the box (the first check, say) is dropped, not drawn over the change.
  function check(rebuild) {
    const number = ++checkNumber;
    clearTimeout(checkWaiting);
    checkWaiting = setTimeout(() => sendCheck(rebuild, number), CHECK_WAIT_MS);
  }

  async function sendCheck(rebuild, number) {
    const body = new URLSearchParams();
    body.set("csrfmiddlewaretoken", form.elements.csrfmiddlewaretoken.value);
    body.set("health_rules", box.value);
    let answer;
    try {
      const response = await fetch(form.dataset.checkRules, {
        method: "POST", body, credentials: "same-origin", headers: { Accept: "application/json" },
      });
      answer = await response.json();
    } catch (error) {
      answer = { rules: undefined, verdicts: [], error: `The rules could not be checked: ${error.message}` };
    }
    if (number !== checkNumber) return; // a later change has been sent: its answer counts
    // Typed in the box: the rows show what the server read there (a list only).
    if (rebuild && (answer.rules === null || Array.isArray(answer.rules))) showRows(answer.rules);
    showVerdicts(answer);
  }

  function showVerdicts(answer) {
    [...list.children].forEach((row, i) => {
      const verdict = answer.verdicts[i] || {};
      const message = row.querySelector(".rule-verdict");
      message.textContent = verdict.error || "";
      message.hidden = !verdict.error;
      row.classList.toggle("invalid", Boolean(verdict.error));
      const name = row.querySelector("[data-role=name]");
      if (name && verdict.name) name.placeholder = verdict.name;
    });
    const problem = answer.error || (answer.errors ? Object.values(answer.errors).flat().join(" ") : "");
    listError.textContent = problem || "";
    listError.hidden = !problem;
  }

  addButton.addEventListener("click", () => {
    list.append(ruleRow({ kind: described.kinds[0].kind, action: described.actions[0].action }));
    written();
  });
  imageButton.addEventListener("click", () => {
    showRows(structuredClone(imageRules()));
    written();
  });
  list.addEventListener("input", (event) => { if (event.target.dataset.role !== "kind") written(); });
  box.addEventListener("input", () => check(true));
  document.getElementById("rule-buttons").hidden = false;
  check(true);
}
