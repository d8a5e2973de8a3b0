// Curves on uPlot charts, shared by the job page (job/charts.js) and the compare page
// (compare.js): one way to average a metric over processes, align series on one x axis and
// draw them, so that a curve reads the same on both pages.
//
// A chart slot is {fig, plotEl, emptyEl, plot, sig} around a <figure class="chart"> holding a
// .chart-plot and a .chart-empty; chartSlot() makes one from such a figure.

import { formatCount, formatLocalTime, formatTimeTicks } from "./format.js";

export const COLOURS = ["#2855d8", "#d97706", "#059669", "#c026d3", "#dc2626", "#0891b2", "#65a30d", "#7c3aed"];
export const CHART_HEIGHT = 220;

const AXIS_STYLE = { stroke: "#6b7385", grid: { stroke: "#eef0f4", width: 1 }, ticks: { stroke: "#dde1e8", width: 1 }, font: "12px system-ui, sans-serif" };

// The least distance between two time ticks, in CSS pixels: a clock time with a decimal of a
// second is about 60 px wide in the axis font.
const TIME_TICK_SPACE_PX = 90;

export function chartSlot(fig) {
  return { fig, plotEl: fig.querySelector(".chart-plot"), emptyEl: fig.querySelector(".chart-empty"), plot: null, sig: "" };
}

// (x, mean over processes) of one metric's points by `axis` ("step", "epoch" or "ts"), sorted by x.
export function curve(points, axis) {
  const at = new Map();
  for (const p of points || []) {
    const x = p[axis];
    if (x === undefined || x === null) continue;
    const acc = at.get(x);
    if (acc) { acc[0] += p.value; acc[1]++; } else at.set(x, [p.value, 1]);
  }
  return [...at.entries()].map(([x, [sum, n]]) => [Number(x), sum / n]).sort((a, b) => a[0] - b[0]);
}

// uPlot wants one sorted x array and every series aligned to it (null where a series has no
// point; spanGaps draws across those).
export function align(curves) {
  const xs = [...new Set(curves.flatMap((c) => c.map(([x]) => x)))].sort((a, b) => a - b);
  const where = new Map(xs.map((x, i) => [x, i]));
  const data = [xs];
  for (const c of curves) {
    const ys = new Array(xs.length).fill(null);
    for (const [x, y] of c) ys[where.get(x)] = y;
    data.push(ys);
  }
  return data;
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

// spec: {axis, series: [{label, stroke, width, dash}], data: [xs, ...ys]}
export function render(chart, spec) {
  chart.fig.hidden = false;
  if (!spec || spec.data[0].length === 0) return showEmpty(chart, "no points yet");
  chart.emptyEl.hidden = true;
  chart.plotEl.hidden = false;
  chart.fig.classList.remove("empty");
  chart.fig.dataset.points = String(spec.data[0].length); // x values drawn: for tests and tools
  chart.fig.dataset.series = String(spec.series.length);
  const sig = JSON.stringify([spec.axis, spec.series.map((s) => s.label)]);
  if (chart.plot && chart.sig === sig) {
    chart.plot.setData(spec.data);
    return;
  }
  if (chart.plot) chart.plot.destroy();
  const time = spec.axis === "ts";
  const opts = {
    width: Math.max(200, chart.plotEl.clientWidth),
    height: CHART_HEIGHT,
    scales: { x: { time } },
    cursor: { drag: { x: true, y: false } },
    legend: { live: true },
    series: [
      time
        ? { label: "time", value: (u, v) => (v == null ? "–" : formatLocalTime(new Date(v * 1000))) }
        : { label: spec.axis, value: (u, v) => (v == null ? "–" : formatValue(v)) },
      ...spec.series.map((s) => ({
        label: s.label,
        stroke: s.stroke,
        width: s.width || 1.5,
        dash: s.dash,
        spanGaps: true,
        value: (u, v) => (v == null ? "–" : formatValue(v)),
      })),
    ],
    axes: [
      {
        ...AXIS_STYLE,
        // Time ticks as every other time on the page reads (14:05:09), not uPlot's own ":47.000".
        ...(time
          // At least a label's width apart ("14:05:09.2"), so that ticks never run together.
          ? { values: (u, ticks) => formatTimeTicks(ticks), space: TIME_TICK_SPACE_PX }
          : { label: spec.axis, labelSize: 18, labelFont: "12px system-ui, sans-serif" }),
      },
      { ...AXIS_STYLE, size: 64 },
    ],
  };
  chart.plot = new uPlot(opts, spec.data, chart.plotEl);
  chart.sig = sig;
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
