// The bar over a page's charts (templates/jobs/_chart_controls.html): smoothing, log scale and
// the x axis for every chart of the page, kept in localStorage under one key per page so that
// a reload (or the next job's page) keeps them, and the "Zoom out" button while zoomed.
import { chartGroup } from "./plot.js";
import { viewFrom } from "./curves.js";

const STORE_PREFIX = "trainyard.charts.";

function kept(page) {
  try {
    return viewFrom(JSON.parse(window.localStorage.getItem(STORE_PREFIX + page) || "{}"));
  } catch {
    return viewFrom({}); // unreadable or blocked storage: the defaults
  }
}

function keep(page, view) {
  try {
    window.localStorage.setItem(STORE_PREFIX + page, JSON.stringify(view));
  } catch {
    // Storage full or blocked: the choice holds for this visit only.
  }
}

// The chart group of a page and its controls. `page` names what is kept ("job", "compare");
// `defaultX()` is the page's axis while the user has not chosen one; `redraw()` draws every
// chart again under the group's view. Returns {group, offerAxes(axes)}: offerAxes enables the
// x axes the page's data has.
export function chartControls(page, defaultX, redraw) {
  const $ = (id) => document.getElementById(id);
  const chosen = kept(page);
  const zoomOut = $("chart-zoom-out");
  const group = chartGroup({ smoothing: chosen.smoothing, log: chosen.log, x: chosen.x || defaultX() }, (zoom) => {
    zoomOut.hidden = !zoom;
  });
  const smoothing = $("chart-smoothing");
  const shown = $("chart-smoothing-value");
  const log = $("chart-log");
  const x = $("chart-x");
  smoothing.value = String(chosen.smoothing);
  shown.textContent = chosen.smoothing.toFixed(2);
  log.checked = chosen.log;
  x.value = group.view.x;

  function changed() {
    keep(page, { smoothing: group.view.smoothing, log: group.view.log, x: chosen.x });
    redraw();
  }
  smoothing.addEventListener("input", () => {
    group.view.smoothing = viewFrom({ smoothing: smoothing.value }).smoothing;
    shown.textContent = group.view.smoothing.toFixed(2);
    changed();
  });
  log.addEventListener("change", () => {
    group.view.log = log.checked;
    changed();
  });
  x.addEventListener("change", () => {
    chosen.x = viewFrom({ x: x.value }).x;
    group.view.x = chosen.x || defaultX();
    group.zoom = null; // a range of steps means nothing on a time axis
    zoomOut.hidden = true;
    changed();
  });
  zoomOut.addEventListener("click", () => group.zoomTo(null));

  return {
    group,
    // The page's own axis changed (a baseline compared by epoch): followed until one is chosen.
    followDefault() {
      if (chosen.x) return false;
      const next = defaultX();
      if (next === group.view.x) return false;
      group.view.x = next;
      x.value = next;
      return true;
    },
    offerAxes(axes) {
      for (const option of x.options) option.disabled = !axes.includes(option.value);
    },
  };
}
