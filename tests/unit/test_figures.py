"""Throughput, speedup, efficiency, cost, curve verdicts and progress against hand-computed
values."""

from collections.abc import Sequence
from typing import Any

import pytest

from jobs.services import figures


def sps(role: str, index: int, *values: float) -> list[dict[str, Any]]:
    return [
        {"name": "samples_per_sec", "value": v, "step": k, "ts": float(k), "role": role,
         "index": index}
        for k, v in enumerate(values)
    ]  # fmt: skip


def test_throughput_is_the_sum_of_each_processes_median() -> None:
    # medians: master 600 (the slow first step does not count), worker-1 500
    points = sps("master", 0, 100, 600, 610, 590, 605) + sps("worker", 1, 500, 480, 520)
    tp = figures.throughput(points)
    assert tp == figures.Throughput(global_sps=1100.0, per_worker_sps=550.0, workers=2)
    assert figures.throughput([]) is None


def test_speedup_per_seed_000_and_global_speedup_and_efficiency() -> None:
    # The textbook example: 600 per card on many cards against 800 on one card gives 0.75.
    single = figures.Throughput(800.0, 800.0, 1)
    four = figures.Throughput(2400.0, 600.0, 4)
    result = figures.scaling(four, single)
    assert result.speedup == pytest.approx(0.75)
    assert result.global_speedup == pytest.approx(3.0)
    assert result.efficiency == pytest.approx(0.75)


def test_cost_and_samples_per_dollar() -> None:
    # 2 instances at $1.50/h each = $3/h; 90 minutes cost $4.50.
    assert figures.cost(3.0, 5400) == pytest.approx(4.5)
    # 1000 samples/s for an hour is 3.6M samples for $3: 1.2M samples per dollar.
    assert figures.samples_per_dollar(1000.0, 3.0) == pytest.approx(1_200_000)
    assert figures.samples_per_dollar(1000.0, 0.0) is None  # free: no ratio


def curves(loss_scale: float, accuracy: float) -> list[dict[str, Any]]:
    points = []
    for step in range(0, 100, 10):
        points.append({"name": "loss", "value": loss_scale * (2.0 - step / 100), "step": step,
                       "ts": float(step), "role": "master", "index": 0})  # fmt: skip
        points.append({"name": "lr", "value": 0.1, "step": step, "ts": float(step),
                       "role": "master", "index": 0})  # fmt: skip
    points.append({"name": "eval_accuracy", "value": accuracy, "step": 90, "ts": 90.0,
                   "role": "master", "index": 0})  # fmt: skip
    return points


def test_a_run_on_the_baselines_curves_matches() -> None:
    verdict = figures.compare_with_baseline(curves(1.02, 0.975), curves(1.0, 0.98))
    assert verdict.matches is True
    assert verdict.loss_distance == pytest.approx(0.02)
    assert verdict.final_accuracy == pytest.approx(0.975)


def test_a_diverging_run_does_not_match_and_says_why() -> None:
    verdict = figures.compare_with_baseline(curves(1.5, 0.90), curves(1.0, 0.98))
    assert verdict.matches is False
    assert verdict.loss_distance == pytest.approx(0.5)
    assert any("outside ±0.01" in r for r in verdict.reasons)
    assert any("over 10%" in r for r in verdict.reasons)


def test_no_verdict_without_the_data() -> None:
    verdict = figures.compare_with_baseline(sps("master", 0, 1.0), curves(1.0, 0.98))
    assert verdict.matches is None


def test_curve_distance_bins_both_curves_and_interpolates_the_baseline() -> None:
    base = [(float(x), 10.0 - x) for x in range(11)]
    assert figures.curve_distance(base, base) == pytest.approx(0.0)
    # Noise that averages out within a bin does not count as distance.
    noisy = [(x + d, 10.0 - (x + d) + s) for x, _ in base for d, s in ((0.1, 0.5), (0.2, -0.5))]
    assert figures.curve_distance(noisy, base) == pytest.approx(0.0, abs=0.02)
    # A run 20 % higher everywhere is 20 % apart, wherever its points fall.
    assert figures.curve_distance([(x + 0.3, 1.2 * (9.7 - x)) for x in range(9)], base) == (
        pytest.approx(0.2)
    )
    assert figures.curve_distance([(50.0, 1.0), (60.0, 1.0)], base) is None  # no overlap


def test_progress_and_eta_from_declared_total_steps() -> None:
    points = [{"name": "total_steps", "value": 400, "ts": 0.0, "role": "master", "index": 0}]
    points += sps("master", 0, *([500.0] * 101))  # steps 0..100, one a second
    result = figures.progress(points)
    assert result is not None and result.by == "step"
    assert result.fraction == pytest.approx(0.25)
    assert (result.reached, result.total, result.done) == (100.0, 400.0, False)
    # 100 steps took 100 s from the first report (start-up is not progress): 300 more, 300 s.
    assert result.eta_seconds == pytest.approx(300.0)


