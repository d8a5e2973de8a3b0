"""The restart policy's decisions, with Celery messages captured: when a failure restarts the
job, what the old attempt's late reports may change, exclusion, eviction and the back-off."""

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from jobs.healthrules import Watch, parse_rules
from jobs.models import Job, JobAttempt, Node, Replica
from jobs.services import health
from jobs.services import nodes as node_service
from jobs.services.lifecycle import reports, restarts
from jobs.services.submission import check_job_request, submit_job
from tests.unit.helpers import SentTasks, job_request
from workers import contract

pytestmark = pytest.mark.usefixtures("catalog", "code_root", "redis_url")

Capture = Callable[..., Any]


def launch(alice: User, capture: Capture, **restart: Any) -> Job:
    """A 2-instance job, started; `restart` is its restart policy (none: never)."""
    request = job_request(instances=2)
    if restart:
        request["restart"] = {"policy": "on-failure", **restart}
    with capture(execute=True):
        job = submit_job(alice, check_job_request(request))
    start_all(job, capture)
    return job


def start_all(job: Job, capture: Capture) -> None:
    job.refresh_from_db()
    for r in job.replicas.filter(attempt=job.attempt).select_related("node"):
        assert r.node is not None, "not placed"
        with capture(execute=True):
            reports.replica_started(job.pk, r.role, r.index, r.node.name, "a", attempt=r.attempt)
    job.refresh_from_db()
    assert job.state == Job.State.RUNNING


def exit_of(job: Job, capture: Capture, tag: str, outcome: str, code: int, attempt: int) -> None:
    replica = next(
        r for r in job.replicas.filter(attempt=attempt).select_related("node") if r.tag == tag
    )
    assert replica.node is not None
    with capture(execute=True):
        reports.replica_exited(
            job.pk, replica.role, replica.index, replica.node.name, outcome, code,
            "exited" if code else "", [], attempt=attempt,
        )  # fmt: skip
    job.refresh_from_db()


def test_without_a_policy_a_failure_ends_the_job(
    alice: User,
    nodes: list[Node],
    sent_tasks: SentTasks,
    django_capture_on_commit_callbacks: Capture,
) -> None:
    job = launch(alice, django_capture_on_commit_callbacks)
    exit_of(job, django_capture_on_commit_callbacks, "worker-1", "failed", 1, 0)
    assert job.state == Job.State.FAILED and job.attempt == 0


def test_a_failure_restarts_the_whole_job_after_the_old_attempt_is_gone(
    alice: User,
    nodes: list[Node],
    sent_tasks: SentTasks,
    django_capture_on_commit_callbacks: Capture,
) -> None:
    capture = django_capture_on_commit_callbacks
    job = launch(alice, capture, max_restarts=2, backoff_seconds=0)
    exit_of(job, capture, "worker-1", "failed", 1, 0)
    assert (job.state, job.attempt, job.restarts_used) == (Job.State.RESTARTING, 1, 1)
    # The old master is told to stop (only its attempt), and the new attempt waits for it.
    _, stop, _ = sent_tasks.named(contract.TASK_STOP_JOB)[-1]
    assert stop["up_to_attempt"] == 0 and stop["replicas"][0]["attempt"] == 0
    assert not job.replicas.filter(attempt=1).exclude(state=Replica.State.PENDING).exists()
    exit_of(job, capture, "master", "stopped", -15, 0)
    assert job.state == Job.State.QUEUED
    start_all(job, capture)  # placed afresh, started: the second attempt runs
    specs = [s["spec"] for _, s, _ in sent_tasks.named(contract.TASK_START_REPLICA)]
    assert {s["attempt"] for s in specs[-2:]} == {1} and specs[-1]["max_restarts"] == 2
    # A late report of the old attempt changes nothing of the new one.
    exit_of(job, capture, "master", "failed", 1, 0)
    assert job.state == Job.State.RUNNING and job.attempt == 1
    exit_of(job, capture, "master", "succeeded", 0, 1)
    exit_of(job, capture, "worker-1", "succeeded", 0, 1)
    assert job.state == Job.State.SUCCEEDED
    first, second = JobAttempt.objects.filter(job=job).order_by("number")
    assert "worker-1" in first.reason and first.counted and second.finished and not second.reason


def test_the_last_allowed_failure_ends_the_job_with_every_attempts_reason(
    alice: User,
    nodes: list[Node],
    sent_tasks: SentTasks,
    django_capture_on_commit_callbacks: Capture,
) -> None:
    capture = django_capture_on_commit_callbacks
    job = launch(alice, capture, max_restarts=1, backoff_seconds=0)
    exit_of(job, capture, "worker-1", "failed", 1, 0)
    exit_of(job, capture, "master", "stopped", -15, 0)
    start_all(job, capture)
    exit_of(job, capture, "master", "failed", 2, 1)
    assert job.state == Job.State.FAILED
    assert job.reason.startswith("attempt 2: master on")
    assert "gave up after 1 restart; earlier attempts:\nattempt 1: worker-1 on" in job.reason


