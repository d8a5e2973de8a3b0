// The arithmetic of the charts, with no page in it (tests/js/curves.test.js runs it in Node):
// which report a metric point belongs to, where a report sits on each x axis, the sum over
// processes of a throughput, smoothing, what a log scale cannot draw, where a line must break,
// and which ticks an axis may have. plot.js and the pages draw what these return.

// The x axes a chart can be read by, in the order the control offers them.
export const X_AXES = ["step", "epoch", "wall", "relative"];
export const X_AXIS_LABELS = { step: "step", epoch: "epoch", wall: "wall time", relative: "time since start" };

// A report's key: its step where it has one, else its epoch, else its time. Processes that
// report the same step report the same moment of training, whatever their clocks say.
function reportKey(p) {
  if (p.step != null) return `s${p.step}`;
  if (p.epoch != null) return `e${p.epoch}`;
  return `t${p.ts}`;
}

// The processes' points of one metric as reports: {step, epoch, ts, value, sum, processes},
// one per step (or epoch, or time); value is the mean over the processes that reported it, sum
// their total, ts the latest of their times. A process that reported a step twice (a restarted
// attempt going over it again) counts once, with its later value. Sorted by time.
export function reports(points) {
  const at = new Map();
  for (const p of points || []) {
    const key = reportKey(p);
    let r = at.get(key);
    if (!r) at.set(key, (r = { step: p.step ?? null, byTag: new Map() }));
    const tag = `${p.role}-${p.index}`;
    const had = r.byTag.get(tag);
    if (!had || p.ts >= had.ts) r.byTag.set(tag, p);
  }
  return [...at.values()].map(finish).sort((a, b) => a.ts - b.ts);
}

function finish(r) {
  const points = [...r.byTag.values()];
  const epochs = points.filter((p) => p.epoch != null);
  const sum = points.reduce((total, p) => total + p.value, 0);
  return {
    step: r.step,
    epoch: epochs.length ? epochs.reduce((total, p) => total + p.epoch, 0) / epochs.length : null,
    ts: Math.max(...points.map((p) => p.ts)),
    value: sum / points.length,
    sum,
    processes: points.length,
  };
}

// Global throughput: at each step (or epoch) the sum of every process's samples/sec, once
// every process that reports throughput has reported that step. Summing as reports arrive
// drew a staircase: one rank's figure, then two ranks', then one again at the next step.
export function completeTotals(points) {
  const processes = new Set((points || []).map((p) => `${p.role}-${p.index}`)).size;
  return reports(points)
    .filter((r) => r.processes === processes)
    .map((r) => ({ ...r, value: r.sum }));
}

// Where a report sits on an x axis: its step, its epoch, its time (seconds since 1970) or its
// seconds since `origin`; null where it has no such coordinate.
export function xOf(report, axis, origin = 0) {
  if (axis === "step") return report.step;
  if (axis === "epoch") return report.epoch;
  if (axis === "wall") return report.ts;
  if (axis === "relative") return report.ts - origin;
  return null;
}

// Where "time since start" counts from: the job's start (seconds), or its first report where
// that came earlier. A trainer may report within milliseconds of its start, before the console
// has heard that it started, and a node's clock may run ahead of the console's: counting from
// the start alone drew such a first point at a negative time.
export function timeOrigin(started, firstReport) {
  return Math.min(started ?? Infinity, firstReport ?? Infinity);
}

// (x, value) pairs of these reports on `axis`, sorted by x; a report without that coordinate
// is left out. Two reports at one x (a step reported twice, by two attempts) keep the later.
export function curveOn(reportList, axis, origin = 0) {
  const at = new Map();
  for (const r of reportList) {
    const x = xOf(r, axis, origin);
    if (x != null && Number.isFinite(x)) at.set(x, r.value);
  }
  return [...at.entries()].sort((a, b) => a[0] - b[0]);
}

// Which axes any of these reports can be read by: time always, step and epoch where reported.
export function axesOf(reportList) {
  const has = new Set(["wall", "relative"]);
  for (const r of reportList) {
    if (r.step != null) has.add("step");
    if (r.epoch != null) has.add("epoch");
  }
  return X_AXES.filter((a) => has.has(a));
}

