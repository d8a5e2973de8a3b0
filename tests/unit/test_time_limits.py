"""Time limits: how they are given and defaulted, the scheduler's EASY backfill over real rows,
and the stop of a job past its limit (jobs.services.lifecycle.time_limits, scheduling)."""

import re
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client
from django.utils import timezone

from jobs.models import Job, JobAttempt, Node, PriorityClass, Quota, Replica, RestartPolicy
from jobs.services.lifecycle import time_limits
from jobs.services.submission import ValidationFailed, check_job_request, submit_job
from jobs.services.views import queue_listing
from jobs.time_limit_text import BadTimeLimit, in_words, parse
from tests.unit.helpers import SentTasks, job_request
from workers import contract

pytestmark = pytest.mark.usefixtures("catalog", "code_root", "redis_url")

Capture = Callable[..., Any]


@pytest.fixture
def submit(
    alice: User, sent_tasks: SentTasks, django_capture_on_commit_callbacks: Capture
) -> Callable[..., Job]:
    # Room for more jobs than the default quota's four.
    Quota.objects.create(user=alice, cpu=100, gpus=0, memory_gb=500, running_jobs=50)

    def go(instances: int, **overrides: Any) -> Job:
        with django_capture_on_commit_callbacks(execute=True):
            job = submit_job(alice, check_job_request(job_request(instances, "cpu-2", **overrides)))
        job.refresh_from_db()
        return job

    return go


def placed(job: Job) -> bool:
    return not job.replicas.filter(state=Replica.State.PENDING).exists()


def nodes_of(job: Job) -> set[str]:
    return {r.node.name for r in job.replicas.select_related("node") if r.node is not None}


def test_a_limit_is_seconds_or_text_with_units() -> None:
    assert [parse(v) for v in (7200, "7200", "2h", "90m", "1h30m", "1 h 30 min", "45s", "1d")] == [
        7200, 7200, 7200, 5400, 5400, 5400, 45, 86400,
    ]  # fmt: skip
    assert parse(None) is None and parse("  ") is None
    for bad in ("2 hours", "h", "-5", 0, "1y", True, 10**9, 1.5, [60]):
        with pytest.raises(BadTimeLimit):
            parse(bad)
    assert [in_words(s) for s in (7200, 5400, 45, 90, 93600)] == [
        "2 h", "1 h 30 min", "45 s", "1 min 30 s", "1 d 2 h",
    ]  # fmt: skip
    assert parse(in_words(93600)) == 93600  # the form shows it as it reads it back


def test_a_bad_limit_is_refused_by_field_and_nothing_is_created(alice: User) -> None:
    with pytest.raises(ValidationFailed) as refused:
        check_job_request(job_request(2, time_limit="two hours"))
    assert "'two hours' is not a time limit" in refused.value.errors["time_limit"][0]
    with pytest.raises(ValidationFailed) as refused:
        check_job_request(job_request(2, time_limit=[3600]))
    assert refused.value.errors["time_limit"] == [
        'Give the time limit as seconds (7200) or text with units: "2h", "90m", "1h30m", '
        '"45s", "1d".'
    ]
    assert not Job.objects.exists()


def test_a_job_without_a_limit_gets_its_groups_tightest_default_else_the_consoles(
    nodes: list[Node], submit: Callable[..., Job], alice: User, settings: Any
) -> None:
    settings.TRAINYARD_DEFAULT_TIME_LIMIT_SECONDS = 0
    assert submit(1).time_limit is None
    settings.TRAINYARD_DEFAULT_TIME_LIMIT_SECONDS = 86400
    assert submit(1).time_limit == 86400
    for name, limit in (("vision", 4 * 3600), ("speech", 2 * 3600), ("free", None)):
        group = Group.objects.create(name=name)
        alice.groups.add(group)
        Quota.objects.create(
            group=group, cpu=100, gpus=0, memory_gb=500, running_jobs=50, default_time_limit=limit
        )
    assert time_limits.default_for(alice) == 2 * 3600
    assert submit(1).time_limit == 2 * 3600
    assert submit(1, time_limit="6h").time_limit == 6 * 3600  # its own wins
    # A priority class may have a default of its own: the tightest applies.
    PriorityClass.objects.filter(name="low").update(default_time_limit=3600)
    PriorityClass.objects.filter(name="high").update(default_time_limit=4 * 3600)
    assert submit(1, priority="low").time_limit == 3600
    assert submit(1, priority="high").time_limit == 2 * 3600


def test_the_api_and_the_job_page_show_the_limit_and_when_the_attempt_is_stopped(
    nodes: list[Node], submit: Callable[..., Job], alice: User
) -> None:
    job = submit(2, time_limit="1h30m")
    placed_at = JobAttempt.objects.get(job=job, number=0).placed
    assert placed_at is not None
    client = Client()
    client.force_login(alice)
    answer = client.get(f"/api/v1/jobs/{job.pk}").json()
    assert answer["time_limit"] == 5400
    assert answer["time_limit_ends"] == (placed_at + timedelta(seconds=5400)).isoformat()
    assert client.get(f"/api/v1/jobs/{job.pk}/request").json()["time_limit"] == 5400
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert "1 h 30 min per attempt, counted from its placement" in page
    assert 'id="time-limit-ends"' in page


def reserved_at(start: datetime) -> str:
    """A pattern for the head's reservation in words: the time alone, or with its date where
    it falls on another day than the pass that wrote it (a run that crosses midnight)."""
    return rf"reserved to start at (\d{{4}}-\d\d-\d\d )?{start:%H:%M} UTC on node-2"


