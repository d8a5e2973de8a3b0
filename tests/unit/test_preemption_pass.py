"""Priority classes at submission and preemption in the scheduling pass, over the database with
the agents' reports played by hand (the real stack's test is tests/integration/test_preemption)."""

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from jobs.models import Job, Node, PriorityClass, Quota, Replica, RestartPolicy
from jobs.services.lifecycle import reports
from jobs.services.scheduler import evictions, scheduling, waitlist
from jobs.services.scheduler.preempt_pass import PreemptionPass
from jobs.services.submission import ValidationFailed, check_job_request, submit_job
from jobs.services.views import presenters, queue_listing
from tests.conftest import set_quota
from tests.unit.helpers import SentTasks, job_request

pytestmark = pytest.mark.usefixtures("catalog", "code_root", "redis_url")

Capture = Callable[..., Any]


@pytest.fixture
def submit(
    sent_tasks: SentTasks, django_capture_on_commit_callbacks: Capture
) -> Callable[..., Job]:
    def go(user: User, priority: str, instances: int = 1, package: str = "cpu-2") -> Job:
        request = job_request(instances, package, priority=priority)
        with django_capture_on_commit_callbacks(execute=True):
            job = submit_job(user, check_job_request(request))
        job.refresh_from_db()
        return job

    return go


def start(job: Job, capture: Capture) -> None:
    """Its agents say every replica of its current attempt started."""
    for r in job.replicas.filter(attempt=job.attempt).select_related("node"):
        assert r.node is not None
        with capture(execute=True):
            reports.replica_started(job.pk, r.role, r.index, r.node.name, attempt=job.attempt)
    job.refresh_from_db()


def stopped(job: Job, attempt: int, capture: Capture) -> None:
    """Its agents say the processes of that attempt stopped (after SIGTERM)."""
    for r in job.replicas.filter(attempt=attempt).select_related("node"):
        assert r.node is not None
        with capture(execute=True):
            reports.replica_exited(
                job.pk, r.role, r.index, r.node.name, "stopped", 143, "", [], attempt=attempt
            )
    job.refresh_from_db()


def fill_with_low_jobs(user: User, submit: Callable[..., Job], capture: Capture) -> list[Job]:
    """The two nodes of 8 cores filled with eight running low jobs of 2 cores of the user's."""
    set_quota(user, cpu=16, jobs=8)
    lows = []
    for _ in range(8):
        lows.append(submit(user, "low"))
        start(lows[-1], capture)
    return lows


def placed(job: Job) -> bool:
    return not job.replicas.filter(attempt=job.attempt, state=Replica.State.PENDING).exists()


def test_an_unknown_class_is_refused_naming_the_classes(alice: User) -> None:
    with pytest.raises(ValidationFailed) as refused:
        check_job_request(job_request(priority="urgent"))
    assert refused.value.errors == {
        "priority": ["Unknown priority class 'urgent'; the classes are: high, normal, low."]
    }


def test_a_quota_caps_the_class_its_holder_may_ask_for(alice: User, bob: User) -> None:
    Quota.objects.create(
        user=alice, cpu=8, gpus=0, memory_gb=32, running_jobs=4,
        max_priority=PriorityClass.objects.get(name="normal"),
    )  # fmt: skip
    with pytest.raises(ValidationFailed) as refused:
        submit_job(alice, check_job_request(job_request(priority="high")))
    assert refused.value.errors == {
        "priority": [
            "Your quota allows priority up to 'normal'; 'high' is higher. Ask an admin, or "
            "pick a lower class."
        ]
    }
    assert not Job.objects.filter(owner=alice).exists()
    job = submit_job(alice, check_job_request(job_request(priority="low")))
    assert (job.priority_name, job.priority) == ("low", -10)


def test_a_job_without_a_class_is_normal(alice: User) -> None:
    job = submit_job(alice, check_job_request(job_request()))
    assert (job.priority_name, job.priority) == ("normal", 0)


