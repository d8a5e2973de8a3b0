// Parallel coordinates of an experiment's trials: one vertical axis per searched parameter
// (on the scale it was searched on: log, linear or its choices) and one for the objective, one
// line per trial across them. Pure geometry and labels, with no page in it (tests/js/
// parcoords.test.js runs it in Node); ./main.js draws what `layout` returns as SVG.

// The axes of an experiment: its space's keys in their order, then the objective.
// space: {"--lr": {type, low, high, log, choices}}; values: the objective of each trial
// (null where none yet), so that the objective's axis spans what was reached.
export function axesOf(space, objective, values) {
  const axes = Object.entries(space || {}).map(([key, spec]) => paramAxis(key, spec || {}));
  const reached = values.filter((v) => typeof v === "number" && Number.isFinite(v));
  const low = reached.length ? Math.min(...reached) : 0;
  const high = reached.length ? Math.max(...reached) : 1;
  axes.push({
    key: null,
    label: `${objective.metric} ${objective.goal === "min" ? "↓" : "↑"}`,
    kind: "linear",
    low,
    high,
  });
  return axes;
}

function paramAxis(key, spec) {
  if (spec.type === "choice") {
    return { key, label: key, kind: "choice", choices: (spec.choices || []).map(String) };
  }
  const low = Number(spec.low);
  const high = Number(spec.high);
  const log = spec.log === true && low > 0 && high > 0;
  return { key, label: key, kind: log ? "log" : "linear", low, high };
}

// Where a value sits on an axis, 0 (bottom) to 1 (top); null where it has none.
export function position(axis, value) {
  if (value == null) return null;
  if (axis.kind === "choice") {
    const at = axis.choices.indexOf(String(value));
    if (at < 0) return null;
    return axis.choices.length === 1 ? 0.5 : at / (axis.choices.length - 1);
  }
  const v = Number(value);
  if (!Number.isFinite(v)) return null;
  let t;
  if (axis.high === axis.low) t = 0.5;
  else if (axis.kind === "log") {
    if (!(v > 0)) return null;
    t = (Math.log(v) - Math.log(axis.low)) / (Math.log(axis.high) - Math.log(axis.low));
  } else t = (v - axis.low) / (axis.high - axis.low);
  return Math.min(1, Math.max(0, t));
}

// A number short enough for an axis label: 0.0316, 128, 1.2e-5.
export function shortNumber(v) {
  if (!Number.isFinite(v)) return "–";
  if (v === 0) return "0";
  const a = Math.abs(v);
  if (a >= 1e5 || a < 1e-3) return v.toExponential(1).replace("e+", "e");
  return String(Number(v.toPrecision(3)));
}

// The labelled marks of an axis: every choice, or its ends (and the middle of its scale).
export function ticksOf(axis) {
  if (axis.kind === "choice") return axis.choices.map((c) => ({ at: position(axis, c), text: c }));
  if (axis.high === axis.low) return [{ at: 0.5, text: shortNumber(axis.low) }];
  const middle = axis.kind === "log" ? Math.sqrt(axis.low * axis.high) : (axis.low + axis.high) / 2;
  return [axis.low, middle, axis.high].map((v) => ({ at: position(axis, v), text: shortNumber(v) }));
}

// The drawing in a box of `width` x `height` with `pad` {top, right, bottom, left}: each axis's
// x and its ticks' y, and each trial's line as SVG points ("x,y x,y ..."), broken where a trial
// has no value on an axis (a trial that reported nothing yet has no objective: its line stops
// at the last parameter). trials: [{number, state, params, value}].
export function layout(axes, trials, width, height, pad) {
  const inner = width - pad.left - pad.right;
  const span = height - pad.top - pad.bottom;
  const xOf = (i) => pad.left + (axes.length === 1 ? inner / 2 : (i * inner) / (axes.length - 1));
  const yOf = (t) => pad.top + (1 - t) * span;
  const round = (n) => Math.round(n * 10) / 10;
  return {
    axes: axes.map((axis, i) => ({
      label: axis.label,
      x: round(xOf(i)),
      top: pad.top,
      bottom: pad.top + span,
      ticks: ticksOf(axis).map((tick) => ({ text: tick.text, y: round(yOf(tick.at)) })),
    })),
    lines: trials.map((trial) => {
      const segments = [];
      let current = [];
      axes.forEach((axis, i) => {
        const t = position(axis, axis.key === null ? trial.value : (trial.params || {})[axis.key]);
        if (t === null) {
          if (current.length) segments.push(current);
          current = [];
        } else current.push(`${round(xOf(i))},${round(yOf(t))}`);
      });
      if (current.length) segments.push(current);
      return { number: trial.number, state: trial.state, segments: segments.map((s) => s.join(" ")) };
    }),
  };
}