def test_a_greedy_pass_would_delay_the_head_easy_backfill_does_not(
    nodes: list[Node], submit: Callable[..., Job]
) -> None:
    full = submit(4)  # node-1's 8 cores, no limit
    ending = submit(3, time_limit="30m")  # 6 of node-2's 8 cores, until its limit
    assert nodes_of(full) == {"node-1"} and nodes_of(ending) == {"node-2"}
    head = submit(4)  # 8 cores: node-2 whole, once `ending` has gone
    assert not placed(head)
    ending_placed = JobAttempt.objects.get(job=ending, number=0).placed
    assert ending_placed is not None
    start = ending_placed + timedelta(minutes=30)
    assert re.search(rf"; {reserved_at(start)}$", head.reason), head.reason
    head.refresh_from_db()
    assert head.estimated_start == start  # the queue's estimated start (its page: the API)
    assert [(e.job_id, e.estimated_start) for e in queue_listing.entries(head.owner)] == [
        (head.pk, start)
    ]
    # Two cores are free on node-2 now. A greedy pass would start this job there, and it
    # would still hold them when the head is due: it waits.
    long = submit(1)
    assert not placed(long)
    assert re.fullmatch(
        rf"waiting so as not to delay job {head.pk}, {reserved_at(start)} "
        r"\(a job whose time limit ends it before then may start now\)",
        long.reason,
    ), long.reason
    # One whose limit (and stop grace) ends it by then takes the two cores meanwhile.
    short = submit(1, time_limit="20m")
    assert placed(short) and nodes_of(short) == {"node-2"}
    head.refresh_from_db()
    assert not placed(head) and re.search(rf"{reserved_at(start)}$", head.reason), head.reason
    assert head.estimated_start == start
    assert Job.objects.get(pk=long.pk).estimated_start is None


def test_without_a_limit_where_the_head_needs_it_the_grace_rule_holds(
    nodes: list[Node], submit: Callable[..., Job], settings: Any
) -> None:
    settings.TRAINYARD_BACKFILL_GRACE_SECONDS = 300
    submit(4)
    submit(3)  # no limit: nobody can say when node-2 frees
    head = submit(4)
    assert "reserved" not in head.reason
    assert placed(submit(1))  # greedy backfill, within the grace
    JobAttempt.objects.filter(job=head).update(queued=timezone.now() - timedelta(minutes=10))
    late = submit(1, time_limit="1m")
    assert not placed(late)
    assert late.reason.startswith(f"waiting behind job {head.pk}, first in the queue, ")


def test_a_job_past_its_limit_is_stopped_with_the_reason_and_not_restarted(
    nodes: list[Node],
    submit: Callable[..., Job],
    sent_tasks: SentTasks,
    django_capture_on_commit_callbacks: Capture,
    settings: Any,
) -> None:
    settings.TRAINYARD_TIME_LIMIT_GRACE_SECONDS = 30
    restart = {"policy": RestartPolicy.ON_FAILURE, "max_restarts": 3}
    job = submit(2, time_limit="2h", restart=restart)
    other = submit(1, time_limit="3h")
    placed_at = JobAttempt.objects.get(job=job, number=0).placed
    assert placed_at is not None
    assert time_limits.enforce(placed_at + timedelta(hours=2) - timedelta(seconds=1)) == 0
    with django_capture_on_commit_callbacks(execute=True):
        assert time_limits.enforce(placed_at + timedelta(hours=2, seconds=1)) == 1
    job.refresh_from_db()
    other.refresh_from_db()
    assert (job.state, job.reason) == (Job.State.FAILED, "time limit of 2 h reached")
    assert job.attempt == 0 and job.restarts_used == 0  # a limit is not retried
    assert other.state == Job.State.QUEUED  # placed, its own limit still far
    stops = [s[1] for s in sent_tasks.named(contract.TASK_STOP_JOB) if s[1]["job_id"] == job.pk]
    assert stops and all(s["grace_seconds"] == 30 for s in stops)
    assert stops[0]["reason"] == "time limit of 2 h reached"
    # Its trainers, dying of the SIGTERM, do not change why it ended.
    from jobs.services.lifecycle import reports

    for r in job.replicas.select_related("node"):
        assert r.node is not None
        with django_capture_on_commit_callbacks(execute=True):
            reports.replica_exited(job.pk, r.role, r.index, r.node.name, "failed", -15, "", [])
    job.refresh_from_db()
    assert job.reason == "time limit of 2 h reached"
    assert time_limits.enforce(placed_at + timedelta(hours=3)) == 0


def test_the_new_job_form_takes_a_limit_and_shows_a_bad_one_under_its_box(
    nodes: list[Node], alice: User, sent_tasks: SentTasks
) -> None:
    client = Client()
    client.force_login(alice)
    form = {"name": "digits", "image": "pytorch:2.13-cpu", "script": "digits-ddp",
            "script_path": "", "args": "", "package": "cpu-1", "instances": "2"}  # fmt: skip
    page = client.get("/jobs/new/").content.decode()
    assert 'id="field-time_limit"' in page and "Empty: no limit (your default)." in page
    refused = client.post("/jobs/new/", {**form, "time_limit": "2 hours"}).content.decode()
    field = refused[refused.index('id="field-time_limit"') :]
    assert "is not a time limit" in field[: field.index("</div>")]
    assert not Job.objects.exists()
    assert client.post("/jobs/new/", {**form, "time_limit": "1h30m"}).status_code == 302
    job = Job.objects.get()
    assert job.time_limit == 5400
    again = client.get(f"/jobs/{job.pk}/again/").content.decode()
    assert 'value="1 h 30 min"' in again  # Edit and run again keeps it
