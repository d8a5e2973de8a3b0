"""What moves an experiment on without anyone asking (jobs/services/lifecycle/
experiment_requests.py): a trial's job ending asks for an advance, its objective archived by
the log keeper asks for a judgement, each once the change has committed; other jobs and other
metrics ask for nothing. The console worker's sweep does both for whatever a lost hint missed."""

from typing import Any

import pytest
from django.contrib.auth.models import User

from jobs.models import Experiment, Job, MetricPoint, Trial
from jobs.services.experiments import control, driver
from jobs.services.lifecycle import experiment_requests, outcomes
from jobs.services.submission import check_job_request, submit_job
from tests.conftest import set_quota
from tests.unit.experiment_helpers import report, search_request, search_storage
from tests.unit.helpers import SentTasks, job_request

__all__ = ["search_storage"]

pytestmark = pytest.mark.usefixtures("catalog", "code_root", "nodes", "search_storage")


def running_trials(alice: User) -> tuple[Experiment, list[Trial]]:
    set_quota(alice, cpu=8, jobs=8)
    experiment = control.create_experiment(alice, search_request())
    driver.advance(experiment.pk)
    return experiment, list(experiment.trials.select_related("job"))


def test_a_trials_job_ending_asks_to_advance_its_experiment(
    alice: User, sent_tasks: SentTasks, django_capture_on_commit_callbacks: Any
) -> None:
    experiment, trials = running_trials(alice)
    assert trials[0].job is not None
    with django_capture_on_commit_callbacks(execute=True):
        outcomes.cancel(trials[0].job.pk, alice)
    assert sent_tasks.named(experiment_requests.TASK_ADVANCE_EXPERIMENT) == [
        (experiment_requests.TASK_ADVANCE_EXPERIMENT, {"experiment_id": experiment.pk}, "console")
    ]


def test_a_trials_log_archived_asks_to_advance_its_experiment(
    alice: User, sent_tasks: SentTasks, django_capture_on_commit_callbacks: Any
) -> None:
    experiment, trials = running_trials(alice)
    assert trials[0].job is not None
    with django_capture_on_commit_callbacks(execute=True):
        experiment_requests.log_archived(trials[0].job.pk)
    assert sent_tasks.named(experiment_requests.TASK_ADVANCE_EXPERIMENT) == [
        (experiment_requests.TASK_ADVANCE_EXPERIMENT, {"experiment_id": experiment.pk}, "console")
    ]


def test_another_jobs_end_asks_nothing(
    alice: User, sent_tasks: SentTasks, django_capture_on_commit_callbacks: Any
) -> None:
    running_trials(alice)
    job = submit_job(alice, check_job_request(job_request(instances=1), owner=alice))
    with django_capture_on_commit_callbacks(execute=True):
        outcomes.cancel(job.pk, alice)
    assert sent_tasks.named(experiment_requests.TASK_ADVANCE_EXPERIMENT) == []


def test_the_objective_archived_asks_to_judge_the_trial(
    alice: User, sent_tasks: SentTasks, django_capture_on_commit_callbacks: Any
) -> None:
    _, trials = running_trials(alice)
    assert trials[0].job is not None
    job_id = trials[0].job.pk
    with django_capture_on_commit_callbacks(execute=True):
        experiment_requests.metrics_archived(job_id, {"loss", "lr"})
    assert sent_tasks.named(experiment_requests.TASK_JUDGE_TRIAL) == []
    with django_capture_on_commit_callbacks(execute=True):
        experiment_requests.metrics_archived(job_id, {"loss", "eval_accuracy"})
    assert sent_tasks.named(experiment_requests.TASK_JUDGE_TRIAL) == [
        (experiment_requests.TASK_JUDGE_TRIAL, {"job_id": job_id}, "console")
    ]


def test_the_sweep_judges_and_advances_what_no_hint_reached(
    alice: User, sent_tasks: SentTasks
) -> None:
    experiment, trials = running_trials(alice)
    first, second, third = trials
    assert first.job and second.job and third.job
    report(first.job, 1, 0.9)
    report(second.job, 1, 0.2)
    assert driver.sweep() == 1
    second.refresh_from_db()
    assert second.state == Trial.State.PRUNED
    assert Job.objects.get(pk=second.job.pk).state == Job.State.CANCELLED
    assert MetricPoint.objects.filter(job=second.job).count() == 1
    driver.sweep()  # the pruned trial's place is taken by the next
    assert experiment.trials.filter(state=Trial.State.RUNNING).count() == 3
    assert experiment.trials.count() == 4
