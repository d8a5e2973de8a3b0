"""Elastic jobs through the lifecycle, with Celery messages captured (issue 47): an elastic job
starts with what fits, grows into room nobody waits for once its size has settled, keeps its
instances where they ran, shrinks (uncounted) when a node is lost, and is held to its restart
policy when it failed on its own. The integration test runs the same on a real stack."""

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from jobs.models import Job, JobAttempt, Node, Replica
from jobs.services.lifecycle import outcomes, reports, restarts
from jobs.services.placement import Demand, Room, place_elastic
from jobs.services.scheduler import scheduling
from jobs.services.submission import ValidationFailed, check_job_request, submit_job
from tests.conftest import make_stale
from tests.unit.helpers import SentTasks, job_request
from workers import contract

pytestmark = pytest.mark.usefixtures("catalog", "code_root", "redis_url")

Capture = Callable[..., Any]


@pytest.fixture
def two_small_nodes(db: None) -> list[Node]:
    """Two live nodes of 2 cores each."""
    now = timezone.now()
    return [
        Node.objects.create(
            name=f"node-{i}", address="127.0.0.1", cpu=2, memory_gb=32, last_heartbeat=now
        )
        for i in (1, 2)
    ]


def elastic_request(least: int = 1, most: int = 3, **restart: Any) -> dict[str, Any]:
    """A master and {least..most} workers of cpu-1: 1+least to 1+most instances."""
    request = job_request(instances=2)
    request["roles"]["worker"]["instances"] = {"min": least, "max": most}
    if restart:
        request["restart"] = {"policy": "on-failure", "backoff_seconds": 0, **restart}
    return request


def submit(user: User, capture: Capture, request: dict[str, Any]) -> Job:
    with capture(execute=True):
        return submit_job(user, check_job_request(request))


def start_all(job: Job, capture: Capture) -> None:
    job.refresh_from_db()
    for r in job.replicas.filter(attempt=job.attempt).select_related("node"):
        assert r.node is not None, f"{r.tag} not placed"
        with capture(execute=True):
            reports.replica_started(job.pk, r.role, r.index, r.node.name, "a", attempt=r.attempt)
    job.refresh_from_db()
    assert job.state == Job.State.RUNNING


def exit_of(job: Job, capture: Capture, tag: str, outcome: str, code: int) -> None:
    """The replica `tag` of the attempt before the current one's, or of the current one, ends
    as its agent reports it."""
    replica = (
        job.replicas.filter(state__in=Replica.HOLDING_STATES)
        .select_related("node")
        .order_by("attempt")
        .filter(role=tag.split("-")[0], index=int(tag.split("-")[1]) if "-" in tag else 0)
        .first()
    )
    assert replica is not None and replica.node is not None, f"{tag} does not run"
    with capture(execute=True):
        reports.replica_exited(
            job.pk, replica.role, replica.index, replica.node.name, outcome, code,
            "exited" if code else "", [], attempt=replica.attempt,
        )  # fmt: skip
    job.refresh_from_db()


def placement(job: Job) -> dict[str, str]:
    """Where the current attempt's instances are: {tag: node}."""
    return {
        r.tag: r.node.name
        for r in job.replicas.filter(attempt=job.attempt).select_related("node")
        if r.node is not None
    }


def started_specs(sent: SentTasks, job: Job) -> list[dict[str, Any]]:
    return [
        s["spec"]
        for _, s, _ in sent.named(contract.TASK_START_REPLICA)
        if s["spec"]["job_id"] == job.pk and s["spec"]["attempt"] == job.attempt
    ]


def a_filler_on_node_1(user: User, capture: Capture) -> Job:
    """A fixed 2-instance job of cpu-1 that takes node-1 whole (best fit packs it there)."""
    filler = submit(user, capture, job_request(instances=2))
    start_all(filler, capture)
    assert set(placement(filler).values()) == {"node-1"}
    return filler


def end(job: Job, capture: Capture) -> None:
    """Cancel a running job and let its instances report they stopped."""
    with capture(execute=True):
        outcomes.cancel(job.pk, job.owner)
    for tag in list(placement(job)):
        exit_of(job, capture, tag, "stopped", -15)


