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
    # Seed 000's example: 600 per card on many cards against 800 on one card gives 0.75.
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
    points += sps("master", 0, *([500.0] * 101))  # steps 0..100
    result = figures.progress(points, elapsed_seconds=50.0)
    assert result is not None and result.by == "step"
    assert result.fraction == pytest.approx(0.25)
    assert result.eta_seconds == pytest.approx(150.0)


def test_it_warns_when_gpu_utilisation_stays_under_80_for_a_minute() -> None:
    def gpu(role: str, index: int, values: Sequence[float]) -> list[dict[str, Any]]:
        return [{"name": "gpu_util_percent", "value": v, "ts": 1000.0 + 10 * k, "role": role,
                 "index": index} for k, v in enumerate(values)]  # fmt: skip

    points = gpu("master", 0, [70] * 8) + gpu("worker", 1, [70] * 6 + [95, 70])
    assert figures.low_gpu_utilisation(points, now=1070.0) == ["master"]
    assert figures.low_gpu_utilisation(gpu("master", 0, [50]), now=1000.0) == []  # too soon


def test_scaling_rows_hint_where_adding_workers_stops_paying() -> None:
    single = figures.Throughput(1000.0, 1000.0, 1)
    runs = [
        (1, single, 1.0),
        (2, figures.Throughput(1900.0, 950.0, 2), 2.0),
        (3, figures.Throughput(2200.0, 733.3, 3), 3.0),
    ]
    rows, hint = figures.scaling_rows(runs, single)
    assert [(r.workers, r.global_speedup) for r in rows] == [(1, 1.0), (2, 1.9), (3, 2.2)]
    assert rows[1].samples_per_dollar == pytest.approx(1900 * 3600 / 2)
    assert "from 2 to 3 workers added 0.30" in hint