def epochs(last: int, total: int, steps_per_epoch: int = 15) -> list[dict[str, Any]]:
    """What the digits example reports: both totals, then a loss each step and a throughput at
    each epoch's end, with the epoch (fractional mid-epoch) beside the step."""
    points: list[dict[str, Any]] = [
        {"name": "total_steps", "value": total * steps_per_epoch, "ts": 0.0, "role": "master",
         "index": 0},
        {"name": "total_epochs", "value": total, "ts": 0.0, "role": "master", "index": 0},
    ]  # fmt: skip
    for epoch in range(last):
        for k in range(steps_per_epoch):
            step = epoch * steps_per_epoch + k
            points.append({"name": "loss", "value": 1.0, "step": step,
                           "epoch": epoch + k / steps_per_epoch, "ts": 10.0 + step,
                           "role": "master", "index": 0})  # fmt: skip
        end = (epoch + 1) * steps_per_epoch
        points.append({"name": "samples_per_sec", "value": 500.0, "step": end, "epoch": epoch + 1,
                       "ts": 10.0 + end, "role": "master", "index": 0})  # fmt: skip
    return points


def test_progress_counts_epochs_as_the_log_and_the_charts_do() -> None:
    result = figures.progress(epochs(12, 30))
    assert result is not None and result.by == "epoch"
    assert (result.reached, result.total) == (12.0, 30.0)
    assert result.fraction == pytest.approx(0.4)


def test_the_last_epoch_reported_is_100_percent_with_no_eta() -> None:
    result = figures.progress(epochs(30, 30))
    assert result is not None
    assert (result.fraction, result.done, result.eta_seconds) == (1.0, True, None)


def test_a_job_that_succeeded_is_done_whatever_it_reported() -> None:
    # A trainer that declared 30 epochs and stopped early on its own (early stopping).
    result = figures.progress(epochs(12, 30), succeeded=True)
    assert result is not None
    assert (result.fraction, result.done, result.eta_seconds) == (1.0, True, None)
    assert result.reached == 12.0  # what it did report stays true
    assert figures.progress(sps("master", 0, 500.0), succeeded=True) is None  # nothing declared


def test_it_warns_when_gpu_utilisation_stays_under_80_for_a_minute() -> None:
    def gpu(role: str, index: int, values: Sequence[float]) -> list[dict[str, Any]]:
        return [{"name": "gpu_util_percent", "value": v, "ts": 1000.0 + 10 * k, "role": role,
                 "index": index} for k, v in enumerate(values)]  # fmt: skip

    points = gpu("master", 0, [70] * 8) + gpu("worker", 1, [70] * 6 + [95, 70])
    assert figures.low_gpu_utilisation(points, now=1070.0) == ["master"]
    assert figures.low_gpu_utilisation(gpu("master", 0, [50]), now=1000.0) == []  # too soon


def scaling_of(*runs: tuple[int, float]) -> tuple[list[figures.ScalingRow], str]:
    """Scaling rows and hint over runs given as (trainers, global samples/s), one job each."""
    single = next((figures.Throughput(sps_, sps_, 1) for n, sps_ in runs if n == 1), None)
    return figures.scaling_rows(
        [(job, figures.Throughput(sps_, sps_ / n, n), float(n)) for job, (n, sps_) in
         enumerate(runs, start=1)],
        single,
    )  # fmt: skip


def test_scaling_rows_and_the_hint_where_adding_trainers_stops_paying() -> None:
    rows, hint = scaling_of((1, 1000.0), (2, 1900.0), (3, 2200.0))
    assert [(r.workers, r.global_speedup) for r in rows] == [(1, 1.0), (2, 1.9), (3, 2.2)]
    assert rows[1].samples_per_dollar == pytest.approx(1900 * 3600 / 2)
    assert hint == (
        "Going from 2 to 3 trainers, each added trainer gave only 30 % of one trainer's "
        "throughput: beyond 2 trainers you pay for more than you gain — use 2 unless "
        "finishing sooner is worth it."
    )


def test_the_hint_says_when_adding_trainers_made_the_run_slower() -> None:
    # 1 master and 2 workers, slower in all than the master alone.
    _, hint = scaling_of((1, 1000.0), (3, 260.0))
    assert hint == (
        "Going from 1 to 3 trainers, each added trainer lowered total throughput "
        "(\u221237 % of one trainer's); this program ran fastest with 1 trainer — try fewer."
    )


