"""The state machine's guards and reconciliation's repairs, with heartbeats written into the
node rows and Celery messages captured instead of sent."""

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from jobs.models import Job, Node, Package, Replica
from jobs.services import nodes as node_service
from jobs.services import reconcile
from jobs.services.lifecycle import outcomes, reports, transitions
from jobs.services.scheduler import scheduling
from jobs.services.submission import check_job_request, submit_job
from tests.unit.helpers import SentTasks, job_request
from workers import contract

pytestmark = pytest.mark.usefixtures("catalog", "code_root", "redis_url", "cpu_3")

Capture = Callable[..., Any]
GRACE = 30  # TRAINYARD_ACK_GRACE_SECONDS's default
LOST = 45  # TRAINYARD_NODE_LOST_SECONDS's default


@pytest.fixture
def cpu_3(catalog: None) -> Package:
    """Three instances of it need both 8-core nodes."""
    return Package.objects.create(name="cpu-3", cpu=3, memory_gb=4)


@pytest.fixture
def launched(
    alice: User,
    nodes: list[Node],
    sent_tasks: SentTasks,
    django_capture_on_commit_callbacks: Capture,
) -> Job:
    """A 3-instance job placed on both nodes, every replica started by agent incarnation 'a'."""
    with django_capture_on_commit_callbacks(execute=True):
        job = submit_job(alice, check_job_request(job_request(instances=3, package="cpu-3")))
    for r in job.replicas.select_related("node"):
        with django_capture_on_commit_callbacks(execute=True):
            reports.replica_started(job.pk, r.role, r.index, node_name(r), incarnation="a")
    job.refresh_from_db()
    assert job.state == Job.State.RUNNING
    assert {node_name(r) for r in job.replicas.select_related("node")} == {"node-1", "node-2"}
    for node in nodes:
        beat(node, job, at=timezone.now())
    return job


def entries(job: Job, node: Node, state: str = "running") -> list[dict[str, Any]]:
    return [
        {"job_id": job.pk, "role": r.role, "index": r.index, "state": state, "pids": [1]}
        for r in job.replicas.filter(node=node)
    ]


def beat(
    node: Node,
    job: Job | None = None,
    at: datetime | None = None,
    running: list[dict[str, Any]] | None = None,
    finished: list[dict[str, Any]] | None = None,
    incarnation: str = "a",
) -> None:
    """Write what a heartbeat would: by default the node runs its replicas of `job`."""
    node.refresh_from_db()
    node.running = running if running is not None else (entries(job, node) if job else [])
    node.finished = finished or []
    node.last_heartbeat = at or timezone.now()
    node.incarnation = incarnation
    node.save()


def node_name(replica: Replica) -> str:
    assert replica.node is not None
    return replica.node.name


def sent_at(replica: Replica) -> datetime:
    assert replica.start_sent is not None
    return replica.start_sent


def later(seconds: float) -> datetime:
    return timezone.now() + timedelta(seconds=seconds)


def run_pass(capture: Capture, now: datetime, **kwargs: Any) -> reconcile.PassReport:
    with capture(execute=True):
        return reconcile.run_pass(now=now, **kwargs)


def held_on(node: Node) -> int:
    return sum(h.cpu for h in scheduling.holdings([node]))


# --- the state machine ----------------------------------------------------------------------


def test_it_refuses_a_transition_the_table_does_not_allow(launched: Job) -> None:
    assert not transitions.move_job(launched, Job.State.QUEUED)
    with pytest.raises(transitions.InvalidTransition, match="cannot go from running to queued"):
        transitions.move_job(launched, Job.State.QUEUED, strict=True)
    master = launched.replicas.get(role="master")
    assert transitions.move_replica(master, Replica.State.SUCCEEDED, exit_code=0)
    # A final state is final: a late report cannot turn success into failure.
    assert not transitions.move_replica(master, Replica.State.FAILED, exit_code=1)
    master.refresh_from_db()
    assert master.state == Replica.State.SUCCEEDED and master.exit_code == 0