def test_a_high_job_preempts_the_last_started_low_job_and_keeps_the_room_it_frees(
    nodes: list[Any],
    alice: User,
    bob: User,
    charlie_admin: User,
    submit: Callable[..., Job],
    django_capture_on_commit_callbacks: Capture,
) -> None:
    lows = fill_with_low_jobs(alice, submit, django_capture_on_commit_callbacks)
    assert all(j.state == Job.State.RUNNING for j in lows)
    normal = submit(charlie_admin, "normal")  # may not preempt: waits
    assert not placed(normal) and normal.reason.startswith("waiting: ")
    assert presenters.queue_position(normal) == 1

    high = submit(bob, "high")
    victim = Job.objects.get(pk=lows[-1].pk)
    assert victim.state == Job.State.RESTARTING
    assert victim.preempted_by == [high.pk]
    still_running = Job.objects.filter(pk__in=[j.pk for j in lows], state=Job.State.RUNNING)
    assert set(still_running.values_list("pk", flat=True)) == {j.pk for j in lows[:-1]}
    attempt = victim.attempts.get(number=0)
    assert attempt.reason == f"preempted by job {high.pk} (high) of bob"
    assert not attempt.counted and victim.restarts_used == 0
    high.refresh_from_db()
    assert not placed(high)
    # Another user's job is counted, never named.
    assert high.reason == "preempting a job of another user: starts once it has stopped"
    # The high job is ahead of the normal one in the queue.
    assert presenters.queue_position(high) == 1 and presenters.queue_position(normal) == 2
    # The queue names what it preempts to whoever may see that job, and counts it for others.
    for viewer, named, others in ((bob, [], 1), (charlie_admin, [victim.pk], 0)):
        entry = queue_listing.entries(viewer)[0]
        assert (entry.job_id, entry.preempting, entry.preempting_others) == (high.pk, named, others)

    stopped(victim, 0, django_capture_on_commit_callbacks)
    high.refresh_from_db()
    normal.refresh_from_db()
    assert placed(high), high.reason
    assert not placed(normal)  # the room went to the job it was freed for
    assert [e.preempting for e in queue_listing.entries(charlie_admin)] == [[]]
    # The victim is back in the queue (its restart policy is never: it is not its failure),
    # keeping its submission time.
    Job.objects.filter(pk=victim.pk).update(restart_at=timezone.now())
    from jobs.services.lifecycle import restarts

    with django_capture_on_commit_callbacks(execute=True):
        restarts.resume(victim.pk)
    victim.refresh_from_db()
    assert victim.state == Job.State.QUEUED and victim.created == lows[-1].created
    assert presenters.queue_position(normal) == 1 and presenters.queue_position(victim) == 2


def test_a_job_preempted_once_is_not_preempted_again_before_its_minimum_run(
    nodes: list[Any],
    alice: User,
    bob: User,
    submit: Callable[..., Job],
    django_capture_on_commit_callbacks: Capture,
    settings: Any,
) -> None:
    settings.TRAINYARD_PREEMPTION_MIN_RUN_SECONDS = 600
    lows = fill_with_low_jobs(alice, submit, django_capture_on_commit_callbacks)
    Job.objects.filter(pk__in=[j.pk for j in lows]).update(
        preempted_by=[1]
    )  # each was preempted before, and its attempt started just now
    high = submit(bob, "high")
    assert not placed(high)
    assert all(
        s == Job.State.RUNNING
        for s in Job.objects.filter(pk__in=[j.pk for j in lows]).values_list("state", flat=True)
    )
    assert high.reason.startswith("waiting: ")