def test_the_hint_says_when_adding_trainers_still_pays() -> None:
    _, hint = scaling_of((1, 1000.0), (2, 1900.0), (4, 3500.0))
    assert hint == (
        "Each added trainer gave 80 % or more of one trainer's throughput, up to 4 trainers: "
        "adding trainers still pays — try more to finish sooner."
    )


def test_the_hint_says_what_to_run_to_learn_more() -> None:
    assert scaling_of() == ([], "")
    assert scaling_of((2, 1900.0))[1] == (
        "Speedup and efficiency need a 1-trainer run of this program: launch a 1-trainer "
        "baseline to measure them."
    )
    assert scaling_of((1, 1000.0))[1] == (
        "Only runs on 1 trainer so far: run this program on another trainer count to see how "
        "it scales."
    )


def loss_and_accuracy(loss_scale: float, *reports: tuple[float, float]) -> list[dict[str, Any]]:
    """A loss curve of the given scale, and eval_accuracy reports as (ts, value)."""
    loss = [p for p in curves(loss_scale, 0.0) if p["name"] != "eval_accuracy"]
    return loss + [
        {"name": "eval_accuracy", "value": v, "step": 10 * k, "ts": ts, "role": "master",
         "index": 0} for k, (ts, v) in enumerate(reports, start=1)
    ]  # fmt: skip


def test_a_baseline_on_fewer_trainers_is_judged_on_final_accuracy_not_its_curves() -> None:
    # 3 trainers: a loss curve far above the 1-trainer baseline's per epoch (a 3x global batch),
    # the same final accuracy, reached sooner.
    run = loss_and_accuracy(1.5, (100.0, 0.90), (105.0, 0.975))
    base = loss_and_accuracy(1.0, (20.0, 0.90), (40.0, 0.98))
    different = figures.Different("it ran 1 trainer and this job 3")
    verdict = figures.compare_with_baseline(
        run, base, different=different, starts=figures.Starts(run=95.0, baseline=0.0)
    )
    assert verdict.matches is True
    assert verdict.curves_judged is False and verdict.note == "it ran 1 trainer and this job 3"
    assert verdict.loss_distance == pytest.approx(0.5)
    assert verdict.target_accuracy == pytest.approx(0.97)
    assert (verdict.seconds_to_target, verdict.baseline_seconds_to_target) == (10.0, 40.0)
    assert verdict.reasons == [
        "final eval accuracy 0.9750 vs 0.9800 (within ±0.01)",
        "reached eval accuracy 0.9700 in 10 s vs 40 s for the baseline (4.0× sooner)",
        "loss curves 50.0% apart by step (not judged: see the note)",
    ]
    assert verdict.as_dict()["curves_judged"] is False


def test_a_baseline_on_fewer_trainers_still_fails_on_a_worse_final_accuracy() -> None:
    different = figures.Different("by design")
    verdict = figures.compare_with_baseline(
        curves(1.0, 0.90), curves(1.0, 0.98), different=different,
        starts=figures.Starts(0.0, 0.0),
    )  # fmt: skip
    assert verdict.matches is False
    assert verdict.reasons[:2] == [
        "final eval accuracy 0.9000 vs 0.9800 (outside ±0.01)",
        "has not reached eval accuracy 0.9700 (the baseline did in 90 s)",
    ]
    # Without an accuracy to compare there is nothing to say yet.
    assert figures.compare_with_baseline([], curves(1.0, 0.98), different=different).matches is None


def test_the_page_warning_and_the_gpu_idle_health_rule_judge_alike() -> None:
    """One algorithm (healthrules.LowRun): the figure flags an instance exactly when a gpu-idle
    rule with the defaults fires on the same samples, and the server words the warning."""
    from jobs.healthrules import Watch, parse_rules

    (rule,) = parse_rules([{"kind": "gpu-idle", "action": "warn"}])
    for values in ([70] * 8, [70] * 6 + [95, 70], [70, 95] * 4, [79.9] * 7, [80] * 8, [50]):
        times = [1000.0 + 10 * k for k in range(len(values))]
        samples = [{"name": "gpu_util_percent", "value": v, "ts": t, "role": "master",
                    "index": 0} for v, t in zip(values, times, strict=True)]  # fmt: skip
        slow = figures.low_gpu_utilisation(samples, now=times[-1])
        watch = Watch([rule], started_at=0.0)
        fired = [f for v, t in zip(values, times, strict=True)
                 for f in watch.metric("master", 0, "gpu_util_percent", v, None, t)]  # fmt: skip
        assert (slow == ["master"]) == bool(fired), values
    assert figures.low_gpu_warning([]) == ""
    assert figures.low_gpu_warning(["worker-1", "worker-2"]) == (
        "⚠ GPU utilisation under 80 % for a minute on worker-1, worker-2: the GPUs wait on "
        "something else (input, the network, the CPU)"
    )
