// Curves on uPlot charts, shared by the job page (job/charts.js) and the compare page
// (compare.js): one way to draw a chart, so that a curve reads the same on both pages, and one
// view for all the charts of a page (chartGroup): the smoothing, the log scale, the x axis the
// page's controls chose (chart_controls.js), and the zoom, which every chart on the same axis
// follows. The arithmetic (reports, totals, smoothing, breaks, ticks) is in curves.js.
//
// A chart slot is {fig, plotEl, emptyEl, plot, sig, axis} around a <figure class="chart">
// holding a .chart-plot and a .chart-empty; chartSlot() makes one from such a figure.

import { formatCount, formatLocalTime, formatTimeTicks } from "./format.js";
import { align, forLogScale, smooth, tickSteps, X_AXIS_LABELS } from "./curves.js";
import { formatElapsed, formatElapsedTicks } from "./format.js";

export { align };

// Eight colours told apart at a glance, on white and side by side (the compare page draws up
// to eight runs): blue, orange, green, red, purple, brown, pink, teal.
export const COLOURS = ["#2855d8", "#e8710a", "#16a34a", "#dc2626", "#7c3aed", "#8c564b", "#db2777", "#0e9aa7"];
export const CHART_HEIGHT = 220;

const AXIS_STYLE = { stroke: "#6b7385", grid: { stroke: "#eef0f4", width: 1 }, ticks: { stroke: "#dde1e8", width: 1 }, font: "12px system-ui, sans-serif" };

// The least distance between two time ticks, in CSS pixels: a clock time with a decimal of a
// second is about 60 px wide in the axis font.
const TIME_TICK_SPACE_PX = 90;

// Room to the right of the plot for half of the last time label ("14:05:09.2"), which is
// centred on its tick: without it the canvas cut it ("17:36:37.").
const RIGHT_PAD_PX = 40;

export function chartSlot(fig) {
  return { fig, plotEl: fig.querySelector(".chart-plot"), emptyEl: fig.querySelector(".chart-empty"), plot: null, sig: "", axis: null, data: null };
}

// The charts of one page under one view: {smoothing (0 to 0.99), log (y axis), x (the axis
// asked for)}, and the zoom {axis, min, max} the user dragged on any of them, which every chart
// on that axis shows. `onZoom(zoom)` hears each change (null: zoomed out).
export function chartGroup(view, onZoom = () => {}) {
  const group = { view: { smoothing: 0, log: false, x: "step", ...view }, zoom: null, slots: new Set(), key: `g${Math.random().toString(36).slice(2)}` };
  group.zoomTo = (zoom) => {
    group.zoom = zoom;
    for (const slot of group.slots) applyZoom(slot, group);
    onZoom(zoom);
  };
  return group;
}

function applyZoom(slot, group) {
  if (!slot.plot || !slot.data) return;
  const z = group.zoom;
  const xs = slot.data[0];
  const zoomed = !!z && z.axis === slot.axis;
  slot.fig.dataset.zoomed = String(zoomed);
  if (zoomed) slot.plot.setScale("x", { min: z.min, max: z.max });
  else if (xs.length) slot.plot.setScale("x", { min: xs[0], max: xs[xs.length - 1] });
}

// The drawn values of one series under the view: smoothed, then with what a log scale cannot
// show left out.
function drawnValues(ys, view, log) {
  const smoothed = smooth(ys, view.smoothing);
  return log ? forLogScale(smoothed).ys : smoothed;
}

export function formatValue(v) {
  const a = Math.abs(v);
  if (a >= 1000) return formatCount(v);
  if (a >= 10) return v.toFixed(1);
  if (a >= 0.01 || a === 0) return v.toFixed(3);
  return v.toPrecision(3);
}

export function showEmpty(chart, text) {
  if (chart.plot) { chart.plot.destroy(); chart.plot = null; chart.sig = ""; }
  chart.plotEl.hidden = true;
  chart.emptyEl.hidden = false;
  chart.emptyEl.textContent = text;
  chart.fig.classList.add("empty");
  chart.fig.dataset.points = "0";
}

