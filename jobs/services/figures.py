"""The figures a distributed run is judged by, from its metric points: pure arithmetic, no I/O.

Definitions, from the seed documents:
- throughput: samples per second. A process reports its own (`samples_per_sec`); a process's
  throughput over the run is the median of its reports (robust to the slow first steps), the
  run's global throughput the sum over its processes, its per-worker throughput the mean.
- speedup (seed 000): "the average per-card throughput of the multi-card run divided by the
  throughput of the single-card run", e.g. 600 / 800 = 0.75. Beside it: global speedup, the
  run's global throughput over the single-worker run's (what "N× faster" means), and scaling
  efficiency, global speedup over the worker count. With a 1-worker baseline the efficiency
  equals seed 000's speedup; both names are shown because readers know one or the other.
- samples per dollar (seed 003): samples per second × 3600 / price per hour.
- GPU utilisation under 80 % means a bottleneck (seed 003).
- curve fitting (seed 000): a run matches a known-good baseline when its loss, learning-rate and
  eval-accuracy curves lie on the baseline's and it ends at the same eval accuracy.
"""

import itertools
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from workers.contract import tag_of

Point = dict[str, Any]  # {name, value, step?, epoch?, ts, role, index, ...}

GPU_BOTTLENECK_PERCENT = 80.0
GPU_BOTTLENECK_SECONDS = 60.0
ACCURACY_TOLERANCE = 0.01  # final eval accuracy within 1 point
LOSS_TOLERANCE = 0.10  # summed gap between the loss curves over the baseline's sum
CURVE_BINS = 20
# Adding workers stops paying when one more worker adds less than this share of a worker.
MARGINAL_GAIN_WORTH_IT = 0.5


def _process(point: Point) -> tuple[str, int]:
    return point["role"], point["index"]


def named(points: Iterable[Point], name: str) -> list[Point]:
    return [p for p in points if p["name"] == name]


@dataclass(frozen=True)
class Throughput:
    global_sps: float
    per_worker_sps: float
    workers: int  # processes that reported throughput


def throughput(points: Iterable[Point]) -> Throughput | None:
    by_process: dict[tuple[str, int], list[float]] = defaultdict(list)
    for p in named(points, "samples_per_sec"):
        by_process[_process(p)].append(p["value"])
    if not by_process:
        return None
    medians = [statistics.median(values) for values in by_process.values()]
    total = sum(medians)
    return Throughput(total, total / len(medians), len(medians))


@dataclass(frozen=True)
class Scaling:
    speedup: float  # seed 000: per-worker throughput / the baseline's per-worker throughput
    global_speedup: float  # global throughput / the baseline's global throughput
    efficiency: float  # global speedup / (workers / baseline workers)


def scaling(run: Throughput, baseline: Throughput) -> Scaling:
    global_speedup = run.global_sps / baseline.global_sps
    return Scaling(
        speedup=run.per_worker_sps / baseline.per_worker_sps,
        global_speedup=global_speedup,
        efficiency=global_speedup / (run.workers / baseline.workers),
    )


def cost(price_per_hour: float, seconds: float) -> float:
    return price_per_hour * seconds / 3600.0


def samples_per_dollar(global_sps: float, price_per_hour: float) -> float | None:
    """None for a free package: a ratio over zero dollars means nothing."""
    if price_per_hour <= 0:
        return None
    return global_sps * 3600.0 / price_per_hour


# --- curves ------------------------------------------------------------------------------------


def curve(points: Iterable[Point], name: str, axis: str = "step") -> list[tuple[float, float]]:
    """(x, value) of one metric, the mean over processes at each x, by `axis` (step or epoch)."""
    at: dict[float, list[float]] = defaultdict(list)
    for p in named(points, name):
        if p.get(axis) is not None:
            at[float(p[axis])].append(p["value"])
    return sorted((x, sum(v) / len(v)) for x, v in at.items())


def axis_of(points: Sequence[Point], baseline: Sequence[Point]) -> str:
    """Epoch when both runs report epochs for their loss (runs on different worker counts take
    different numbers of steps per epoch), else step."""
    for axis in ("epoch", "step"):
        if curve(points, "loss", axis) and curve(baseline, "loss", axis):
            return axis
    return "step"


