"""Queue order, backfill, drained and lost nodes, and the reasons a waiting job is given."""

import gc
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from jobs.models import Job, JobAttempt, Node, Quota, Replica
from jobs.services import nodes as node_service
from jobs.services.lifecycle import reports, schedule_requests
from jobs.services.placement import Demand, Holding, Room
from jobs.services.scheduler import scheduling, waitlist
from jobs.services.scheduler.why_waiting import NodeView, shortfall
from jobs.services.submission import check_job_request, submit_job
from jobs.services.views import presenters
from tests.conftest import make_stale
from tests.unit.helpers import SentTasks, job_request
from workers import contract

pytestmark = pytest.mark.usefixtures("catalog", "code_root", "redis_url")

Capture = Callable[..., Any]


@pytest.fixture
def submit(
    alice: User, sent_tasks: SentTasks, django_capture_on_commit_callbacks: Capture
) -> Callable[..., Job]:
    def go(instances: int, package: str = "cpu-2") -> Job:
        with django_capture_on_commit_callbacks(execute=True):
            job = submit_job(alice, check_job_request(job_request(instances, package)))
        job.refresh_from_db()
        return job

    return go


# The end of a strict queue's reason, with a grace of 300 s.
STRICT = "which has waited for room longer than 5 min: nothing passes it until it starts"


def placed(job: Job) -> bool:
    return not job.replicas.filter(state=Replica.State.PENDING).exists()


def finish(job: Job, capture: Capture) -> None:
    for r in job.replicas.select_related("node"):
        assert r.node is not None
        with capture(execute=True):
            reports.replica_exited(job.pk, r.role, r.index, r.node.name, "succeeded", 0, "", [])


def test_a_smaller_job_behind_a_blocked_one_starts_now(
    nodes: list[Node], submit: Callable[..., Job]
) -> None:
    running = submit(6)  # 12 of the 16 cores
    big = submit(4)  # 8 more: must wait
    small = submit(2)  # 4: fits in what is left
    assert placed(running) and not placed(big) and placed(small)
    assert presenters.queue_position(big) == 1
    assert presenters.queue_position(small) is None


def test_the_queue_turns_strict_when_the_first_job_waited_too_long(
    nodes: list[Node], submit: Callable[..., Job], settings: Any
) -> None:
    submit(6)
    big = submit(4)
    JobAttempt.objects.filter(job=big).update(queued=timezone.now() - timedelta(minutes=10))
    settings.TRAINYARD_BACKFILL_GRACE_SECONDS = 300
    small = submit(2)
    small.refresh_from_db()
    assert not placed(small)
    assert small.reason == f"waiting behind job {big.pk}, first in the queue, {STRICT}"
    assert presenters.queue_position(small) == 2


def test_the_grace_counts_from_when_the_head_joined_the_queue_not_its_submission(
    nodes: list[Node], submit: Callable[..., Job], settings: Any
) -> None:
    """A regression (issue 43): the grace clock was the job's submission time, so a head
    submitted long ago and back in the queue just now (restarted, preempted) made the queue
    strict at once."""
    submit(6)
    big = submit(4)
    Job.objects.filter(pk=big.pk).update(created=timezone.now() - timedelta(hours=2))
    settings.TRAINYARD_BACKFILL_GRACE_SECONDS = 300
    small = submit(2)
    assert not placed(big) and placed(small), small.reason


def test_freed_room_goes_to_the_first_job_in_the_queue(
    nodes: list[Node],
    submit: Callable[..., Job],
    django_capture_on_commit_callbacks: Capture,
) -> None:
    first = submit(8)  # all 16 cores
    second, third = submit(2), submit(1)
    assert not placed(second) and not placed(third)
    finish(first, django_capture_on_commit_callbacks)
    second.refresh_from_db()
    third.refresh_from_db()
    assert placed(second) and placed(third)


def test_a_drained_node_gets_no_new_work(nodes: list[Node], submit: Callable[..., Job]) -> None:
    Node.objects.filter(name="node-1").update(state=Node.State.DRAINING)
    job = submit(4)
    assert {r.node.name for r in job.replicas.select_related("node") if r.node} == {"node-2"}
    waiting = submit(1)
    assert not placed(waiting)


def test_a_lost_node_gets_no_new_work(nodes: list[Node], submit: Callable[..., Job]) -> None:
    make_stale(nodes[0])
    assert nodes[0].status == "lost"
    job = submit(3)
    assert {r.node.name for r in job.replicas.select_related("node") if r.node} == {"node-2"}


