"""The figures a distributed run is judged by, from its metric points: pure arithmetic, no I/O.

Definitions, as practitioners of distributed training use them:
- throughput: samples per second. A process reports its own (`samples_per_sec`); a process's
  throughput over the run is the median of its reports (robust to the slow first steps), the
  run's global throughput the sum over its processes, its per-trainer throughput the mean. A
  trainer is a process that trains: every rank of a PyTorch job (its master is rank 0), the
  workers of a parameter-server job; the `workers` fields below count trainers.
- speedup: "the average per-card throughput of the multi-card run divided by the
  throughput of the single-card run", e.g. 600 / 800 = 0.75. Beside it: global speedup, the
  run's global throughput over the single-trainer run's (what "N× faster" means), and scaling
  efficiency, global speedup over the trainer count. With a 1-trainer baseline the efficiency
  equals that speedup; both names are shown because readers know one or the other.
- samples per dollar: samples per second × 3600 / price per hour.
- GPU utilisation under 80 % means a bottleneck (input, communication): judged as the gpu-idle
  health rule judges it with its defaults (healthrules.LowRun), and worded here for the page to
  show.
- curve fitting: a run matches a known-good baseline when its loss, learning-rate and
  eval-accuracy curves lie on the baseline's and it ends at the same eval accuracy.
"""

import itertools
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from jobs.healthrules import DEFAULT_GPU_BELOW, DEFAULT_GPU_MINUTES, LowRun
from workers.contract import tag_of

Point = dict[str, Any]  # {name, value, step?, epoch?, ts, role, index, ...}

# Declarations of the run's length: not reports of how far it is.
DECLARATIONS = ("total_steps", "total_epochs")
ACCURACY_TOLERANCE = 0.01  # final eval accuracy within 1 point
LOSS_TOLERANCE = 0.10  # summed gap between the loss curves over the baseline's sum
CURVE_BINS = 20
# Adding trainers stops paying when one more adds less than this share of one trainer's
# throughput.
MARGINAL_GAIN_WORTH_IT = 0.5


def _process(point: Point) -> tuple[str, int]:
    return point["role"], point["index"]


def named(points: Iterable[Point], name: str) -> list[Point]:
    return [p for p in points if p["name"] == name]


@dataclass(frozen=True)
class Throughput:
    global_sps: float
    per_worker_sps: float
    workers: int  # trainer processes that reported throughput


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
    speedup: float  # per-trainer throughput / the baseline's per-trainer throughput
    global_speedup: float  # global throughput / the baseline's global throughput
    efficiency: float  # global speedup / (trainers / the baseline's trainers)


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


def time_to_accuracy(points: Iterable[Point], target: float, started: float) -> float | None:
    """Seconds from `started` to the first eval_accuracy report at or above `target`; None if
    the run never got there."""
    reached = [p["ts"] for p in named(points, "eval_accuracy") if p["value"] >= target]
    return max(0.0, min(reached) - started) if reached else None


@dataclass(frozen=True)
class Verdict:
    matches: bool | None  # None: not enough data to say
    axis: str
    final_accuracy: float | None
    baseline_accuracy: float | None
    loss_distance: float | None
    lr_distance: float | None
    reasons: list[str]
    # False where the baseline trained differently by design (another trainer count, so
    # another global batch): its curves are shown but not judged, and `note` says why.
    curves_judged: bool = True
    note: str | None = None
    target_accuracy: float | None = None
    seconds_to_target: float | None = None
    baseline_seconds_to_target: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "matches": self.matches,
            "axis": self.axis,
            "final_eval_accuracy": self.final_accuracy,
            "baseline_eval_accuracy": self.baseline_accuracy,
            "loss_distance": self.loss_distance,
            "lr_distance": self.lr_distance,
            "reasons": self.reasons,
            "curves_judged": self.curves_judged,
            "note": self.note,
            "target_eval_accuracy": self.target_accuracy,
            "seconds_to_target": self.seconds_to_target,
            "baseline_seconds_to_target": self.baseline_seconds_to_target,
        }


@dataclass(frozen=True)
class Different:
    """Why a baseline's curves are not expected to lie on the run's (None: they are)."""

    note: str