def _interpolate(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    if x <= xs[0]:
        return ys[0]
    for k in range(1, len(xs)):
        if x <= xs[k]:
            x0, x1, y0, y1 = xs[k - 1], xs[k], ys[k - 1], ys[k]
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return ys[-1]


def _binned(
    points: Sequence[tuple[float, float]], lo: float, hi: float, bins: int
) -> list[tuple[float, float]]:
    """(mean x, mean value) of the points in each of `bins` equal parts of [lo, hi]."""
    width = (hi - lo) / bins
    members: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for x, y in points:
        if lo <= x <= hi:
            members[min(bins - 1, int((x - lo) / width))].append((x, y))
    return [
        (sum(x for x, _ in v) / len(v), sum(y for _, y in v) / len(v))
        for _, v in sorted(members.items())
    ]


def curve_distance(
    run: Sequence[tuple[float, float]], base: Sequence[tuple[float, float]]
) -> float | None:
    """How far `run` lies from `base` over the x range both cover: the summed absolute gap
    over the summed baseline, both curves first averaged in CURVE_BINS equal bins (per-batch
    losses are noisy, and runs on different worker counts report at different x). The
    baseline is interpolated where it has no bin of its own. None without overlap."""
    if not run or not base:
        return None
    lo, hi = max(run[0][0], base[0][0]), min(run[-1][0], base[-1][0])
    if hi <= lo:
        return None
    ours, theirs = _binned(run, lo, hi, CURVE_BINS), _binned(base, lo, hi, CURVE_BINS)
    if not ours or not theirs:
        return None
    xs, ys = [x for x, _ in theirs], [y for _, y in theirs]
    # Only where the baseline is known on both sides: no extrapolation.
    ours = [(x, y) for x, y in ours if xs[0] <= x <= xs[-1]]
    if not ours:
        return None
    expected = [_interpolate(xs, ys, x) for x, _ in ours]
    scale = sum(abs(e) for e in expected)
    if scale == 0:
        return None
    return sum(abs(y - e) for (_, y), e in zip(ours, expected, strict=True)) / scale


def final_value(points: Iterable[Point], name: str) -> float | None:
    """The last reported value (by step, else time), averaged over processes reporting it."""
    values = named(points, name)
    if not values:
        return None
    last_key = max((p.get("step") or 0, p["ts"]) for p in values)[0]
    at_last = [p["value"] for p in values if (p.get("step") or 0) == last_key]
    return sum(at_last) / len(at_last)


@dataclass(frozen=True)
class Verdict:
    matches: bool | None  # None: not enough data to say
    axis: str
    final_accuracy: float | None
    baseline_accuracy: float | None
    loss_distance: float | None
    lr_distance: float | None
    reasons: list[str]

    def as_dict(self) -> dict[str, Any]:
        return {
            "matches": self.matches,
            "axis": self.axis,
            "final_eval_accuracy": self.final_accuracy,
            "baseline_eval_accuracy": self.baseline_accuracy,
            "loss_distance": self.loss_distance,
            "lr_distance": self.lr_distance,
            "reasons": self.reasons,
        }


def compare_with_baseline(
    run: Sequence[Point],
    baseline: Sequence[Point],
    accuracy_tolerance: float = ACCURACY_TOLERANCE,
    loss_tolerance: float = LOSS_TOLERANCE,
) -> Verdict:
    axis = axis_of(run, baseline)
    accuracy = final_value(run, "eval_accuracy")
    base_accuracy = final_value(baseline, "eval_accuracy")
    loss = curve_distance(curve(run, "loss", axis), curve(baseline, "loss", axis))
    lr = curve_distance(curve(run, "lr", axis), curve(baseline, "lr", axis))
    reasons = []
    checks: list[bool] = []
    if accuracy is not None and base_accuracy is not None:
        ok = abs(accuracy - base_accuracy) <= accuracy_tolerance
        checks.append(ok)
        reasons.append(
            f"final eval accuracy {accuracy:.4f} vs {base_accuracy:.4f} "
            f"({'within' if ok else 'outside'} ±{accuracy_tolerance:g})"
        )
    else:
        reasons.append("no eval_accuracy in one of the runs")
    if loss is not None:
        ok = loss <= loss_tolerance
        checks.append(ok)
        reasons.append(
            f"loss curves {loss:.1%} apart by {axis} "
            f"({'within' if ok else 'over'} {loss_tolerance:.0%})"
        )
    else:
        reasons.append(f"no loss at shared {axis}s in both runs")
    matches = all(checks) if len(checks) == 2 else (False if checks and not all(checks) else None)
    return Verdict(matches, axis, accuracy, base_accuracy, loss, lr, reasons)


# --- progress and health -------------------------------------------------------------------------


@dataclass(frozen=True)
class Progress:
    fraction: float
    eta_seconds: float | None
    by: str  # "step" or "epoch"


def progress(points: Sequence[Point], elapsed_seconds: float) -> Progress | None:
    """How far the run is, from its declared total steps (or epochs) and the furthest step (or
    epoch) any process reported; the ETA assumes the pace so far."""
    for by, total_name in (("step", "total_steps"), ("epoch", "total_epochs")):
        totals = named(points, total_name)
        reached = [p[by] for p in points if p.get(by) is not None and p["name"] not in (
            "total_steps", "total_epochs")]  # fmt: skip
        if not totals or not reached:
            continue
        total = max(p["value"] for p in totals)
        if total <= 0:
            continue
        fraction = min(1.0, max(reached) / total)
        eta = elapsed_seconds * (1 - fraction) / fraction if fraction > 0 else None
        return Progress(fraction, eta, by)
    return None


def low_gpu_utilisation(points: Sequence[Point], now: float) -> list[str]:
    """Instances whose every GPU sample in the last minute was under 80 %, with a minute of
    samples to go by."""
    recent: dict[tuple[str, int], list[Point]] = defaultdict(list)
    for p in named(points, "gpu_util_percent"):
        recent[_process(p)].append(p)
    slow = []
    for (role, index), samples in sorted(recent.items()):
        window = [p for p in samples if p["ts"] >= now - GPU_BOTTLENECK_SECONDS]
        covered = bool(window) and min(p["ts"] for p in samples) <= now - GPU_BOTTLENECK_SECONDS
        if covered and all(p["value"] < GPU_BOTTLENECK_PERCENT for p in window):
            slow.append(tag_of(role, index))
    return slow


# --- scaling across runs -----------------------------------------------------------------------


@dataclass(frozen=True)
class ScalingRow:
    job_id: int
    workers: int
    global_sps: float
    speedup: float | None
    global_speedup: float | None
    efficiency: float | None
    samples_per_dollar: float | None


def scaling_rows(
    runs: Sequence[tuple[int, Throughput, float]], single: Throughput | None
) -> tuple[list[ScalingRow], str]:
    """One row per run (job id, throughput, price per hour), by worker count, and a hint: where
    one more worker started to add less than half a worker's throughput."""
    rows = []
    for job_id, tp, price in sorted(runs, key=lambda r: (r[1].workers, r[0])):
        sc = scaling(tp, single) if single is not None else None
        rows.append(
            ScalingRow(
                job_id,
                tp.workers,
                tp.global_sps,
                sc.speedup if sc else None,
                sc.global_speedup if sc else None,
                sc.efficiency if sc else None,
                samples_per_dollar(tp.global_sps, price),
            )
        )
    hint = ""
    best: dict[int, ScalingRow] = {}
    for row in rows:  # the best run at each worker count
        if row.workers not in best or row.global_sps > best[row.workers].global_sps:
            best[row.workers] = row
    counts = sorted(best)
    unit = single.global_sps if single is not None else None
    for low, high in itertools.pairwise(counts):
        if unit is None:
            break
        gained = (best[high].global_sps - best[low].global_sps) / (high - low) / unit
        if gained < MARGINAL_GAIN_WORTH_IT:
            hint = (
                f"Going from {low} to {high} workers added {gained:.2f} of a worker's "
                f"throughput per worker: adding workers stops paying around {low}."
            )
            break
    return rows, hint