// spec: {axis ("step", "epoch", "wall" or "relative"), series: [{label, stroke, width, dash}],
// data: [xs, ...ys]} as curves.align gives it. `group` (chartGroup) brings the view and the
// zoom; without one the chart is drawn as it is.
export function render(chart, spec, group = null) {
  chart.fig.hidden = false;
  if (!spec || spec.data[0].length === 0) return showEmpty(chart, "no points yet");
  const view = group ? group.view : { smoothing: 0, log: false };
  const drawn = spec.data.slice(1).map((ys) => drawnValues(ys, view, false));
  // A log scale only where there is something above 0 to draw on it.
  const log = !!view.log && drawn.some((ys) => forLogScale(ys).drawable);
  const data = [spec.data[0], ...(log ? drawn.map((ys) => forLogScale(ys).ys) : drawn)];
  chart.emptyEl.hidden = true;
  chart.plotEl.hidden = false;
  chart.fig.classList.remove("empty");
  // What is drawn, for tests and tools: x values, series, the axis and the y scale.
  chart.fig.dataset.points = String(spec.data[0].length);
  chart.fig.dataset.series = String(spec.series.length);
  chart.fig.dataset.axis = spec.axis;
  chart.fig.dataset.scale = log ? "log" : "linear";
  chart.axis = spec.axis;
  chart.data = data;
  chart.fig.chartData = data; // the values drawn ([xs, ...ys]), read by the browser tests
  if (group) group.slots.add(chart);
  const sig = JSON.stringify([spec.axis, log, spec.series.map((s) => [s.label, s.stroke])]);
  if (chart.plot && chart.sig === sig) {
    chart.plot.setData(data);
    if (group && group.zoom && group.zoom.axis === spec.axis) applyZoom(chart, group);
    return;
  }
  if (chart.plot) chart.plot.destroy();
  chart.plot = new uPlot(plotOptions(chart, spec, log, group), data, chart.plotEl);
  chart.sig = sig;
  if (group && group.zoom && group.zoom.axis === spec.axis) applyZoom(chart, group);
}

function plotOptions(chart, spec, log, group) {
  const time = spec.axis === "wall";
  const elapsed = spec.axis === "relative";
  const xValue = time
    ? (u, v) => (v == null ? "–" : formatLocalTime(new Date(v * 1000)))
    : elapsed
      ? (u, v) => (v == null ? "–" : formatElapsed(v, 1))
      : (u, v) => (v == null ? "–" : formatValue(v));
  let xAxis;
  if (time) {
    // Time ticks as every other time on the page reads (14:05:09), not uPlot's own ":47.000",
    // at least a label's width apart ("14:05:09.2"), so that ticks never run together.
    xAxis = { values: (u, ticks) => formatTimeTicks(ticks), space: TIME_TICK_SPACE_PX };
  } else {
    xAxis = {
      label: X_AXIS_LABELS[spec.axis] || spec.axis,
      labelSize: 18,
      labelFont: "12px system-ui, sans-serif",
      incrs: tickSteps(spec.axis),
      ...(elapsed ? { values: (u, ticks) => formatElapsedTicks(ticks), space: 60 } : {}),
    };
  }
  const cursor = { drag: { x: true, y: false, setScale: !group } };
  if (group) cursor.sync = { key: `${group.key}-${spec.axis}` };
  return {
    width: Math.max(200, chart.plotEl.clientWidth),
    height: CHART_HEIGHT,
    padding: [12, RIGHT_PAD_PX, 0, 0],
    scales: { x: { time }, y: log ? { distr: 3, log: 10 } : {} },
    cursor,
    legend: { live: true },
    series: [
      { label: time ? "time" : X_AXIS_LABELS[spec.axis] || spec.axis, value: xValue },
      ...spec.series.map((s) => ({
        label: s.label,
        stroke: s.stroke,
        width: s.width || 1.5,
        dash: s.dash,
        // null breaks the line (a restart's gap); undefined (no point of this series at an x
        // another series has) is joined across.
        spanGaps: false,
        value: (u, v) => (v == null ? "–" : formatValue(v)),
      })),
    ],
    axes: [{ ...AXIS_STYLE, ...xAxis }, { ...AXIS_STYLE, size: 64 }],
    hooks: group ? { setSelect: [(u) => zoomFromSelection(u, chart, group)] } : {},
  };
}

// A drag across a chart: every chart on its axis shows that range; the selection box goes.
function zoomFromSelection(u, chart, group) {
  const { left, width } = u.select;
  if (width < 2) return;
  const min = u.posToVal(left, "x");
  const max = u.posToVal(left + width, "x");
  u.setSelect({ left: 0, top: 0, width: 0, height: 0 }, false);
  if (max > min) group.zoomTo({ axis: chart.axis, min, max });
}

// Double-click on any chart: all of them zoom back out.
export function zoomOutOnDoubleClick(chart, group) {
  chart.plotEl.addEventListener("dblclick", () => { if (group.zoom) group.zoomTo(null); });
}

// Keep the charts as wide as their boxes after the window is resized.
export function resizeWith(charts, settleMs = 150) {
  let timer = null;
  window.addEventListener("resize", () => {
    clearTimeout(timer);
    timer = setTimeout(() => {
      for (const chart of charts()) {
        if (chart.plot) chart.plot.setSize({ width: Math.max(200, chart.plotEl.clientWidth), height: CHART_HEIGHT });
      }
    }, settleMs);
  });
}
