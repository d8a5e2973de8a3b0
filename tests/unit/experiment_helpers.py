"""What the experiment unit tests share: a search request over the digits example, Optuna's
storage in a file of the test's own, and a trial's job reporting its objective and ending."""

import itertools
import time
from pathlib import Path
from typing import Any

import pytest

from jobs.models import Job, MetricPoint
from jobs.services.lifecycle import transitions
from tests.unit.helpers import job_request

_cursors = itertools.count(1)


@pytest.fixture
def search_storage(settings: Any, tmp_path: Path) -> str:
    """Each test's Optuna studies in a file of its own (the default is beside var/'s database,
    which the in-memory unit-test database does not go with)."""
    url = f"sqlite:///{tmp_path / 'search.sqlite3'}"
    settings.TRAINYARD_SEARCH_DATABASE_URL = url
    return url


def search_request(**overrides: Any) -> dict[str, Any]:
    request: dict[str, Any] = {
        "name": "digits-lr-bs",
        "template": job_request(
            instances=1, program={"script": "digits-ddp", "args": ["--epochs", "9"]}
        ),
        "space": {
            "--lr": {"type": "float", "low": 0.01, "high": 1.0, "log": True},
            "--batch-size": {"type": "int", "low": 16, "high": 128, "log": True},
        },
        "objective": {"metric": "eval_accuracy", "goal": "max", "unit": "epoch"},
        "searcher": "random",
        "pruner": "successive_halving",
        "pruner_options": {"min_resource": 1, "reduction_factor": 3},
        "budget": {"trials": 6, "parallel": 3},
        "seed": 7,
    }
    request.update(overrides)
    return request


def report(job: Job, epoch: int, value: float, name: str = "eval_accuracy") -> None:
    """The trainer's rank 0 reported `name` = `value` at the end of `epoch` (as digits does)."""
    MetricPoint.objects.create(
        job=job,
        cursor=next(_cursors),
        role="master",
        index=0,
        name=name,
        value=value,
        step=epoch * 10,
        epoch=float(epoch),
        ts=time.time(),
    )


def end_job(
    job: Job, state: str = Job.State.SUCCEEDED, reason: str = "", archived: bool = True
) -> None:
    """The job ran and ended (its states as the lifecycle writes them), and, unless not
    `archived`, the log keeper has put its last lines and points in the database."""
    job.refresh_from_db()
    if job.state == Job.State.QUEUED and state == Job.State.SUCCEEDED:
        transitions.move_job(job, Job.State.RUNNING)
    assert transitions.move_job(job, state, reason), job.state
    if archived:
        Job.objects.filter(pk=job.pk).update(log_archived=True)