def test_a_returning_node_lets_waiting_jobs_in(
    nodes: list[Node],
    submit: Callable[..., Job],
    sent_tasks: SentTasks,
    django_capture_on_commit_callbacks: Capture,
) -> None:
    for node in nodes:
        make_stale(node)
    job = submit(2)
    assert job.reason == "waiting: no node is ready (node-1 lost, node-2 lost)"
    with django_capture_on_commit_callbacks(execute=True):
        node_service.node_heartbeat(
            {"node": "node-2", "address": "127.0.0.1", "cpus": 8, "memory_gb": 32, "gpus": 0,
             "protocol": contract.PROTOCOL_VERSION}
        )  # fmt: skip
    job.refresh_from_db()
    assert placed(job) and job.reason == "starting on node-2"
    assert sent_tasks.named(contract.TASK_START_REPLICA)[-1][2] == "node.node-2"


def test_heartbeats_report_capacity_unless_an_admin_set_it(nodes: list[Node]) -> None:
    beat = {
        "node": "node-1",
        "address": "10.0.0.1",
        "cpus": 64,
        "memory_gb": 256,
        "gpus": 8,
        "gpu_model": "A100",
        "running": [{"job_id": 3, "role": "master", "index": 0}],
    }
    node_service.node_heartbeat(beat)
    node = Node.objects.get(name="node-1")
    assert (node.cpu, node.gpus, node.memory_gb, node.gpu_model) == (64, 8, 256, "A100")
    assert node.running == beat["running"] and node.address == "10.0.0.1"
    Node.objects.filter(pk=node.pk).update(cpu=16, capacity_set_by_admin=True)
    node_service.node_heartbeat(dict(beat, cpus=128))
    node.refresh_from_db()
    assert (node.cpu, node.reported_cpu) == (16, 128)


def every_job(job_ids: list[int]) -> set[int]:
    """A reader who may see every job (staff)."""
    return set(job_ids)


def test_it_explains_which_node_frees_what_when_which_job_ends() -> None:
    nodes = [NodeView("node-1", 16, 0, 64, "ready"), NodeView("node-2", 24, 2, 240, "ready")]
    rooms = [Room("node-1", 16, 0, 64), Room("node-2", 12, 0, 120)]
    held = [Holding(41, "node-2", 12, 2, 120)]
    reason = shortfall([Demand(("worker", 1), 12, 2, 120)], rooms, nodes, held).in_words(every_job)
    assert reason == (
        "waiting: needs a node with 2 GPUs, 12 CPU cores and 120 GB free; "
        "node-2 frees 2 GPUs when job 41 ends"
    )


def test_it_says_all_a_blocker_frees_of_what_the_job_lacks_not_only_the_lack() -> None:
    """One core short on a node where one job holds four: its end frees four cores there (the
    page read "frees 1 CPU core", as if that were all the blocker held)."""
    nodes = [NodeView("node-1", 8, 0, 32, "ready")]
    rooms = [Room("node-1", 1, 0, 16)]
    held = [Holding(7, "node-1", 4, 0, 16), Holding(8, "node-1", 3, 0, 0)]
    reason = shortfall([Demand(("master", 0), 2, 0, 4)], rooms, nodes, held).in_words(every_job)
    assert reason.endswith("node-1 frees 4 CPU cores when job 7 ends"), reason


def test_it_names_every_job_that_must_end() -> None:
    nodes = [NodeView("node-1", 8, 0, 32, "ready")]
    rooms = [Room("node-1", 0, 0, 8)]
    held = [Holding(7, "node-1", 4, 0, 12), Holding(9, "node-1", 4, 0, 12)]
    reason = shortfall([Demand(("master", 0), 8, 0, 8)], rooms, nodes, held).in_words(every_job)
    assert reason.endswith("node-1 frees 8 CPU cores when job 7 and job 9 end")


def test_it_counts_but_never_names_jobs_the_owner_may_not_see() -> None:
    nodes = [NodeView("node-1", 8, 0, 32, "ready")]
    rooms = [Room("node-1", 0, 0, 8)]
    held = [Holding(7, "node-1", 4, 0, 12), Holding(9, "node-1", 2, 0, 6)]
    held += [Holding(11, "node-1", 2, 0, 6)]
    demand = [Demand(("master", 0), 8, 0, 8)]
    reason = shortfall(demand, rooms, nodes, held).in_words(lambda ids: {9})
    assert reason.endswith("node-1 frees 8 CPU cores when job 9 and 2 jobs of other users end")
    reason = shortfall(demand, rooms, nodes, held).in_words(lambda ids: set())
    assert reason.endswith("frees 8 CPU cores when 3 jobs of other users end")
    reason = shortfall([Demand(("master", 0), 6, 0, 8)], rooms, nodes, held).in_words(
        lambda ids: {9}
    )
    assert reason.endswith("frees 6 CPU cores when job 9 and a job of another user end")