def preempted_low_job(
    alice: User,
    bob: User,
    submit: Callable[..., Job],
    capture: Capture,
    last: tuple[int, str] = (1, "cpu-2"),
) -> tuple[Job, Job]:
    """alice's low jobs fill both nodes (7 of 2 cores, then one of `last`: instances,
    package, of 2 cores in all); bob's high job preempts the one started last. (victim,
    preemptor)."""
    set_quota(alice, cpu=16, jobs=8)
    instances, package = last
    for _ in range(7):
        start(submit(alice, "low"), capture)
    newest = submit(alice, "low", instances=instances, package=package)
    start(newest, capture)
    high = submit(bob, "high")
    victim = Job.objects.get(pk=newest.pk)
    assert victim.state == Job.State.RESTARTING and victim.preempted_by == [high.pk]
    return victim, high


def exited(job: Job, states: list[str], capture: Capture) -> None:
    """Its agents report the instances of attempt 0 ended so, in order (exit 0 for succeeded,
    143 for stopped)."""
    replicas = list(job.replicas.filter(attempt=0).select_related("node").order_by("id"))
    for r, state in zip(replicas, states, strict=True):
        assert r.node is not None
        with capture(execute=True):
            reports.replica_exited(
                job.pk, r.role, r.index, r.node.name, state, 0 if state == "succeeded" else 143,
                "", [], attempt=0,
            )  # fmt: skip
    job.refresh_from_db()


def test_a_victim_that_had_finished_when_its_stop_came_succeeds_and_is_not_run_again(
    nodes: list[Any],
    alice: User,
    bob: User,
    submit: Callable[..., Job],
    django_capture_on_commit_callbacks: Capture,
) -> None:
    # The preemption is decided as the victim's trainers exit 0 on their own: their agents
    # report succeeded (not stopped), the reports crossing the stop. Found on the fleet,
    # where such a job was queued and trained again.
    victim, high = preempted_low_job(alice, bob, submit, django_capture_on_commit_callbacks)
    exited(victim, ["succeeded"], django_capture_on_commit_callbacks)
    assert (victim.state, victim.reason, victim.attempt) == (Job.State.SUCCEEDED, "", 0)
    assert (victim.preempted_by, victim.restarts_used) == ([], 0)
    assert [(a.number, a.reason) for a in victim.attempts.all()] == [(0, "")]
    assert set(victim.replicas.values_list("attempt", "state")) == {(0, Replica.State.SUCCEEDED)}
    high.refresh_from_db()
    assert placed(high), high.reason  # the room it freed went to the job that asked for it


def test_a_restart_whose_old_instances_did_not_all_succeed_runs_again(
    nodes: list[Any],
    alice: User,
    bob: User,
    submit: Callable[..., Job],
    django_capture_on_commit_callbacks: Capture,
) -> None:
    victim, high = preempted_low_job(
        alice, bob, submit, django_capture_on_commit_callbacks, last=(2, "cpu-1")
    )
    exited(victim, ["succeeded", "stopped"], django_capture_on_commit_callbacks)
    assert victim.state in (Job.State.RESTARTING, Job.State.QUEUED) and victim.attempt == 1
    assert victim.preempted_by == [high.pk]


def test_the_new_job_form_offers_the_classes_and_launches_with_one(
    client: Any, alice: User, nodes: list[Any], sent_tasks: SentTasks
) -> None:
    client.force_login(alice)
    html = client.get("/jobs/new/").content.decode()
    assert '<option value="high">high — may preempt</option>' in html
    assert '<option value="normal" selected>normal</option>' in html
    form = {
        "name": "digits", "image": "pytorch:2.13-cpu", "script": "digits-ddp", "script_path": "",
        "args": "", "package": "cpu-1", "instances": "1", "priority": "low",
    }  # fmt: skip
    assert client.post("/jobs/new/", form).status_code == 302
    assert Job.objects.get().priority_name == "low"
    refused = client.post("/jobs/new/", dict(form, priority="urgent"))
    assert "Select a valid choice" in refused.content.decode()
    assert Job.objects.count() == 1
    html = client.get(f"/jobs/{Job.objects.get().pk}/").content.decode()
    assert '<div id="priority-summary"><strong>Priority</strong> low</div>' in html


