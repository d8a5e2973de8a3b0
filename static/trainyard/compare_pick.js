// The job list's "Compare": tick 2 to 8 jobs, press Compare, and /compare/?jobs=12,15,19 opens.
// The picks live in the list's URL (?compare=12,15: a job page's "Compare with…" opens the
// list so), and travel with the filter form, so that a job found by a filter joins those
// ticked before.
const MIN = 2;
const MAX = 8;

function startPicking() {
  const form = document.getElementById("compare-form");
  if (!form) return;
  const button = document.getElementById("compare-button");
  const hint = document.getElementById("compare-hint");
  const field = document.getElementById("compare-jobs");
  const boxes = [...document.querySelectorAll("input.compare-pick")];
  const asked = new URLSearchParams(window.location.search).get("compare") || "";
  const picked = [...new Set(asked.split(",").filter((s) => /^[1-9]\d*$/.test(s)))];

  for (const box of boxes) {
    box.checked = picked.includes(box.value);
    box.addEventListener("change", () => {
      const at = picked.indexOf(box.value);
      if (box.checked && at < 0) picked.push(box.value);
      if (!box.checked && at >= 0) picked.splice(at, 1);
      update();
    });
  }

  function update() {
    const n = picked.length;
    field.value = picked.join(",");
    button.disabled = n < MIN || n > MAX;
    button.textContent = n ? `Compare ${n}` : "Compare";
    hint.textContent =
      n === 0 ? `Tick ${MIN} to ${MAX} jobs to compare them.` :
      n < MIN ? `#${picked[0]} picked: tick at least one more.` :
      n > MAX ? `${n} picked: compare at most ${MAX}.` :
      `Jobs ${picked.map((id) => `#${id}`).join(", ")}`;
  }

  const filter = document.getElementById("job-filter");
  if (filter) {
    filter.addEventListener("submit", () => {
      if (!picked.length) return;
      const keep = document.createElement("input");
      keep.type = "hidden";
      keep.name = "compare";
      keep.value = picked.join(",");
      filter.appendChild(keep);
    });
  }
  update();
}

startPicking();