def test_an_elastic_job_starts_with_what_fits_and_drops_the_rest_of_its_attempt(
    alice: User,
    two_small_nodes: list[Node],
    sent_tasks: SentTasks,
    django_capture_on_commit_callbacks: Capture,
) -> None:
    capture = django_capture_on_commit_callbacks
    a_filler_on_node_1(alice, capture)
    job = submit(alice, capture, elastic_request(1, 3))
    assert (job.min_size, job.max_size, job.cpu_total) == (2, 4, 4)  # the quota counts the most
    job.refresh_from_db()
    assert placement(job) == {"master": "node-2", "worker-1": "node-2"}
    assert job.replicas.filter(attempt=0).count() == 2  # no instance waits for room
    start_all(job, capture)
    specs = started_specs(sent_tasks, job)
    assert {s["world_size"] for s in specs} == {2} and {s["resize_count"] for s in specs} == {0}
    attempt = JobAttempt.objects.get(job=job, number=0)
    assert (attempt.instances, attempt.resize) == (2, "")
    # The API says what was asked, and Run again asks it again.
    assert job.roles.get(role="worker").asked == {"min": 1, "max": 3}


def test_a_fixed_job_of_that_size_waits_where_the_elastic_one_starts(
    alice: User,
    two_small_nodes: list[Node],
    sent_tasks: SentTasks,
    django_capture_on_commit_callbacks: Capture,
) -> None:
    capture = django_capture_on_commit_callbacks
    a_filler_on_node_1(alice, capture)
    fixed = submit(alice, capture, job_request(instances=4))
    fixed.refresh_from_db()
    assert fixed.state == Job.State.QUEUED and not placement(fixed)


def test_it_grows_into_room_nobody_waits_for_keeping_its_instances_where_they_ran(
    alice: User,
    two_small_nodes: list[Node],
    sent_tasks: SentTasks,
    django_capture_on_commit_callbacks: Capture,
    settings: Any,
) -> None:
    capture = django_capture_on_commit_callbacks
    settings.TRAINYARD_ELASTIC_SETTLE_SECONDS = 3600
    filler = a_filler_on_node_1(alice, capture)
    job = submit(alice, capture, elastic_request(1, 3))
    start_all(job, capture)
    end(filler, capture)
    job.refresh_from_db()
    # Room freed, but its size has not held for the settle time: it trains on.
    assert job.state == Job.State.RUNNING and job.attempt == 0

    settings.TRAINYARD_ELASTIC_SETTLE_SECONDS = 0
    with capture(execute=True):
        scheduling.schedule()
    job.refresh_from_db()
    assert job.state == Job.State.RESTARTING and job.reason.startswith(
        "resizing: growing from 2 instances: room freed on node-1"
    )
    _, stop, _ = sent_tasks.named(contract.TASK_STOP_JOB)[-1]
    assert stop["job_id"] == job.pk and stop["up_to_attempt"] == 0
    exit_of(job, capture, "master", "stopped", -15)
    exit_of(job, capture, "worker-1", "stopped", -15)
    job.refresh_from_db()
    assert placement(job) == {
        "master": "node-2", "worker-1": "node-2", "worker-2": "node-1", "worker-3": "node-1",
    }  # fmt: skip
    start_all(job, capture)
    specs = started_specs(sent_tasks, job)
    assert {s["world_size"] for s in specs} == {4} and {s["resize_count"] for s in specs} == {1}
    assert (job.restarts_used, job.resizes) == (0, 1)
    grown = JobAttempt.objects.get(job=job, number=1)
    assert (grown.instances, grown.resize) == (4, "grew to 4: room freed on node-1")
    assert not JobAttempt.objects.get(job=job, number=0).counted
    # At its largest it does not grow again.
    with capture(execute=True):
        scheduling.schedule()
    job.refresh_from_db()
    assert job.state == Job.State.RUNNING and job.attempt == 1


def test_it_does_not_grow_into_room_a_waiting_job_is_placed_in(
    alice: User,
    two_small_nodes: list[Node],
    sent_tasks: SentTasks,
    django_capture_on_commit_callbacks: Capture,
    settings: Any,
) -> None:
    capture = django_capture_on_commit_callbacks
    settings.TRAINYARD_ELASTIC_SETTLE_SECONDS = 0
    filler = a_filler_on_node_1(alice, capture)
    job = submit(alice, capture, elastic_request(1, 3))
    start_all(job, capture)
    # A job waits for node-1's room: when the filler ends, the waiting job takes it.
    waiting = submit(alice, capture, job_request(instances=2))
    end(filler, capture)
    waiting.refresh_from_db()
    job.refresh_from_db()
    assert set(placement(waiting).values()) == {"node-1"}
    assert job.state == Job.State.RUNNING and job.attempt == 0