// The axis a chart is drawn on: the one asked for where its reports have it, else epoch, else
// step, else `timeAxis`. A chart of times only (CPU, memory) keeps a time axis.
export function effectiveAxis(asked, available, timeAxis = "wall") {
  if (available.includes(asked)) return asked;
  for (const a of ["epoch", "step"]) if (available.includes(a)) return a;
  return timeAxis;
}

// Exponential moving average, debiased as TensorBoard does: weight 0 is the raw curve, 0.99
// almost flat. A value of null or undefined (a break, or no point of this series at that x)
// stays as it is and does not move the average. The debiasing divides by the weight the
// average has gathered, so the first points are not pulled towards 0.
export function smooth(ys, weight) {
  const w = Math.min(Math.max(Number(weight) || 0, 0), 0.999);
  if (w === 0) return ys.slice();
  let last = 0;
  let n = 0;
  return ys.map((y) => {
    if (y == null || !Number.isFinite(y)) return y;
    last = last * w + (1 - w) * y;
    n++;
    return last / (1 - w ** n);
  });
}

// A log scale has no place for 0 or less: such values are left out (undefined: the line joins
// its neighbours), and counted so the page can say so.
export function forLogScale(ys) {
  let dropped = 0;
  const out = ys.map((y) => {
    if (y == null) return y;
    if (!(y > 0)) { dropped++; return undefined; }
    return y;
  });
  return { ys: out, dropped, drawable: out.some((y) => y != null) };
}

// One curve broken at these moments (seconds since 1970, on a time axis): a null between the
// last point before each and the first after, so the line does not cross the time a job was
// preempted or restarting. On a step or epoch axis nothing was missed: no break.
export function breakAt(points, moments) {
  if (!moments.length || points.length < 2) return points;
  const out = [points[0]];
  for (let i = 1; i < points.length; i++) {
    const [x0] = points[i - 1];
    const [x1] = points[i];
    const inBetween = moments.filter((m) => m > x0 && m < x1);
    if (inBetween.length) out.push([inBetween[0], null]);
    out.push(points[i]);
  }
  return out;
}

// The moments between a job's attempts: each attempt's end that a later attempt follows.
// `attempts` as the job API gives them ({started, finished} in ISO 8601).
export function attemptBreaks(attempts) {
  const ends = [];
  const list = attempts || [];
  for (let i = 0; i < list.length - 1; i++) {
    const end = Date.parse(list[i].finished || list[i + 1].started || "");
    if (Number.isFinite(end)) ends.push(end / 1000);
  }
  return ends;
}

// One sorted x array and each curve's values aligned to it, as uPlot wants: undefined where a
// curve has no point at an x (joined across), null where it breaks (a gap in the line).
export function align(curves) {
  const xs = [...new Set(curves.flatMap((c) => c.map(([x]) => x)))].sort((a, b) => a - b);
  const where = new Map(xs.map((x, i) => [x, i]));
  const data = [xs];
  for (const c of curves) {
    const ys = new Array(xs.length).fill(undefined);
    for (const [x, y] of c) ys[where.get(x)] = y;
    data.push(ys);
  }
  return data;
}

// Tick steps an axis may use. Steps and epochs are counted in whole numbers: a tick at epoch
// 1.5 names a moment no report has. Time since the start goes in tenths of a second (a short
// run's whole training may take one second), seconds, minutes and hours.
const WHOLE = [1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1e3, 2e3, 2500, 5e3, 1e4, 2e4, 5e4, 1e5, 2e5, 5e5, 1e6, 2e6, 5e6, 1e7];
const SECONDS = [0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 3 * 3600, 6 * 3600, 12 * 3600, 86400, 2 * 86400, 7 * 86400];
export function tickSteps(axis) {
  if (axis === "step" || axis === "epoch") return WHOLE;
  if (axis === "relative") return SECONDS;
  return null; // wall time: uPlot's own clock steps
}

// A page's chart view as kept between visits, made safe: smoothing 0 to 0.99, log on or off,
// and the x axis only where it is one of X_AXES (null: the page's own choice).
export function viewFrom(kept) {
  const v = kept && typeof kept === "object" ? kept : {};
  const smoothing = Number(v.smoothing);
  return {
    smoothing: Number.isFinite(smoothing) ? Math.min(Math.max(smoothing, 0), 0.99) : 0,
    log: v.log === true,
    x: X_AXES.includes(v.x) ? v.x : null,
  };
}