def test_a_waiting_jobs_reason_names_only_its_owners_jobs(
    nodes: list[Node],
    submit: Callable[..., Job],
    bob: User,
    charlie_admin: User,
    sent_tasks: SentTasks,
    django_capture_on_commit_callbacks: Capture,
) -> None:
    alices = submit(8)  # all 16 cores
    mine = submit(1)
    with django_capture_on_commit_callbacks(execute=True):
        bobs = submit_job(bob, check_job_request(job_request(1, "cpu-2")))
        staffs = submit_job(charlie_admin, check_job_request(job_request(1, "cpu-2")))
    for job in (mine, bobs, staffs):
        job.refresh_from_db()
    # node-1 holds four of the job's instances: its end frees 8 cores there, not just 2.
    need = "waiting: needs a node with 2 CPU cores and 4 GB free; node-1 frees 8 CPU cores"
    assert mine.reason == f"{need} when job {alices.pk} ends"
    assert bobs.reason == f"{need} when a job of another user ends"
    assert staffs.reason == f"{need} when job {alices.pk} ends"  # staff see every job


def test_the_job_a_strict_queue_waits_behind_is_named_to_its_owner_only(
    nodes: list[Node],
    submit: Callable[..., Job],
    bob: User,
    settings: Any,
    sent_tasks: SentTasks,
    django_capture_on_commit_callbacks: Capture,
) -> None:
    submit(6)
    big = submit(4)
    JobAttempt.objects.filter(job=big).update(queued=timezone.now() - timedelta(minutes=10))
    settings.TRAINYARD_BACKFILL_GRACE_SECONDS = 300
    with django_capture_on_commit_callbacks(execute=True):
        bobs = submit_job(bob, check_job_request(job_request(2, "cpu-2")))
    bobs.refresh_from_db()
    assert bobs.reason == f"waiting behind a job of another user, first in the queue, {STRICT}"
    assert str(big.pk) not in bobs.reason


def test_it_says_when_no_node_agent_has_registered() -> None:
    assert shortfall([Demand(("master", 0), 1, 0, 1)], [], [], []).in_words(every_job) == (
        "waiting for a node agent to register"
    )


def test_a_pass_that_changes_no_reason_writes_no_job_row(
    nodes: list[Node], submit: Callable[..., Job]
) -> None:
    submit(8)  # all 16 cores
    waiting = [submit(1), submit(2)]
    reasons = [job.reason for job in waiting]
    assert all(r.startswith("waiting: needs") for r in reasons)
    with CaptureQueriesContext(connection) as queries:
        assert scheduling.schedule() == []
    writes = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("UPDATE")]
    assert writes == []
    for job in waiting:
        job.refresh_from_db()
    assert [job.reason for job in waiting] == reasons