def grown_to_four(alice: User, capture: Capture, settings: Any) -> Job:
    """The elastic job at 4: master and worker-1 on node-2, workers 2 and 3 on node-1."""
    settings.TRAINYARD_ELASTIC_SETTLE_SECONDS = 0
    filler = a_filler_on_node_1(alice, capture)
    job = submit(alice, capture, elastic_request(1, 3, max_restarts=1))
    start_all(job, capture)
    end(filler, capture)
    exit_of(job, capture, "master", "stopped", -15)
    exit_of(job, capture, "worker-1", "stopped", -15)
    start_all(job, capture)
    assert len(placement(job)) == 4
    return job


def test_a_lost_node_shrinks_it_uncounted_once_every_instance_has_ended(
    alice: User,
    two_small_nodes: list[Node],
    sent_tasks: SentTasks,
    django_capture_on_commit_callbacks: Capture,
    settings: Any,
) -> None:
    capture = django_capture_on_commit_callbacks
    job = grown_to_four(alice, capture, settings)
    node_1 = two_small_nodes[0]
    heard = timezone.now() - timedelta(seconds=30)
    # node-1 dies. Its peers' collectives fail at once, and their agent says so first.
    exit_of(job, capture, "master", "failed", 1)
    assert job.state == Job.State.RESTARTING and job.reason.startswith("regrouping")
    assert job.restarts_used == 0  # nothing is decided yet
    exit_of(job, capture, "worker-1", "failed", 1)
    assert job.state == Job.State.RESTARTING
    # Then the reconciler finds node-1 lost: its instances failed when it was last heard.
    make_stale(node_1)
    for replica in job.replicas.filter(attempt=1, node=node_1):
        with capture(execute=True):
            outcomes.replica_ended(
                job, replica, Replica.State.FAILED, "node-1 lost: no heartbeat for 30 s", None,
                heard,
            )  # fmt: skip
    job.refresh_from_db()
    assert job.restarts_used == 0 and job.resizes == 2  # grown once, shrunk once
    assert placement(job) == {"master": "node-2", "worker-1": "node-2"}
    ended = JobAttempt.objects.get(job=job, number=1)
    assert (ended.counted, ended.judged, ended.reason) == (
        False, True, "node-1 lost: no heartbeat for 30 s",
    )  # fmt: skip
    start_all(job, capture)
    shrunk = JobAttempt.objects.get(job=job, number=2)
    assert (shrunk.instances, shrunk.resize) == (
        2,
        "shrank to 2: node-1 lost: no heartbeat for 30 s",
    )
    assert {s["world_size"] for s in started_specs(sent_tasks, job)} == {2}


def test_its_own_failure_is_a_restart_of_its_policy(
    alice: User,
    two_small_nodes: list[Node],
    sent_tasks: SentTasks,
    django_capture_on_commit_callbacks: Capture,
) -> None:
    capture = django_capture_on_commit_callbacks
    job = submit(alice, capture, elastic_request(1, 3, max_restarts=1))
    start_all(job, capture)
    assert len(placement(job)) == 4
    exit_of(job, capture, "worker-2", "failed", 1)
    for tag in ("master", "worker-1", "worker-3"):
        exit_of(job, capture, tag, "stopped", -15)
    job.refresh_from_db()
    ended = JobAttempt.objects.get(job=job, number=0)
    assert job.restarts_used == 1 and ended.counted
    assert ended.reason.startswith("worker-2 on node-") and ended.reason.endswith(": exited")
    # No back-off: placed again at once, at the size that fits.
    assert job.state == Job.State.QUEUED and len(placement(job)) == 4
    assert job.resizes == 0


def test_without_a_policy_its_own_failure_ends_it_in_the_attempt_that_failed(
    alice: User,
    two_small_nodes: list[Node],
    sent_tasks: SentTasks,
    django_capture_on_commit_callbacks: Capture,
) -> None:
    capture = django_capture_on_commit_callbacks
    job = submit(alice, capture, elastic_request(1, 3))
    start_all(job, capture)
    exit_of(job, capture, "worker-1", "failed", 1)
    for tag in ("master", "worker-2", "worker-3"):
        exit_of(job, capture, tag, "failed", 1)
    job.refresh_from_db()
    assert job.state == Job.State.FAILED and job.attempt == 0
    assert job.reason.startswith("worker-1 on node-")
    assert list(JobAttempt.objects.filter(job=job).values_list("number", flat=True)) == [0]
    assert not job.replicas.filter(attempt=1).exists()
    assert job.log_complete


def test_below_its_minimum_it_waits_saying_so(
    alice: User,
    two_small_nodes: list[Node],
    sent_tasks: SentTasks,
    django_capture_on_commit_callbacks: Capture,
) -> None:
    capture = django_capture_on_commit_callbacks
    a_filler_on_node_1(alice, capture)
    job = submit(alice, capture, elastic_request(2, 3))
    job.refresh_from_db()
    assert job.state == Job.State.QUEUED and not placement(job)
    assert "at least 3 instances, its minimum" in job.reason