def test_every_declared_transition_leaves_a_non_final_state() -> None:
    for table, final in (
        (Job.TRANSITIONS, Job.TERMINAL_STATES),
        (Replica.TRANSITIONS, Replica.FINAL_STATES),
    ):
        states = Job.State if table is Job.TRANSITIONS else Replica.State
        assert set(table) == {str(s) for s in states}
        for state in final:
            assert table[state] == frozenset(), f"{state} is final"


def test_a_second_end_of_the_same_replica_changes_nothing(launched: Job) -> None:
    worker = launched.replicas.get(role="worker", index=1)
    assert outcomes.replica_ended(launched, worker, Replica.State.FAILED, "exited with code 1")
    reason = Job.objects.get(pk=launched.pk).reason
    again = Replica.objects.get(pk=worker.pk)
    assert not outcomes.replica_ended(launched, again, Replica.State.FAILED, "other")
    assert Job.objects.get(pk=launched.pk).reason == reason


# --- lost nodes -----------------------------------------------------------------------------


def test_a_node_silent_past_the_grace_fails_its_replicas_frees_capacity_and_lets_jobs_in(
    launched: Job,
    nodes: list[Node],
    alice: User,
    sent_tasks: SentTasks,
    django_capture_on_commit_callbacks: Capture,
) -> None:
    node1, node2 = nodes
    with django_capture_on_commit_callbacks(execute=True):
        waiting = submit_job(alice, check_job_request(job_request(instances=2, package="cpu-3")))
    assert not waiting.replicas.filter(state=Replica.State.ASSIGNED).exists()
    # Real time, not a simulated clock: placement judges nodes by the real one.
    now = timezone.now()
    beat(node1, launched, at=now - timedelta(seconds=LOST + 2))
    beat(node2, launched, at=now)
    report = run_pass(django_capture_on_commit_callbacks, now)
    assert report.lost_nodes == ["node-1"]
    launched.refresh_from_db()
    assert launched.state == Job.State.FAILED
    on_node1 = sorted(r.tag for r in launched.replicas.filter(node=node1))
    assert (
        launched.reason
        == f"node-1 lost: no heartbeat for {LOST + 2} s ({', '.join(on_node1)} ran there)"
    )
    assert held_on(node1) == 0
    # The instances on node-2 are told to stop, naming them.
    stops = [kw for _, kw, q in sent_tasks.named(contract.TASK_STOP_JOB) if q == "node.node-2"]
    assert stops and stops[-1]["job_id"] == launched.pk
    assert {(x["role"], x["index"]) for x in stops[-1]["replicas"]} == {
        (r.role, r.index) for r in launched.replicas.filter(node=node2)
    }
    # node-1 is gone and node-2 is held until its replicas have stopped; then the waiting
    # job starts there.
    assert not waiting.replicas.filter(state=Replica.State.ASSIGNED).exists()
    for r in launched.replicas.filter(node=node2):
        with django_capture_on_commit_callbacks(execute=True):
            reports.replica_exited(launched.pk, r.role, r.index, "node-2", "stopped", -15, "", [])
    waiting.refresh_from_db()
    assert waiting.replicas.filter(state=Replica.State.ASSIGNED).count() == 2
    launched.refresh_from_db()
    assert launched.log_complete


def test_a_late_node_is_not_lost_before_the_grace(
    launched: Job, nodes: list[Node], django_capture_on_commit_callbacks: Capture
) -> None:
    beat(nodes[0], launched, at=timezone.now())
    report = run_pass(django_capture_on_commit_callbacks, later(LOST - 5))
    assert report.lost_nodes == [] and report.ended == 0
    assert Job.objects.get(pk=launched.pk).state == Job.State.RUNNING


def test_silence_while_the_console_could_not_listen_proves_nothing(
    launched: Job, nodes: list[Node], django_capture_on_commit_callbacks: Capture
) -> None:
    """After the console worker or Redis was down, heartbeats are old but nodes are fine."""
    old = timezone.now() - timedelta(minutes=10)
    for node in nodes:
        beat(node, launched, at=old)
    report = run_pass(django_capture_on_commit_callbacks, timezone.now(), listening_since=later(-5))
    assert report.lost_nodes == []
    assert Job.objects.get(pk=launched.pk).state == Job.State.RUNNING


# --- what agents run, against what should run -----------------------------------------------


