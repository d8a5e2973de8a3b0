// New job form: live totals by seed 004's formula and what the quota has left.
(function () {
  "use strict";
  const catalog = JSON.parse(document.getElementById("catalog").textContent);
  const form = document.getElementById("new-job");
  const byName = Object.fromEntries(catalog.packages.map((p) => [p.name, p]));
  const field = (name) => form.elements[name];

  function togglePath() {
    const wantsPath = field("script").value === "__path__";
    document.getElementById("field-script_path").hidden = !wantsPath;
  }

  function update() {
    togglePath();
    const pkg = byName[field("package").value];
    const n = parseInt(field("instances").value, 10);
    const rows = document.querySelectorAll("#totals tbody tr");
    if (!pkg || !Number.isInteger(n) || n < 1) {
      rows.forEach((r) => { r.querySelector(".need").textContent = "–"; });
      return;
    }
    // PyTorch: 1 master + (n - 1) workers, all on the chosen package.
    const terms = n > 1 ? [[1, "master"], [n - 1, "worker"]] : [[1, "master"]];
    const need = { cpu: pkg.cpu * n, gpus: pkg.gpus * n, memory_gb: pkg.memory_gb * n, jobs: 1 };
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
    const price = (parseFloat(pkg.price_per_hour) * n).toFixed(2);
    document.getElementById("price").textContent = price;
    const expr = (per) => terms.map(([count]) => `${per}×${count}`).join(" + ");
    document.getElementById("formula").textContent =
      `CPU_total = ${expr(pkg.cpu)} = ${need.cpu}; GPU_total = ${expr(pkg.gpus)} = ${need.gpus}; ` +
      `Memory_total = ${expr(pkg.memory_gb)} = ${need.memory_gb} GB`;
    const tags = ["[master]"];
    for (let i = 1; i < n && i <= 3; i++) tags.push(`[worker-${i}]`);
    if (n > 4) tags.push("…", `[worker-${n - 1}]`);
    document.getElementById("roles-preview").textContent = `Instances: ${tags.join(" ")}`;
  }

  form.addEventListener("input", update);
  form.addEventListener("change", update);
  update();
})();
