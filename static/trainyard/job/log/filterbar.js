// The filter controls: instance tabs, role and node selects, stream boxes. They offer what the
// job has, and a change rebuilds the window under the new filter (filters.js says what it is).
import { renderNodeCounts } from "./counts.js";
import { topVisibleCursor } from "./dom.js";
import { filterOf, sameFilter, tabOffered } from "./filters.js";
import { loadAround, loadTail } from "./paging.js";

export function ensureTab(v, r) {
  const tabs = v.el.tabs;
  if (tabs.querySelector(`[data-tag="${CSS.escape(r.tag)}"]`)) return;
  const b = document.createElement("button");
  b.type = "button";
  b.className = "tab";
  b.setAttribute("role", "tab");
  b.dataset.tag = r.tag;
  b.dataset.role = r.role;
  b.dataset.index = r.index;
  b.textContent = `[${r.tag}]`;
  tabs.appendChild(b);
}

function setOptions(select, values, label) {
  const have = [...select.options].slice(1).map((o) => o.value);
  if (have.join("\n") === values.join("\n")) return;
  const current = select.value;
  select.replaceChildren(new Option(label, ""));
  for (const value of values) select.appendChild(new Option(value, value));
  select.value = values.includes(current) ? current : "";
}

export function syncOptions(v) {
  const replicas = v.s.job.replicas;
  const roles = [...new Set(replicas.map((r) => r.role))];
  const nodes = new Set(replicas.map((r) => r.node).filter(Boolean));
  for (const n of Object.keys(v.s.nodeCounts)) nodes.add(n);
  setOptions(v.el.role, roles, "all roles");
  setOptions(v.el.node, [...nodes].sort(), "all nodes");
  renderNodeCounts(v);
  // A choice that is no longer offered (say, a node the job left) falls back to "all".
  if (!sameFilter(readFilter(v), v.s.filter)) filterChanged(v);
}

function syncTabs(v) {
  const { el } = v;
  const byTag = new Map(v.s.job.replicas.map((r) => [r.tag, r]));
  for (const b of el.tabs.querySelectorAll(".tab")) {
    b.hidden = !tabOffered(byTag.get(b.dataset.tag), el.role.value, el.node.value);
    if (b.hidden && b.classList.contains("active")) selectTab(v, el.tabs.querySelector('.tab[data-tag=""]'));
  }
}

function selectTab(v, b) {
  v.el.tabs.querySelectorAll(".tab").forEach((t) => {
    t.classList.toggle("active", t === b);
    t.setAttribute("aria-selected", t === b ? "true" : "false");
  });
}

function readFilter(v) {
  const { el } = v;
  const active = el.tabs.querySelector(".tab.active");
  return filterOf({
    tab: active ? active.dataset : null,
    role: el.role.value,
    node: el.node.value,
    stdout: el.stdout.checked,
    stderr: el.stderr.checked,
  });
}

function filterChanged(v) {
  syncTabs(v);
  const next = readFilter(v);
  if (sameFilter(next, v.s.filter)) return;
  v.s.filter = next;
  // Following: show the newest matching lines. Paused: stay where the person was reading.
  const top = v.s.following ? null : topVisibleCursor(v);
  if (top === null) loadTail(v);
  else loadAround(v, top, "top", null);
}

export function listenToFilters(v) {
  const { el } = v;
  el.tabs.addEventListener("click", (ev) => {
    const b = ev.target.closest("button.tab");
    if (!b) return;
    selectTab(v, b);
    filterChanged(v);
  });
  for (const control of [el.role, el.node, el.stdout, el.stderr]) control.addEventListener("change", () => filterChanged(v));
}
