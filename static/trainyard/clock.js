// A run's clock, for the charts' "time since start" axis: the formatters' pure half, which
// format.js re-exports; no DOM, so that Node tests it (tests/js/clock.test.js), and no other
// script cuts seconds into minutes (tests/unit/test_one_voice.py).

// Seconds since the start as a clock of the run: "0:45", "12:05", "1:02:00"; with tenths
// where asked ("0:07.2").
export function formatElapsed(seconds, decimals = 0) {
  const tenths = Math.round(Math.abs(seconds) * 10 ** decimals);
  const s = Math.floor(tenths / 10 ** decimals);
  const h = Math.floor(s / 3600);
  const m = Math.floor((s % 3600) / 60);
  let sec = String(s % 60).padStart(2, "0");
  if (decimals) sec += `.${String(tenths % 10 ** decimals).padStart(decimals, "0")}`;
  const sign = seconds < 0 ? "-" : "";
  return h ? `${sign}${h}:${String(m).padStart(2, "0")}:${sec}` : `${sign}${m}:${sec}`;
}

// Tick labels of a time-since-start axis: tenths only where the ticks are under a second apart.
export function formatElapsedTicks(ticks) {
  const step = ticks.length > 1 ? Math.abs(ticks[1] - ticks[0]) : 1;
  return ticks.map((t) => formatElapsed(t, step < 1 - 1e-9 ? 1 : 0));
}
