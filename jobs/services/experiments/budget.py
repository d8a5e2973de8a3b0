"""What an experiment's trials used, and how many more may start.

Hours are measured as the console measures use everywhere else (fair share's usage): each
attempt of a trial's job, from its start to its end (or now), times the job's cores or GPUs.
A new trial starts only while every term of the budget has room; hours run over by the trials
that are running when the budget is spent are stopped (driver), so an experiment never goes on
past its budget.
"""

from dataclasses import dataclass
from datetime import datetime

from django.utils import timezone

from jobs.models import Experiment, JobAttempt, Trial
from jobs.services.experiments import space


@dataclass(frozen=True)
class Used:
    trials: int  # every trial asked so far, waiting ones included
    running: int  # waiting or running: what counts against `parallel`
    core_hours: float
    gpu_hours: float


def attempt_hours(started: datetime, finished: datetime | None, now: datetime) -> float:
    end = finished if finished is not None else now
    return max(0.0, (end - started).total_seconds()) / 3600.0


def hours_of(experiment: Experiment, now: datetime | None = None) -> tuple[float, float]:
    """Core-hours and GPU-hours the experiment's trial jobs used so far."""
    now = now or timezone.now()
    rows = (
        JobAttempt.objects.filter(job__trial__experiment=experiment, started__isnull=False)
        .order_by()
        .values_list("started", "finished", "job__cpu_total", "job__gpus_total")
    )
    cores = gpus = 0.0
    for started, finished, cpu, gpu in rows:
        assert started is not None  # filtered so
        hours = attempt_hours(started, finished, now)
        cores += hours * cpu
        gpus += hours * gpu
    return cores, gpus


def used_of(experiment: Experiment, now: datetime | None = None) -> Used:
    states = list(experiment.trials.values_list("state", flat=True))
    active = sum(1 for s in states if s in (Trial.State.WAITING, Trial.State.RUNNING))
    cores, gpus = hours_of(experiment, now)
    return Used(len(states), active, cores, gpus)


def trial_limit(experiment: Experiment) -> int:
    """The trials the experiment may ask in all: its budget, or its grid's size if smaller."""
    if experiment.searcher == Experiment.Searcher.GRID:
        return min(experiment.max_trials, space.grid_size(space.dimensions_of(experiment.space)))
    return experiment.max_trials


def hours_spent(experiment: Experiment, used: Used) -> str:
    """Which hour budget is spent, in words; "" while both have room."""
    if experiment.max_core_hours is not None and used.core_hours >= experiment.max_core_hours:
        return f"its budget of {experiment.max_core_hours:g} core-hours is spent"
    if experiment.max_gpu_hours is not None and used.gpu_hours >= experiment.max_gpu_hours:
        return f"its budget of {experiment.max_gpu_hours:g} GPU-hours is spent"
    return ""


def new_trials_allowed(experiment: Experiment, used: Used) -> int:
    """How many more trials may be asked now: within the trials left, the parallel trials,
    and not once an hour budget is spent."""
    if hours_spent(experiment, used):
        return 0
    left = trial_limit(experiment) - used.trials
    at_once = experiment.parallel_trials - used.running
    return max(0, min(left, at_once))
