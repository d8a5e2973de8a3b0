"""An experiment's budget arithmetic (jobs/services/experiments/budget.py) and the words a
stopped trial says (jobs/services/experiments/reasons.py)."""

from datetime import UTC, datetime, timedelta

from jobs.models import Experiment
from jobs.services.experiments import budget, reasons

NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)


def experiment(**fields: object) -> Experiment:
    values: dict[str, object] = {
        "max_trials": 12, "parallel_trials": 3, "searcher": "random", "space": {},
    }  # fmt: skip
    values.update(fields)
    return Experiment(**values)


def test_new_trials_fit_the_trials_left_and_the_parallel_room() -> None:
    e = experiment()
    assert budget.new_trials_allowed(e, budget.Used(0, 0, 0.0, 0.0)) == 3
    assert budget.new_trials_allowed(e, budget.Used(5, 2, 0.0, 0.0)) == 1
    assert budget.new_trials_allowed(e, budget.Used(11, 0, 0.0, 0.0)) == 1
    assert budget.new_trials_allowed(e, budget.Used(12, 0, 0.0, 0.0)) == 0
    assert budget.new_trials_allowed(e, budget.Used(4, 3, 0.0, 0.0)) == 0


def test_no_new_trial_once_an_hour_budget_is_spent() -> None:
    e = experiment(max_core_hours=2.0, max_gpu_hours=1.0)
    assert budget.hours_spent(e, budget.Used(1, 1, 1.99, 0.5)) == ""
    assert budget.hours_spent(e, budget.Used(1, 1, 2.0, 0.0)) == (
        "its budget of 2 core-hours is spent"
    )
    assert budget.hours_spent(e, budget.Used(1, 1, 0.0, 1.5)) == (
        "its budget of 1 GPU-hours is spent"
    )
    assert budget.new_trials_allowed(e, budget.Used(1, 0, 2.5, 0.0)) == 0


def test_a_grid_asks_no_more_trials_than_it_has_points() -> None:
    e = experiment(
        searcher="grid",
        space={
            "--lr": {"type": "choice", "choices": [0.1, 0.2]},
            "--batch-size": {"type": "int", "low": 16, "high": 32, "step": 16},
        },
    )
    assert budget.trial_limit(e) == 4
    assert budget.new_trials_allowed(e, budget.Used(3, 0, 0.0, 0.0)) == 1


def test_an_attempt_counts_from_its_start_to_its_end_or_now() -> None:
    assert budget.attempt_hours(NOW - timedelta(minutes=30), NOW, NOW) == 0.5
    assert budget.attempt_hours(NOW - timedelta(hours=2), None, NOW) == 2.0
    assert budget.attempt_hours(NOW, NOW - timedelta(hours=1), NOW) == 0.0


def test_the_reasons_read_as_sentences() -> None:
    assert reasons.below_median("eval_accuracy", 0.61, "epoch", 3, 0.83, 7, "max") == (
        "stopped early: eval_accuracy 0.61 at epoch 3, below the median 0.83 of 7 trials"
    )
    assert reasons.below_median("loss", 2.5, "step", 300, 1.25, 1, "min") == (
        "stopped early: loss 2.5 at step 300, above the median 1.25 of 1 trial"
    )
    assert reasons.below_rung("eval_accuracy", 0.61, "epoch", 3, 0.83, 2, 7, "max") == (
        "stopped early: eval_accuracy 0.61 at epoch 3, below the cut-off 0.83: only the best 2 "
        "of 7 trials at epoch 3 go on"
    )
    assert reasons.not_a_number("loss", "epoch", 2) == (
        "stopped early: loss is not a number at epoch 2"
    )
    assert reasons.stopped_by("alice") == "experiment stopped by alice"
    assert reasons.job_ended("failed", "master on node-1: exit 1\nlast lines") == (
        "its job failed: master on node-1: exit 1"
    )