def test_a_victim_that_later_stops_for_another_reason_is_not_credited_to_its_old_preemptor(
    nodes: list[Any],
    alice: User,
    bob: User,
    submit: Callable[..., Job],
    django_capture_on_commit_callbacks: Capture,
) -> None:
    """A regression (issue 43): the preemptor was read from the job (`preempted_by[-1]` while
    `last_preempted` was set), so a job preempted once by P, whose later attempt ended for any
    other reason, was counted among P's victims while that attempt's instances stopped, and P
    would have waited on them and reserved their room."""
    from jobs.services.lifecycle import outcomes, restarts
    from jobs.services.scheduler import scheduling
    from jobs.services.scheduler.preempt_pass import PreemptionPass

    capture = django_capture_on_commit_callbacks
    victim, high = preempted_low_job(alice, bob, submit, capture)
    stopped(victim, 0, capture)
    high.refresh_from_db()
    assert placed(high), high.reason
    start(high, capture)
    # Room for the victim again (a third node), and its back-off over: it runs attempt 1.
    Node.objects.create(
        name="node-3", address="127.0.0.1", cpu=8, memory_gb=32, last_heartbeat=timezone.now()
    )
    Job.objects.filter(pk=victim.pk).update(restart_at=timezone.now())
    with capture(execute=True):
        restarts.resume(victim.pk)
        scheduling.schedule()
    victim.refresh_from_db()
    start(victim, capture)
    assert (victim.state, victim.attempt) == (Job.State.RUNNING, 1)
    # Attempt 1 ends for another reason (an admin drains node-3 with eviction, and the job
    # restarts on failure); its instances have been told to stop and have not yet.
    Job.objects.filter(pk=victim.pk).update(restart_policy=RestartPolicy.ON_FAILURE)
    victim.refresh_from_db()
    with capture(execute=True):
        outcomes.end_attempt(victim, restarts.Cause.EVICTION, "node-3 drained", "evicted")
    victim.refresh_from_db()
    assert victim.attempt == 2, (victim.state, victim.reason)
    assert victim.replicas.filter(attempt=1, state__in=Replica.HOLDING_STATES).exists()
    assert victim.attempts.get(number=0).preempted_by == high.pk
    assert victim.attempts.get(number=1).preempted_by is None
    assert PreemptionPass([], timezone.now()).stopping() == {}


def test_preemption_only_names_its_victims_and_the_pass_stops_them(
    nodes: list[Any],
    alice: User,
    bob: User,
    submit: Callable[..., Job],
    django_capture_on_commit_callbacks: Capture,
) -> None:
    lows = fill_with_low_jobs(alice, submit, django_capture_on_commit_callbacks)
    # Queued, and no pass run for it yet (its request to schedule is never sent).
    with django_capture_on_commit_callbacks(execute=False):
        high = submit_job(bob, check_job_request(job_request(1, "cpu-2", priority="high")))
    ready = scheduling.locked_nodes()
    held = scheduling.holdings(ready)
    rooms = scheduling.free_rooms(ready, held)
    preemption = PreemptionPass(held, timezone.now())
    (waiting,) = waitlist.read([high.pk])

    plan = preemption.plan(Job.objects.get(pk=high.pk), waiting.demands, rooms)

    assert plan is not None
    assert plan.evictions == [
        evictions.Eviction(lows[-1].pk, high.pk, f"preempted by job {high.pk} (high) of bob", False)
    ]
    # Chosen, not stopped: every low job still runs, and no room is reserved yet.
    assert Job.objects.filter(pk__in=[j.pk for j in lows], state=Job.State.RUNNING).count() == 8
    assert sum(room.cpu for room in rooms) == 0 and preemption.stopping() == {}
    assert evictions.carry_out(plan.evictions)
    victim = Job.objects.get(pk=lows[-1].pk)
    assert victim.state == Job.State.RESTARTING and victim.preempted_by == [high.pk]
    assert victim.attempts.get(number=0).reason == plan.evictions[0].reason
    # A victim that no longer runs fails the plan; the next pass looks again.
    assert not evictions.carry_out(plan.evictions)
