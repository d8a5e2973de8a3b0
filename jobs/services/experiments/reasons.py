"""What a trial or an experiment says about why it stopped or waits: one place for the words
the job page, the experiment page, the CLI and the API all show."""

import math


def _value(value: float) -> str:
    return "not a number" if math.isnan(value) else f"{value:.4g}"


def _at(metric: str, value: float, unit: str, resource: int) -> str:
    return f"stopped early: {metric} {_value(value)} at {unit} {resource}"


def below_median(
    metric: str, value: float, unit: str, resource: int, median: float, trials: int, goal: str
) -> str:
    """ "stopped early: eval_accuracy 0.61 at epoch 3, below the median 0.83 of 7 trials"."""
    side = "below" if goal == "max" else "above"
    plural = "s" if trials != 1 else ""
    return (
        f"{_at(metric, value, unit, resource)}, {side} the median {_value(median)} "
        f"of {trials} trial{plural}"
    )


def below_rung(
    metric: str,
    value: float,
    unit: str,
    resource: int,
    cutoff: float,
    promoted: int,
    trials: int,
    goal: str,
) -> str:
    """Successive halving: "stopped early: eval_accuracy 0.61 at epoch 3, below the cut-off
    0.83: only the best 2 of 7 trials at epoch 3 go on". (The rung is named by its epoch: its
    number means nothing to the person reading.)"""
    side = "below" if goal == "max" else "above"
    return (
        f"{_at(metric, value, unit, resource)}, {side} the cut-off {_value(cutoff)}: only the "
        f"best {promoted} of {trials} trials at {unit} {resource} go on"
    )


def not_a_number(metric: str, unit: str, resource: int) -> str:
    return f"stopped early: {metric} is not a number at {unit} {resource}"


def pruned(metric: str, value: float, unit: str, resource: int) -> str:
    """When the pruner's figures cannot be told (a Hyperband bracket's)."""
    return f"{_at(metric, value, unit, resource)}, behind the other trials"


def stopped_by(username: str) -> str:
    return f"experiment stopped by {username}"


def budget_spent(what: str) -> str:
    """`what`: budget.hours_spent's words."""
    return f"experiment stopped: {what}"


def no_objective(metric: str) -> str:
    return f"the job succeeded but never reported {metric}"


def job_ended(state: str, reason: str) -> str:
    first = reason.splitlines()[0] if reason else ""
    return f"its job {state}" + (f": {first}" if first else "")


def waiting_for_quota(number: int, refusal: str) -> str:
    return f"trial {number} waits: {refusal}"
