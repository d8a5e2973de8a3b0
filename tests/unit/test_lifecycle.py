"""Job and replica state transitions, with Celery messages captured instead of sent."""

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User

from jobs import logstream
from jobs.models import Job, Node, Replica
from jobs.services import nodes as node_service
from jobs.services.lifecycle import outcomes, reports, transitions
from jobs.services.submission import check_job_request, submit_job
from jobs.services.views import presenters
from tests.conftest import make_stale
from tests.unit.helpers import SentTasks, job_request
from workers import contract

pytestmark = pytest.mark.usefixtures("catalog", "code_root", "redis_url")

Capture = Callable[..., Any]


@pytest.fixture
def launched(
    alice: User,
    nodes: list[Node],
    sent_tasks: SentTasks,
    django_capture_on_commit_callbacks: Capture,
) -> Job:
    with django_capture_on_commit_callbacks(execute=True):
        job = submit_job(alice, check_job_request(job_request(instances=3, package="cpu-2")))
    job.refresh_from_db()
    return job


def node_of(replica: Replica) -> str:
    assert replica.node is not None
    return replica.node.name


def report_started(job: Job, capture: Capture) -> None:
    for r in job.replicas.select_related("node"):
        with capture(execute=True):
            reports.replica_started(job.pk, r.role, r.index, node_of(r))


def report_exit(
    job: Job,
    tag: str,
    capture: Capture,
    outcome: str = "succeeded",
    code: int | None = 0,
    tail: list[str] | None = None,
) -> None:
    r = next(r for r in job.replicas.select_related("node") if r.tag == tag)
    with capture(execute=True):
        reports.replica_exited(
            job.pk,
            r.role,
            r.index,
            node_of(r),
            outcome,
            code,
            "" if code == 0 else f"exited with code {code}",
            tail or [],
        )


def test_it_places_and_dispatches_a_job_to_its_nodes(launched: Job, sent_tasks: SentTasks) -> None:
    assert launched.state == Job.State.QUEUED
    replicas = list(launched.replicas.select_related("node").order_by("id"))
    assert all(r.state == Replica.State.ASSIGNED for r in replicas)
    starts = sent_tasks.named(contract.TASK_START_REPLICA)
    assert [q for _, _, q in starts] == [f"node.{node_of(r)}" for r in replicas]
    specs = [kw["spec"] for _, kw, _ in starts]
    assert [s["node_rank"] for s in specs] == [0, 1, 2]
    assert [s["rank_offset"] for s in specs] == [0, 1, 2]
    assert {s["world_size"] for s in specs} == {3}
    assert [s["hosts_rendezvous"] for s in specs] == [True, False, False]
    assert {s["master_addr"] for s in specs} == {"127.0.0.1"}


def test_it_never_places_more_than_a_node_holds(launched: Job) -> None:
    per_node: dict[str, int] = {}
    for r in launched.replicas.select_related("node", "package"):
        assert r.package is not None  # a PyTorch job has no uncharged roles
        per_node[node_of(r)] = per_node.get(node_of(r), 0) + r.package.cpu
    assert all(cpu <= 8 for cpu in per_node.values())


def test_it_runs_when_every_replica_runs(
    launched: Job, django_capture_on_commit_callbacks: Capture
) -> None:
    first = launched.replicas.select_related("node").first()
    assert first is not None and first.node is not None
    reports.replica_started(launched.pk, first.role, first.index, first.node.name)
    launched.refresh_from_db()
    assert launched.state == Job.State.QUEUED
    report_started(launched, django_capture_on_commit_callbacks)
    launched.refresh_from_db()
    assert launched.state == Job.State.RUNNING and launched.started is not None


def test_it_succeeds_when_every_replica_exits_zero_and_ends_the_log(
    launched: Job, django_capture_on_commit_callbacks: Capture
) -> None:
    report_started(launched, django_capture_on_commit_callbacks)
    for tag in ("worker-1", "master", "worker-2"):
        report_exit(launched, tag, django_capture_on_commit_callbacks)
    launched.refresh_from_db()
    assert launched.state == Job.State.SUCCEEDED and launched.finished is not None
    assert launched.log_complete
    page = logstream.read_page(launched.pk, after=0, limit=10)
    assert page.complete


def test_it_fails_the_job_with_the_exit_code_and_stderr_and_stops_the_rest(
    launched: Job, sent_tasks: SentTasks, django_capture_on_commit_callbacks: Capture
) -> None:
    report_started(launched, django_capture_on_commit_callbacks)
    report_exit(
        launched,
        "worker-1",
        django_capture_on_commit_callbacks,
        "failed",
        3,
        ["Traceback (most recent call last):", "RuntimeError: boom"],
    )
    launched.refresh_from_db()
    assert launched.state == Job.State.FAILED
    assert launched.reason.startswith("worker-1 on node-")
    assert "exited with code 3" in launched.reason
    assert launched.reason.endswith("RuntimeError: boom")
    stops = sent_tasks.named(contract.TASK_STOP_JOB)
    assert {q for _, _, q in stops} == {
        f"node.{node_of(r)}"
        for r in launched.replicas.select_related("node")
        if r.tag != "worker-1"
    }
    assert not launched.log_complete  # the others still have to report
    report_exit(launched, "master", django_capture_on_commit_callbacks, "stopped", -15)
    report_exit(launched, "worker-2", django_capture_on_commit_callbacks, "stopped", -15)
    launched.refresh_from_db()
    assert launched.state == Job.State.FAILED and launched.log_complete