@dataclass(frozen=True)
class Starts:
    """When each run started (epoch seconds), to time how long each took to reach accuracy."""

    run: float
    baseline: float


def compare_with_baseline(
    run: Sequence[Point],
    baseline: Sequence[Point],
    accuracy_tolerance: float = ACCURACY_TOLERANCE,
    loss_tolerance: float = LOSS_TOLERANCE,
    different: Different | None = None,
    starts: Starts | None = None,
) -> Verdict:
    """Whether `run` trained as `baseline` did. Where the two train alike, the final accuracy
    and the loss curves must agree. Where they differ by design (`different`), the curves are
    expected to differ and only what should still agree is judged: the final accuracy; the
    time each took to reach the baseline's accuracy is given beside it (with `starts`)."""
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
    if different is not None:
        target, ours, theirs = _time_to_target(
            run, baseline, base_accuracy, accuracy_tolerance, starts
        )
        if target is not None:
            reasons.append(_time_to_target_reason(target, ours, theirs))
        if loss is not None:
            reasons.append(f"loss curves {loss:.1%} apart by {axis} (not judged: see the note)")
        matches = checks[0] if checks else None
        return Verdict(
            matches, axis, accuracy, base_accuracy, loss, lr, reasons,
            curves_judged=False, note=different.note, target_accuracy=target,
            seconds_to_target=ours, baseline_seconds_to_target=theirs,
        )  # fmt: skip
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


def _time_to_target(
    run: Sequence[Point],
    baseline: Sequence[Point],
    base_accuracy: float | None,
    tolerance: float,
    starts: Starts | None,
) -> tuple[float | None, float | None, float | None]:
    """The target (the baseline's final accuracy, less the tolerance) and the seconds each run
    took to reach it."""
    if base_accuracy is None or starts is None:
        return None, None, None
    target = base_accuracy - tolerance
    return (
        target,
        time_to_accuracy(run, target, starts.run),
        time_to_accuracy(baseline, target, starts.baseline),
    )


def _time_to_target_reason(target: float, ours: float | None, theirs: float | None) -> str:
    if ours is None:
        baseline = "" if theirs is None else f" (the baseline did in {theirs:.0f} s)"
        return f"has not reached eval accuracy {target:.4f}{baseline}"
    said = f"reached eval accuracy {target:.4f} in {ours:.0f} s"
    if theirs is None:
        return f"{said}; the baseline never did"
    if ours > 0 and theirs > 0:
        ratio = theirs / ours
        faster = f"{ratio:.1f}× sooner" if ratio >= 1 else f"took {1 / ratio:.1f}× as long"
        return f"{said} vs {theirs:.0f} s for the baseline ({faster})"
    return f"{said} vs {theirs:.0f} s for the baseline"


# --- progress and health -------------------------------------------------------------------------


@dataclass(frozen=True)
class Progress:
    fraction: float
    eta_seconds: float | None
    by: str  # "epoch" or "step"
    reached: float  # the furthest epoch (or step) any process reported
    total: float  # the declared total
    done: bool  # the last epoch (or step) was reported, or the job succeeded


# Epochs first: they are what the charts' axis, the examples' log lines ("epoch=30/30") and a
# user count in; steps where a run declares only those.
_PROGRESS_AXES = (("epoch", "total_epochs"), ("step", "total_steps"))


def progress(points: Sequence[Point], succeeded: bool = False) -> Progress | None:
    """How far the run is: the furthest epoch (or step) any process reported over the declared
    total. A job that succeeded is done whatever it reported. The ETA assumes the pace between
    the first and the latest report (start-up is not progress)."""
    for by, total_name in _PROGRESS_AXES:
        totals = named(points, total_name)
        reports = [p for p in points if p.get(by) is not None and p["name"] not in DECLARATIONS]
        if not totals or not reports:
            continue
        total = float(max(p["value"] for p in totals))
        if total <= 0:
            continue
        reached = float(max(p[by] for p in reports))
        done = succeeded or reached >= total
        fraction = 1.0 if done else reached / total
        return Progress(
            fraction, None if done else _eta(reports, by, total), by, reached, total, done
        )
    return None


