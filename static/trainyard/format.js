// How the console writes numbers, money, durations and times for people, in one place, so
// that every page says "350 M", "$0.15" and "3 min 05 s" alike. The server writes the same
// (jobs/money.py, jobs/services/views/durations.py) where it renders them itself.
import { money, timeZone } from "./rules.js";

export { formatElapsed, formatElapsedTicks } from "./clock.js";

const whole = new Intl.NumberFormat("en-US", { maximumFractionDigits: 0 });
const cents = new Intl.NumberFormat("en-US", { minimumFractionDigits: 2, maximumFractionDigits: 2 });
const priceDigits = new Intl.NumberFormat("en-US", { minimumFractionDigits: 2, maximumFractionDigits: 4 });

// 12,345: a whole count with thousands separators.
export const formatCount = (n) => whole.format(n);

// A large count in three significant digits: 987, 12.3 k, 350 M, 1.2 B.
const STEPS = ["", " k", " M", " B", " T"];
export function formatCompact(n) {
  if (!Number.isFinite(n)) return "–";
  let step = 0;
  let v = n;
  while (Math.abs(v) >= 1000 && step < STEPS.length - 1) {
    v /= 1000;
    step++;
  }
  let r = Number(v.toPrecision(3));
  // 999,999 rounds to 1000 k: say 1 M.
  if (Math.abs(r) >= 1000 && step < STEPS.length - 1) {
    r = Number((r / 1000).toPrecision(3));
    step++;
  }
  return `${r}${STEPS[step]}`;
}

// An amount spent: "$0.42"; fractions of a cent keep two significant digits ("$0.0042")
// rather than read as nothing, down to "< $0.0001".
export function formatMoney(amount) {
  if (amount > 0 && amount < 0.0001) return `< ${money.prefix}0.0001`;
  const text = amount > 0 && amount < 0.01 ? amount.toPrecision(2) : cents.format(amount);
  return `${money.prefix}${text}`;
}

// A price as the catalog sets it: "$0.05", "$0.0125" (two to four decimals).
export const formatPrice = (amount) => `${money.prefix}${priceDigits.format(amount)}`;

// "per $" after a count: "samples per $".
export const perMoney = `per ${money.symbol}`;

// "12 s", "3 min 05 s", "2 h 05 min": whole seconds elapsed, the largest units that matter.
export function formatDuration(seconds) {
  const s = Math.max(0, Math.floor(seconds));
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${String(s % 60).padStart(2, "0")} s`;
  return `${Math.floor(s / 3600)} h ${String(Math.floor((s % 3600) / 60)).padStart(2, "0")} min`;
}

const two = (n) => String(n).padStart(2, "0");

// The zone times are shown in: the console's (TRAINYARD_TIME_ZONE) or else the reader's own.
export const shownZone = timeZone || Intl.DateTimeFormat().resolvedOptions().timeZone || "local time";
const inZone = timeZone
  ? new Intl.DateTimeFormat("en-US", {
    timeZone, hourCycle: "h23", year: "numeric", month: "numeric", day: "numeric",
    hour: "numeric", minute: "numeric", second: "numeric",
  })
  : null;

// A moment's calendar fields in the shown zone.
function fieldsOf(date) {
  if (!inZone) {
    return { year: date.getFullYear(), month: date.getMonth() + 1, day: date.getDate(),
      hour: date.getHours(), minute: date.getMinutes(), second: date.getSeconds() };
  }
  const parts = Object.fromEntries(inZone.formatToParts(date).map((p) => [p.type, Number(p.value)]));
  return { ...parts, hour: parts.hour % 24 };
}

// "14:05:09": the time of day in the shown zone, where the date goes without saying;
// "14:05:09.25" with `decimals` of a second.
export function formatClockTime(date, decimals = 0) {
  const f = fieldsOf(date);
  const clock = `${two(f.hour)}:${two(f.minute)}:${two(f.second)}`;
  if (decimals <= 0) return clock;
  return `${clock}.${String(date.getMilliseconds()).padStart(3, "0").slice(0, decimals)}`;
}

// A chart's time axis (ticks in seconds since the epoch) as clock times, with as many decimals
// of a second as the ticks' spacing needs to tell them apart: a run shorter than a second has
// ticks 0.2 s apart, "14:05:09.2", "14:05:09.4", never uPlot's own ":09.200".
export function formatTimeTicks(ticks) {
  const step = ticks.length > 1 ? Math.abs(ticks[1] - ticks[0]) : 1;
  const decimals = step >= 1 ? 0 : Math.min(3, Math.ceil(-Math.log10(step) - 1e-9));
  return ticks.map((t) => formatClockTime(new Date(Math.round(t * 1000)), decimals));
}

// "2025-03-07 14:05:09" in the shown zone.
export function formatLocalTime(date) {
  const f = fieldsOf(date);
  return `${f.year}-${two(f.month)}-${two(f.day)} ${formatClockTime(date)}`;
}