def test_the_back_off_holds_the_next_attempt_and_a_cancel_ends_it(
    alice: User,
    nodes: list[Node],
    sent_tasks: SentTasks,
    django_capture_on_commit_callbacks: Capture,
) -> None:
    capture = django_capture_on_commit_callbacks
    job = launch(alice, capture, max_restarts=1, backoff_seconds=600)
    exit_of(job, capture, "worker-1", "failed", 1, 0)
    exit_of(job, capture, "master", "stopped", -15, 0)
    assert job.state == Job.State.RESTARTING, "the back-off is not over"
    (_, resume, queue), *_ = sent_tasks.named(contract.TASK_RESUME_RESTART)
    assert resume == {"job_id": job.pk} and queue == contract.CONSOLE_QUEUE
    assert not restarts.resume(job.pk)
    Job.objects.filter(pk=job.pk).update(restart_at=timezone.now() - timedelta(seconds=1))
    with capture(execute=True):
        assert restarts.resume(job.pk)
    job.refresh_from_db()
    assert job.state == Job.State.QUEUED and job.attempt == 1


def test_a_node_is_excluded_only_when_the_job_fits_without_it(
    alice: User,
    nodes: list[Node],
    sent_tasks: SentTasks,
    django_capture_on_commit_callbacks: Capture,
) -> None:
    capture = django_capture_on_commit_callbacks
    job = launch(alice, capture, max_restarts=2, backoff_seconds=0, exclude_failed_node=True)
    failed_on = job.replicas.select_related("node").get(role="worker").node
    assert failed_on is not None
    exit_of(job, capture, "worker-1", "failed", 1, 0)
    assert job.excluded_nodes == [failed_on.name]
    exit_of(job, capture, "master", "stopped", -15, 0)
    assert {r.node_id for r in job.replicas.filter(attempt=1)} == {
        n.pk for n in nodes if n.pk != failed_on.pk
    }
    # The other node fails too: excluding it as well would leave nowhere, so it is kept.
    start_all(job, capture)
    exit_of(job, capture, "master", "failed", 1, 1)
    assert len(job.excluded_nodes) == 1 and "not excluded" in job.reason


def test_eviction_restarts_without_using_a_restart_and_fails_a_never_job(
    alice: User,
    nodes: list[Node],
    sent_tasks: SentTasks,
    django_capture_on_commit_callbacks: Capture,
) -> None:
    capture = django_capture_on_commit_callbacks
    keeps = launch(alice, capture, max_restarts=1, backoff_seconds=0)
    never = launch(alice, capture)
    where = {
        r.node.name for j in (keeps, never) for r in j.replicas.select_related("node") if r.node
    }
    with capture(execute=True):
        evicted = node_service.drain(sorted(where), evict=True, grace_seconds=12, by="bob")
    assert sorted(evicted) == sorted([keeps.pk, never.pk])
    keeps.refresh_from_db()
    never.refresh_from_db()
    assert keeps.state == Job.State.RESTARTING and keeps.restarts_used == 0
    assert never.state == Job.State.FAILED and "its restart policy is never" in never.reason
    assert "drained with eviction by bob" in keeps.reason
    graces = {s["grace_seconds"] for _, s, _ in sent_tasks.named(contract.TASK_STOP_JOB)}
    assert graces == {12}
    assert JobAttempt.objects.get(job=keeps, number=0).counted is False


def test_a_rule_that_stops_a_job_keeps_its_reason_when_the_instance_then_fails(
    alice: User,
    nodes: list[Node],
    sent_tasks: SentTasks,
    django_capture_on_commit_callbacks: Capture,
) -> None:
    """A trainer prints 'CUDA out of memory' and exits 1 a moment later: the rule stopped the
    job (no restart, though the policy allows one) and its reason stays, whichever comes
    first to the console."""
    capture = django_capture_on_commit_callbacks
    job = launch(alice, capture, max_restarts=2, backoff_seconds=0)
    (rule,) = parse_rules([{"kind": "log-pattern", "pattern": "out of memory", "action": "stop"}])
    watch = Watch([rule], started_at=0.0)
    (firing,) = watch.line("worker", 1, "CUDA out of memory", "stderr", 1.0)
    with capture(execute=True):
        assert health.fired(job.pk, 0, firing) == "stopped the job"
    exit_of(job, capture, "worker-1", "failed", 1, 0)
    assert job.state == Job.State.FAILED and job.restarts_used == 0
    assert job.reason.startswith("health rule: worker-1 printed 'CUDA out of memory'")
    event = job.health_events.get()
    worker = job.replicas.select_related("node").get(role="worker")
    assert worker.node is not None
    assert (event.action, event.node, event.outcome) == (
        "stop",
        worker.node.name,
        "stopped the job",
    )