def test_an_unacknowledged_start_is_sent_again_then_fails_as_never_started(
    alice: User,
    nodes: list[Node],
    sent_tasks: SentTasks,
    django_capture_on_commit_callbacks: Capture,
    settings: Any,
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        job = submit_job(alice, check_job_request(job_request(instances=1)))
    replica = job.replicas.select_related("node").get()
    assert replica.state == Replica.State.ASSIGNED and replica.starts_sent == 1
    node = replica.node
    assert node is not None
    starts = len(sent_tasks.named(contract.TASK_START_REPLICA))
    # A heartbeat that does not list it, but came too soon after the start to count.
    beat(node, running=[], at=sent_at(replica) + timedelta(seconds=GRACE - 1))
    assert run_pass(django_capture_on_commit_callbacks, later(GRACE)).starts_resent == 0
    for attempt in (2, 3):
        replica.refresh_from_db()
        heard = sent_at(replica) + timedelta(seconds=GRACE + 1)
        beat(node, running=[], at=heard)
        report = run_pass(django_capture_on_commit_callbacks, heard + timedelta(seconds=1))
        assert report.starts_resent == 1
        replica.refresh_from_db()
        assert replica.starts_sent == attempt
        sent = sent_tasks.named(contract.TASK_START_REPLICA)
        assert len(sent) == starts + attempt - 1
        assert sent[-1][1]["spec"]["job_id"] == job.pk and sent[-1][2] == f"node.{node.name}"
    heard = sent_at(replica) + timedelta(seconds=GRACE + 1)
    beat(node, running=[], at=heard)
    run_pass(django_capture_on_commit_callbacks, heard + timedelta(seconds=1))
    job.refresh_from_db()
    assert job.state == Job.State.FAILED
    assert job.reason == (
        f"master on {node.name}: {node.name}'s agent never started it "
        f"(3 start messages went unanswered)"
    )
    assert held_on(node) == 0


def test_an_acknowledged_start_is_left_alone(
    launched: Job, nodes: list[Node], django_capture_on_commit_callbacks: Capture
) -> None:
    for node in nodes:
        beat(node, launched, at=later(GRACE * 3))
    report = run_pass(django_capture_on_commit_callbacks, later(GRACE * 3 + 1))
    assert report.repaired == 0
    assert Job.objects.get(pk=launched.pk).state == Job.State.RUNNING


def test_a_running_replica_its_agent_forgot_fails_the_job(
    launched: Job, nodes: list[Node], django_capture_on_commit_callbacks: Capture
) -> None:
    node1 = nodes[0]
    beat(node1, running=[], at=later(GRACE + 1))
    beat(nodes[1], launched, at=later(GRACE + 1))
    run_pass(django_capture_on_commit_callbacks, later(GRACE + 2))
    launched.refresh_from_db()
    assert launched.state == Job.State.FAILED
    first = launched.replicas.filter(node=node1).order_by("id").first()
    assert first is not None
    assert launched.reason == f"{first.tag} on node-1: node-1's agent does not run it any more"


def test_a_restarted_agent_fails_what_the_old_one_ran_and_the_reason_is_the_first_cause(
    launched: Job, nodes: list[Node], django_capture_on_commit_callbacks: Capture
) -> None:
    """node-1's agent dies; its trainers' peers on node-2 fail a moment later and are reported
    first. When node-1's agent comes back, the job's reason becomes node-1's."""
    node1, node2 = nodes
    died = timezone.now() - timedelta(seconds=3)
    beat(node1, launched, at=died)
    peer = launched.replicas.filter(node=node2).first()
    assert peer is not None
    with django_capture_on_commit_callbacks(execute=True):
        reports.replica_exited(
            launched.pk, peer.role, peer.index, "node-2", "failed", 1, "exited with code 1",
            ["RuntimeError: Connection closed by peer"], ended_at=died.timestamp() + 1,
        )  # fmt: skip
    launched.refresh_from_db()
    assert launched.state == Job.State.FAILED
    assert launched.reason.startswith(f"{peer.tag} on node-2: exited with code 1")
    with django_capture_on_commit_callbacks(execute=True):
        node_service.node_heartbeat(
            {"node": "node-1", "address": "127.0.0.1", "cpus": 8, "memory_gb": 32, "gpus": 0,
             "incarnation": "b", "running": [], "finished": [],
             "protocol": contract.PROTOCOL_VERSION}
        )  # fmt: skip
    launched.refresh_from_db()
    assert launched.reason.startswith("node-1: its agent stopped unexpectedly (last heard at ")
    assert "ran there)" in launched.reason
    assert held_on(node1) == 0
    lost = launched.replicas.filter(node=node1)
    assert {r.state for r in lost} == {Replica.State.FAILED}
    peer.refresh_from_db()
    assert peer.reason.startswith("exited with code 1"), "the collateral failure keeps its own"


def test_an_end_listed_in_a_heartbeat_is_applied_when_its_report_was_lost(
    launched: Job, nodes: list[Node], django_capture_on_commit_callbacks: Capture
) -> None:
    for node in nodes:
        done = [
            {"job_id": launched.pk, "role": r.role, "index": r.index, "state": "succeeded",
             "exit_code": 0, "reason": "", "ended_at": timezone.now().timestamp()}
            for r in launched.replicas.filter(node=node)
        ]  # fmt: skip
        beat(node, running=[], finished=done, at=later(1))
    report = run_pass(django_capture_on_commit_callbacks, later(2))
    assert report.outcomes_applied == 3
    launched.refresh_from_db()
    assert launched.state == Job.State.SUCCEEDED and launched.log_complete


def test_a_stop_that_went_unanswered_is_sent_again_and_a_forgotten_replica_is_released(
    launched: Job,
    nodes: list[Node],
    alice: User,
    sent_tasks: SentTasks,
    django_capture_on_commit_callbacks: Capture,
) -> None:
    node1, node2 = nodes
    with django_capture_on_commit_callbacks(execute=True):
        outcomes.cancel(launched.pk, alice)
    stops = len(sent_tasks.named(contract.TASK_STOP_JOB))
    # node-1 still runs its replicas well after the stop; node-2's agent has no record of its.
    beat(node1, launched, at=later(GRACE + 1))
    beat(node2, running=[], at=later(GRACE + 1))
    report = run_pass(django_capture_on_commit_callbacks, later(GRACE + 2))
    again = sent_tasks.named(contract.TASK_STOP_JOB)[stops:]
    assert {q for _, _, q in again} == {"node.node-1"}
    assert report.stops_resent == launched.replicas.filter(node=node1).count()
    released = launched.replicas.filter(node=node2)
    assert {r.state for r in released} == {Replica.State.STOPPED}
    assert held_on(node2) == 0
    launched.refresh_from_db()
    assert launched.state == Job.State.CANCELLED and launched.reason == "cancelled by alice"


def test_a_stop_for_a_replica_the_agent_does_not_know_releases_it(
    launched: Job, alice: User, django_capture_on_commit_callbacks: Capture
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        outcomes.cancel(launched.pk, alice)
    for r in launched.replicas.select_related("node"):
        with django_capture_on_commit_callbacks(execute=True):
            reports.replica_exited(
                launched.pk, r.role, r.index, node_name(r), "unknown", None,
                f"not running on {node_name(r)}", [],
            )  # fmt: skip
    launched.refresh_from_db()
    assert {r.state for r in launched.replicas.all()} == {Replica.State.STOPPED}
    assert launched.log_complete and launched.reason == "cancelled by alice"


def test_a_process_that_should_not_run_is_told_to_stop(
    launched: Job,
    nodes: list[Node],
    sent_tasks: SentTasks,
    django_capture_on_commit_callbacks: Capture,
) -> None:
    stray = {"job_id": 999, "role": "worker", "index": 4, "state": "running", "pids": [1]}
    beat(nodes[0], running=[*entries(launched, nodes[0]), stray], at=later(1))
    report = run_pass(django_capture_on_commit_callbacks, later(2))
    assert report.strays_stopped == 1
    _, kwargs, queue = sent_tasks.named(contract.TASK_STOP_JOB)[-1]
    assert queue == "node.node-1" and kwargs["job_id"] == 999
    assert kwargs["replicas"] == [{"role": "worker", "index": 4, "attempt": 0}]
    assert kwargs["up_to_attempt"] == 0


def test_a_second_pass_finds_nothing_left_to_repair(
    launched: Job, nodes: list[Node], django_capture_on_commit_callbacks: Capture
) -> None:
    beat(nodes[0], launched, at=timezone.now())
    now = later(LOST + 1)
    beat(nodes[1], launched, at=now)
    first = run_pass(django_capture_on_commit_callbacks, now)
    second = run_pass(django_capture_on_commit_callbacks, now)
    assert first.ended > 0
    assert second.ended == 0 and second.lost_nodes == []


# --- a late heartbeat must not stop a job: the CI failure of the parameter-server test -------


def test_a_heartbeat_older_than_an_exit_report_stops_nothing(
    launched: Job,
    nodes: list[Node],
    sent_tasks: SentTasks,
    django_capture_on_commit_callbacks: Capture,
) -> None:
    """A worker ends (its exit report is in) while a heartbeat sent before it, still listing it
    as running, is handled after: that replica is no stray, and the job's others run on."""
    worker = launched.replicas.select_related("node").get(role="worker", index=2)
    with django_capture_on_commit_callbacks(execute=True):
        reports.replica_exited(
            launched.pk, worker.role, worker.index, node_name(worker), "succeeded", 0, "", []
        )
    assert worker.node is not None
    beat(worker.node, launched, at=later(1))  # lists the worker as running still
    report = run_pass(django_capture_on_commit_callbacks, later(2))
    assert report.strays_stopped == 0
    assert sent_tasks.named(contract.TASK_STOP_JOB) == []
    launched.refresh_from_db()
    assert launched.state == Job.State.RUNNING


def test_a_stray_stop_names_only_the_stray(
    launched: Job,
    nodes: list[Node],
    sent_tasks: SentTasks,
    django_capture_on_commit_callbacks: Capture,
) -> None:
    stray = {"job_id": launched.pk, "attempt": 7, "role": "worker", "index": 9, "state": "running"}
    beat(nodes[0], running=[*entries(launched, nodes[0]), stray], at=later(1))
    assert run_pass(django_capture_on_commit_callbacks, later(2)).strays_stopped == 1
    _, kwargs, _ = sent_tasks.named(contract.TASK_STOP_JOB)[-1]
    assert kwargs["only_listed"] is True and kwargs["up_to_attempt"] == 7
    assert kwargs["replicas"] == [{"role": "worker", "index": 9, "attempt": 7}]


def test_a_heartbeat_overtaken_by_a_newer_one_is_ignored(
    nodes: list[Node], sent_tasks: SentTasks
) -> None:
    base = {"node": "node-1", "address": "10.0.0.1", "cpus": 8, "gpus": 0, "memory_gb": 32}
    node_service.node_heartbeat({**base, "incarnation": "a", "sent": 200.0, "running": []})
    late = [{"job_id": 1, "role": "master", "index": 0, "state": "running"}]
    node_service.node_heartbeat({**base, "incarnation": "a", "sent": 100.0, "running": late})
    assert Node.objects.get(name="node-1").running == []
    # A restarted agent's clock starts its own story: its first heartbeat always counts.
    node_service.node_heartbeat({**base, "incarnation": "b", "sent": 50.0, "running": late})
    assert Node.objects.get(name="node-1").running == late


def test_a_restarted_agent_that_runs_the_replicas_on_keeps_the_job_running(
    launched: Job, nodes: list[Node], django_capture_on_commit_callbacks: Capture
) -> None:
    """node-1's agent restarted and took its replicas over from their keepers: its first
    heartbeat lists them, so they run on, now under the new incarnation."""
    node1, _ = nodes
    with django_capture_on_commit_callbacks(execute=True):
        node_service.node_heartbeat(
            {"node": "node-1", "address": "127.0.0.1", "cpus": 8, "memory_gb": 32, "gpus": 0,
             "incarnation": "b", "running": entries(launched, node1), "finished": []}
        )  # fmt: skip
    report = reconcile.run_pass()
    launched.refresh_from_db()
    assert launched.state == Job.State.RUNNING
    there = launched.replicas.filter(node=node1)
    assert {(r.state, r.incarnation) for r in there} == {(Replica.State.RUNNING, "b")}
    assert report.ended == 0