def test_it_ignores_a_repeated_exit_report(
    launched: Job, django_capture_on_commit_callbacks: Capture
) -> None:
    report_started(launched, django_capture_on_commit_callbacks)
    report_exit(launched, "master", django_capture_on_commit_callbacks)
    report_exit(launched, "master", django_capture_on_commit_callbacks, "failed", 1)
    master = launched.replicas.get(role="master")
    assert master.state == Replica.State.SUCCEEDED and master.exit_code == 0
    launched.refresh_from_db()
    assert launched.state == Job.State.RUNNING


def test_it_cancels_and_stops_every_node(
    launched: Job,
    alice: User,
    sent_tasks: SentTasks,
    django_capture_on_commit_callbacks: Capture,
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        outcomes.cancel(launched.pk, alice)
    launched.refresh_from_db()
    assert launched.state == Job.State.CANCELLED
    assert launched.reason == "cancelled by alice"
    assert sent_tasks.named(contract.TASK_STOP_JOB)
    with pytest.raises(transitions.InvalidTransition, match="already ended"):
        outcomes.cancel(launched.pk, alice)


def test_it_waits_when_no_node_has_room_and_starts_when_room_frees(
    alice: User,
    nodes: list[Node],
    sent_tasks: SentTasks,
    django_capture_on_commit_callbacks: Capture,
) -> None:
    make_stale(nodes[1])
    with django_capture_on_commit_callbacks(execute=True):
        first = submit_job(alice, check_job_request(job_request(instances=4, package="cpu-2")))
        second = submit_job(alice, check_job_request(job_request(instances=1, package="cpu-2")))
    second.refresh_from_db()
    assert second.state == Job.State.QUEUED
    assert second.reason == (
        "waiting: needs a node with 2 CPU cores and 4 GB free; "
        f"node-1 frees 8 CPU cores when job {first.pk} ends"
    )
    assert presenters.queue_position(second) == 1
    assert not second.replicas.filter(state=Replica.State.ASSIGNED).exists()
    with django_capture_on_commit_callbacks(execute=True):
        outcomes.cancel(first.pk, alice)
    for r in first.replicas.select_related("node"):
        with django_capture_on_commit_callbacks(execute=True):
            reports.replica_exited(
                first.pk, r.role, r.index, node_of(r), "stopped", -15, "cancelled", []
            )
    second.refresh_from_db()
    assert second.replicas.get().state == Replica.State.ASSIGNED


def test_it_says_when_no_node_agent_is_registered(
    alice: User, sent_tasks: SentTasks, django_capture_on_commit_callbacks: Capture
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        job = submit_job(alice, check_job_request(job_request(instances=2)))
    job.refresh_from_db()
    assert job.reason == "waiting for a node agent to register"
    with django_capture_on_commit_callbacks(execute=True):
        node_service.node_heartbeat(
            {"node": "gpu-7", "address": "10.0.0.7", "cpus": 16, "memory_gb": 64, "gpus": 0,
             "protocol": contract.PROTOCOL_VERSION}
        )  # fmt: skip
    job.refresh_from_db()
    assert job.reason == "starting on gpu-7"
    assert sent_tasks.named(contract.TASK_START_REPLICA)[0][2] == "node.gpu-7"


class SentEvents:
    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def send(self, group: str, message: dict[str, Any]) -> None:
        self.sent.append((group, message))

    def send_many(self, events: list[tuple[str, dict[str, Any]]]) -> None:
        self.sent.extend(events)


def test_a_transaction_tells_clients_once_with_the_state_after_every_write(
    alice: User,
    nodes: list[Node],
    sent_tasks: SentTasks,
    django_capture_on_commit_callbacks: Capture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from jobs.services.lifecycle import events

    for node in nodes:
        make_stale(node)  # the job waits with every replica unplaced
    with django_capture_on_commit_callbacks(execute=True):
        waiting = submit_job(alice, check_job_request(job_request(instances=3, package="cpu-2")))
    recorder = SentEvents()
    monkeypatch.setattr(events, "_get_sender", lambda: recorder)
    # Cancelling writes the job's state, then stops its unplaced replicas.
    with django_capture_on_commit_callbacks(execute=True):
        outcomes.cancel(waiting.pk, alice)
    assert len(recorder.sent) == 1
    group, message = recorder.sent[0]
    assert group == f"job.{waiting.pk}"
    job = message["payload"]["job"]
    assert job["state"] == "cancelled"
    assert {r["state"] for r in job["replicas"]} == {"stopped"}