def test_requests_made_before_a_pass_starts_send_one_schedule_task(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sent: list[str] = []
    monkeypatch.setattr(schedule_requests.app, "send_task", lambda name, **_: sent.append(name))
    for _ in range(3):  # say, three nodes coming back at once
        schedule_requests._send_schedule_task()
    assert sent == [contract.TASK_SCHEDULE]
    scheduling.schedule()  # the pass they asked for starts: what it reads answers them
    schedule_requests._send_schedule_task()
    assert sent == [contract.TASK_SCHEDULE] * 2


def test_a_full_cluster_judges_the_head_of_its_queue_and_tells_the_rest_no_core_is_free(
    nodes: list[Node],
    submit: Callable[..., Job],
    monkeypatch: pytest.MonkeyPatch,
    django_capture_on_commit_callbacks: Capture,
) -> None:
    monkeypatch.setattr(scheduling, "JUDGED_AT_ONCE", 2)
    Quota.objects.filter(is_default=True).update(running_jobs=10, cpu=100, memory_gb=1000)
    running = submit(8)  # all 16 cores
    waiting = [submit(1) for _ in range(5)]
    scheduling.schedule()
    for job in waiting:
        job.refresh_from_db()
    # node-1 holds four of the job's instances: its end frees 8 cores there, not just 2.
    need = "waiting: needs a node with 2 CPU cores and 4 GB free; node-1 frees 8 CPU cores"
    assert [job.reason for job in waiting[:2]] == [f"{need} when job {running.pk} ends"] * 2
    assert [job.reason for job in waiting[2:]] == [waitlist.FAR_BACK] * 3
    # A core frees: every waiting job is judged again, and what fits starts.
    finish(running, django_capture_on_commit_callbacks)
    for job in waiting:
        job.refresh_from_db()
        assert placed(job), job.reason


def test_a_job_past_the_judged_head_that_room_was_reserved_for_still_claims_it(
    nodes: list[Node], submit: Callable[..., Job], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(scheduling, "JUDGED_AT_ONCE", 1)
    submit(8)  # all 16 cores
    waiting = [submit(1) for _ in range(3)]
    # As if waiting[2] had preempted jobs that are stopping now (preempt_pass).
    monkeypatch.setattr(scheduling.PreemptionPass, "stopping", lambda self: {waiting[2].pk: []})
    judged: list[int] = []
    real = scheduling.SchedulingPass.consider

    def spy(self: scheduling.SchedulingPass, job: waitlist.WaitingJob) -> str | None:
        judged.append(job.pk)
        return real(self, job)

    monkeypatch.setattr(scheduling.SchedulingPass, "consider", spy)
    scheduling.schedule()
    # The head, then past the cut only the job whose room is coming.
    assert judged == [waiting[0].pk, waiting[2].pk]
    waiting[1].refresh_from_db()
    assert waiting[1].reason == waitlist.FAR_BACK


def test_hundreds_of_jobs_alike_are_judged_once_and_their_reasons_written_in_one_update(
    nodes: list[Node], submit: Callable[..., Job], alice: User
) -> None:
    submit(8)  # all 16 cores
    template = submit(1)
    replica = template.replicas.get()
    clones = Job.objects.bulk_create(
        Job(**{f.attname: getattr(template, f.attname) for f in Job._meta.concrete_fields
               if f.attname != "id"} | {"reason": ""})
        for _ in range(300)
    )  # fmt: skip
    Replica.objects.bulk_create(
        Replica(job=job, role=replica.role, index=0, package=replica.package) for job in clones
    )
    decided: list[int] = []
    real = scheduling.SchedulingPass.decide

    def spy(self: scheduling.SchedulingPass, job: waitlist.WaitingJob) -> str | None:
        decided.append(job.pk)
        return real(self, job)

    with CaptureQueriesContext(connection) as queries:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(scheduling.SchedulingPass, "decide", spy)
            patch.setattr(scheduling, "JUDGED_AT_ONCE", 1000)  # every one of them judged
            scheduling.schedule()
    assert len(decided) == 2  # the head (it becomes the blocker), then one of the rest alike
    writes = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("UPDATE")]
    assert len(writes) == 1
    assert len({j.reason for j in Job.objects.filter(pk__in=[c.pk for c in clones])}) == 1


def test_a_job_far_back_that_waits_for_room_is_told_so_whether_or_not_a_core_is_free(
    nodes: list[Node], submit: Callable[..., Job], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(scheduling, "JUDGED_AT_ONCE", 2)
    Quota.objects.filter(is_default=True).update(running_jobs=10, cpu=100, memory_gb=1000)
    submit(7)  # 14 of the 16 cores
    submit(1, package="cpu-1")  # one more: a single core stays free, too little for cpu-2
    waiting = [submit(1) for _ in range(4)]
    scheduling.schedule()
    for job in waiting:
        job.refresh_from_db()
        assert not placed(job)
    # A core is free, so every job was judged; those past the first two are told they are far
    # back, as they would be on a full cluster: no reason flips as cores free and fill.
    assert [j.reason.startswith("waiting: needs a node") for j in waiting[:2]] == [True, True]
    assert [j.reason for j in waiting[2:]] == [waitlist.FAR_BACK] * 2
    with CaptureQueriesContext(connection) as queries:
        scheduling.schedule()
    assert not [q for q in queries.captured_queries if q["sql"].startswith("UPDATE")]


def test_the_cycle_collector_is_paused_only_while_a_pass_runs(
    nodes: list[Node], submit: Callable[..., Job], monkeypatch: pytest.MonkeyPatch
) -> None:
    submit(6)
    waiting = submit(4)  # does not fit: every pass judges it
    seen: list[bool] = []
    run = scheduling.SchedulingPass.run

    def watched(self: scheduling.SchedulingPass) -> list[int]:
        seen.append(gc.isenabled())
        return run(self)

    monkeypatch.setattr(scheduling.SchedulingPass, "run", watched)
    assert gc.isenabled()
    scheduling.schedule()
    assert seen == [False] and gc.isenabled() and not placed(waiting)

    def failing(self: scheduling.SchedulingPass) -> list[int]:
        raise RuntimeError("a pass that fails")

    monkeypatch.setattr(scheduling.SchedulingPass, "run", failing)
    with pytest.raises(RuntimeError):
        scheduling.schedule()
    assert gc.isenabled()  # given back however the pass ends

    gc.disable()  # a caller's own choice is left as it was
    try:
        monkeypatch.setattr(scheduling.SchedulingPass, "run", watched)
        scheduling.schedule()
        assert not gc.isenabled()
    finally:
        gc.enable()