def _eta(reports: Sequence[Point], by: str, total: float) -> float | None:
    first = min(reports, key=lambda p: p["ts"])
    last = max(reports, key=lambda p: (p[by], p["ts"]))
    gained, seconds = last[by] - first[by], last["ts"] - first["ts"]
    if gained <= 0 or seconds <= 0:
        return None
    return (total - last[by]) * seconds / gained


def low_gpu_utilisation(points: Sequence[Point], now: float) -> list[str]:
    """Instances whose GPU samples have stayed under the gpu-idle rule's default threshold for
    its default time, as its health rule judges it (LowRun), up to a sample that recent."""
    runs: dict[tuple[str, int], LowRun] = {}
    for p in sorted(named(points, "gpu_util_percent"), key=lambda p: p["ts"]):
        if isinstance(p["value"], int | float):  # a sample that was not finite says nothing
            runs.setdefault(_process(p), LowRun(DEFAULT_GPU_BELOW)).sample(p["value"], p["ts"])
    recent = now - DEFAULT_GPU_MINUTES * 60
    return [
        tag_of(role, index)
        for (role, index), run in sorted(runs.items())
        if run.lasted(DEFAULT_GPU_MINUTES) and run.last >= recent
    ]


def low_gpu_warning(slow: Sequence[str]) -> str:
    """What the job page says about the instances low_gpu_utilisation found ("" for none)."""
    if not slow:
        return ""
    span = "a minute" if DEFAULT_GPU_MINUTES == 1 else f"{DEFAULT_GPU_MINUTES:g} minutes"
    return (
        f"⚠ GPU utilisation under {DEFAULT_GPU_BELOW:g} % for {span} on {', '.join(slow)}: "
        "the GPUs wait on something else (input, the network, the CPU)"
    )


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
    """One row per run (job id, throughput, price per hour), by trainer count, and a hint: what
    adding trainers gave, and how many to use."""
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
    return rows, scaling_hint(rows, single)


def _trainers(n: int) -> str:
    return f"{n} trainer{'' if n == 1 else 's'}"


MINUS = "\u2212"  # the typeset minus sign a printed figure carries, not a hyphen


def _share(gained: float) -> str:
    """A share of one trainer's throughput, as a signed percentage."""
    percent = round(gained * 100)
    return f"{MINUS if percent < 0 else ''}{abs(percent)} %"


def scaling_hint(rows: Sequence[ScalingRow], single: Throughput | None) -> str:
    """What the rows mean for the next run, in a sentence: from one trainer count to the next,
    how much of one trainer's throughput each added trainer gave (measured against the
    1-trainer run), and so how many trainers to use."""
    best: dict[int, ScalingRow] = {}
    for row in rows:  # the best run at each trainer count
        if row.workers not in best or row.global_sps > best[row.workers].global_sps:
            best[row.workers] = row
    counts = sorted(best)
    if not counts:
        return ""
    if single is None:
        return (
            "Speedup and efficiency need a 1-trainer run of this program: "
            "launch a 1-trainer baseline to measure them."
        )
    if len(counts) == 1:
        return (
            f"Only runs on {_trainers(counts[0])} so far: run this program on another "
            "trainer count to see how it scales."
        )
    fastest = max(counts, key=lambda n: best[n].global_sps)
    gains = []
    for low, high in itertools.pairwise(counts):
        gained = (best[high].global_sps - best[low].global_sps) / (high - low) / single.global_sps
        if gained < 0:
            return (
                f"Going from {low} to {_trainers(high)}, each added trainer lowered total "
                f"throughput ({_share(gained)} of one trainer's); this program ran fastest "
                f"with {_trainers(fastest)} — try fewer."
            )
        if gained < MARGINAL_GAIN_WORTH_IT:
            return (
                f"Going from {low} to {_trainers(high)}, each added trainer gave only "
                f"{_share(gained)} of one trainer's throughput: beyond {_trainers(low)} you "
                f"pay for more than you gain — use {low} unless finishing sooner is worth it."
            )
        gains.append(gained)
    return (
        f"Each added trainer gave {_share(min(gains))} or more of one trainer's throughput, up "
        f"to {_trainers(counts[-1])}: adding trainers still pays — try more to finish sooner."
    )
