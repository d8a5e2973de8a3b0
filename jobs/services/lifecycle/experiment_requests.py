"""Asking the console worker to move an experiment on: what the writers of job state and the log
keeper call when a trial's job ends or its objective metric arrives, below the experiments'
driver (jobs.services.experiments.driver) that answers, so that they need not import it.

Both are hints: should one be lost (the console worker killed with it in hand), the console
worker's experiment sweep finds the same work within its interval.
"""

from collections.abc import Iterable

from django.db import transaction

from console.celery import app
from jobs.models import Trial
from workers import contract

TASK_ADVANCE_EXPERIMENT = "trainyard.console.advance_experiment"
TASK_JUDGE_TRIAL = "trainyard.console.judge_trial"


def job_ended(job_id: int) -> None:
    """The job has ended: if it is a trial, advance its experiment once this commits."""
    transaction.on_commit(lambda: _advance_if_trial(job_id), robust=True)


def log_archived(job_id: int) -> None:
    """Every line and point of the ended job is in the database: a trial that succeeded is
    told to the searcher only then (its last points may arrive after its end)."""
    transaction.on_commit(lambda: _advance_if_trial(job_id), robust=True)


def _advance_if_trial(job_id: int) -> None:
    experiment_id = Trial.objects.filter(job_id=job_id).values_list("experiment_id").first()
    if experiment_id is not None:
        request_advance(experiment_id[0])


def request_advance(experiment_id: int) -> None:
    app.send_task(
        TASK_ADVANCE_EXPERIMENT,
        kwargs={"experiment_id": experiment_id},
        queue=contract.CONSOLE_QUEUE,
    )


def metrics_archived(job_id: int, names: Iterable[str]) -> None:
    """Points named `names` of the job were written: if it is a running trial and one of them
    is its experiment's objective, judge it once this commits."""
    if not Trial.objects.filter(
        job_id=job_id,
        state=Trial.State.RUNNING,
        experiment__objective_metric__in=set(names),
    ).exists():
        return
    transaction.on_commit(
        lambda: app.send_task(
            TASK_JUDGE_TRIAL, kwargs={"job_id": job_id}, queue=contract.CONSOLE_QUEUE
        ),
        robust=True,
    )
