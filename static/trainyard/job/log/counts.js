// Line counts per node (GET .../logs/counts), beside the log and in the node select.
import { formatCount } from "../../format.js";

export function renderNodeCounts(v) {
  const { el } = v;
  const counts = v.s.nodeCounts;
  const parts = [];
  for (const n of Object.keys(counts).sort()) {
    const span = document.createElement("span");
    span.className = "count";
    span.dataset.node = n;
    const b = document.createElement("strong");
    b.textContent = n;
    b.className = "node-name";
    span.append(b, ` ${formatCount(counts[n])}`);
    parts.push(span);
  }
  if (el.counts.dataset.total !== undefined) {
    const total = document.createElement("span");
    total.className = "count total";
    total.textContent = `${formatCount(Number(el.counts.dataset.total))} lines in all`;
    parts.push(total);
  }
  el.counts.replaceChildren(...parts);
  for (const o of el.node.options) {
    if (o.value) o.textContent = counts[o.value] !== undefined ? `${o.value} (${formatCount(counts[o.value])})` : o.value;
  }
}