def test_placement_takes_as_many_extra_as_fit_and_keeps_where_they_ran() -> None:
    def demand(role: str, index: int) -> Demand:
        return Demand((role, index), 1, 0, 1)

    required = [demand("master", 0), demand("worker", 1)]
    extra = [demand("worker", 2), demand("worker", 3)]
    rooms = [Room("a", 1, 0, 8), Room("b", 2, 0, 8)]
    assert place_elastic(required, extra, rooms) is not None
    assert len(place_elastic(required, extra, rooms) or {}) == 3
    assert place_elastic(required, extra, [Room("a", 1, 0, 8)]) is None
    # Kept first: the master stays on a, where it ran, though b packs tighter.
    kept = place_elastic(required, [], [Room("a", 2, 0, 8), Room("b", 2, 0, 8)], [("master", "b")])
    assert kept == {("master", 0): "b", ("worker", 1): "b"}
    kept = place_elastic(required, [], [Room("a", 2, 0, 8), Room("b", 2, 0, 8)], [("worker", "a")])
    assert kept is not None and kept[("worker", 1)] == "a"


@pytest.mark.parametrize(
    ("roles", "message"),
    [
        ({"master": {"package": "cpu-1", "instances": {"min": 1, "max": 2}}},
         "Only the workers may be elastic"),
        ({"master": {"package": "cpu-1", "instances": 1},
          "worker": {"package": "cpu-1", "instances": {"min": 3, "max": 3}}},
         "The maximum must be above the minimum"),
        ({"master": {"package": "cpu-1", "instances": 1},
          "worker": {"package": "cpu-1", "instances": {"min": 0, "max": 3}}},
         "The minimum must be at least 1."),
        ({"master": {"package": "cpu-1", "instances": 1},
          "worker": {"package": "cpu-1", "instances": {"min": 1, "max": 10_000}}},
         "At most"),
    ],
)  # fmt: skip
def test_a_range_that_is_no_elastic_role_is_refused_by_field(
    alice: User, roles: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValidationFailed) as refused:
        check_job_request({**job_request(), "roles": roles})
    field = next(iter(roles)) if "Only" in message else "worker"
    assert any(message in m for m in refused.value.errors[f"roles.{field}.instances"])


def test_node_wide_ends_are_told_from_a_trainers_own(two_small_nodes: list[Node]) -> None:
    node = two_small_nodes[0]
    assert restarts.node_wide(Replica(node=node, reason="node-1 lost: no heartbeat for 30 s"))
    assert restarts.node_wide(Replica(node=node, reason="node-1: its agent stopped unexpectedly"))
    assert not restarts.node_wide(Replica(node=node, reason="exited with code 1"))
    assert not restarts.node_wide(Replica(node=node, reason="node-10 lost"))


def test_the_form_asks_for_a_range_and_run_again_keeps_it(
    alice: User, two_small_nodes: list[Node], client: Any
) -> None:
    from jobs.forms import NewJobForm
    from jobs.services import rerun

    form = NewJobForm(user=alice, data={
        "name": "n", "image": "pytorch:2.13-cpu", "script": "digits-ddp", "package": "cpu-1",
        "instances": 2, "max_instances": 4,
    })  # fmt: skip
    assert form.is_valid(), form.errors
    roles = form.as_request()["roles"]
    assert roles["worker"] == {"package": "cpu-1", "instances": {"min": 1, "max": 3}}
    job = submit_job(alice, check_job_request(form.as_request()))
    body = rerun.request_of(job, alice)
    assert body["roles"]["worker"]["instances"] == {"min": 1, "max": 3}
    again = NewJobForm(user=alice)
    again.fill_from(body)
    assert (again.initial["instances"], again.initial["max_instances"]) == (2, 4)
    client.force_login(alice)
    shown = client.get(f"/api/v1/jobs/{job.pk}").json()
    assert shown["roles"]["worker"]["instances"] == {"min": 1, "max": 3}
    assert shown["instances"]["text"] == "2-4 (elastic)"
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert "worker cpu-1 × 1-3 (elastic)" in page
    # Exactly as many as the count: a fixed job, as before.
    fixed = NewJobForm(user=alice, data={**form.data, "max_instances": 2})
    assert fixed.is_valid(), fixed.errors
    assert fixed.as_request()["roles"]["worker"]["instances"] == 1
