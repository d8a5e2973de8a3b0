"""Time limits: how long each attempt of a job may hold its nodes, what a job gets when it sets
none, when a running job is expected to give its nodes back, and stopping a job past its limit.

A limit counts from the attempt's placement (`JobAttempt.placed`), as Slurm's counts from the
allocation: the job holds its nodes from then on, and backfill (jobs.services.scheduler.backfill)
needs to know when it gives them back. A restart's new attempt is placed afresh, so it counts from
its own placement and has the whole limit again.

A job past its limit fails with "time limit of 2 h reached": Slurm's TIMEOUT is a failure
too, since the job did not finish its work, and a pipeline waiting on it must not read it as
done. It is never restarted for it (restarts.Cause.TIME_LIMIT): the next attempt would only
run into the same limit. Its processes get SIGTERM and TRAINYARD_TIME_LIMIT_GRACE_SECONDS to
checkpoint before SIGKILL.
"""

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import F, FilteredRelation, Min, Q
from django.utils import timezone

from jobs.models import Job, JobAttempt, PriorityClass, Quota, Replica
from jobs.services.lifecycle import outcomes, restarts
from jobs.services.plain_rows import aware_dates, plain_rows
from jobs.time_limit_text import reached

log = logging.getLogger(__name__)


def default_for(user: User, priority: PriorityClass | None = None) -> int | None:
    """The time limit a job of `user` in class `priority` gets when it sets none: the tightest
    of its class's default and those of the quotas of the user's groups, else the console's
    (TRAINYARD_DEFAULT_TIME_LIMIT_SECONDS), else none."""
    by_group = Quota.objects.filter(
        group__in=user.groups.all(), default_time_limit__isnull=False
    ).aggregate(tightest=Min("default_time_limit"))["tightest"]
    found = [int(d) for d in (by_group, priority and priority.default_time_limit) if d]
    if found:
        return min(found)
    return settings.TRAINYARD_DEFAULT_TIME_LIMIT_SECONDS or None


def attempt_ends(job: Job, attempt: JobAttempt | None) -> datetime | None:
    """When `attempt` (the job's current one) reaches the job's limit and is stopped; None
    without a limit, or while it is not placed, or once it ended."""
    if (
        job.time_limit is None
        or attempt is None
        or attempt.placed is None
        or attempt.finished is not None
        or not job.is_active
    ):
        return None
    return attempt.placed + timedelta(seconds=job.time_limit)


def stop_grace() -> timedelta:
    """How long after its limit a job may still hold its nodes, at the most: until the next
    reconciliation pass notices it, then the grace between SIGTERM and SIGKILL. Backfill counts
    it into a job's end, so that a job said to end before the head's start does."""
    return timedelta(
        seconds=settings.TRAINYARD_TIME_LIMIT_GRACE_SECONDS + settings.TRAINYARD_RECONCILE_SECONDS
    )


def expected_ends(now: datetime) -> dict[int, datetime | None]:
    """When each job that holds capacity now gives its nodes back, at the earliest: its
    attempt's placement + its limit; `now` for one already being stopped (it ended, it
    restarts, or it was told to stop); None when it has no limit (unknown)."""
    # One read of the replicas that hold capacity, each with its job and the job's current
    # attempt joined: three queries over the holders, each with its own subquery of them,
    # were a sixth of a PostgreSQL scheduling pass at a thousand nodes (issue 24). Unordered:
    # nothing here needs an order, and the model's (by job id, then id) would be a sort.
    current = FilteredRelation(
        "job__attempts", condition=Q(job__attempts__number=F("job__attempt"))
    )
    rows = (
        Replica.objects.filter(state__in=Replica.HOLDING_STATES)
        .annotate(current=current)
        .order_by()
        .values_list("job_id", "job__state", "job__time_limit", "stop_sent", "current__placed")
    )
    aware = aware_dates(rows.db)
    jobs: dict[int, tuple[str, int | None, datetime | None]] = {}
    stopping: set[int] = set()
    for job_id, state, limit, stop_sent, placed in plain_rows(rows):
        jobs[job_id] = (state, limit, aware(placed) if placed is not None else None)
        if stop_sent is not None:
            stopping.add(job_id)
    ends: dict[int, datetime | None] = {}
    for job_id, (state, limit, placed) in jobs.items():
        if state not in (Job.State.QUEUED, Job.State.RUNNING) or job_id in stopping:
            ends[job_id] = now  # its processes are on their way out
        elif limit is None:
            ends[job_id] = None
        else:
            ends[job_id] = (placed or now) + timedelta(seconds=limit)
    return ends


def overdue(now: datetime | None = None) -> list[int]:
    """The ids of jobs whose current attempt holds its nodes beyond its time limit."""
    now = now or timezone.now()
    current = JobAttempt.objects.filter(
        number=F("job__attempt"),
        job__state__in=(Job.State.QUEUED, Job.State.RUNNING),
        job__time_limit__isnull=False,
        placed__isnull=False,
        finished__isnull=True,
    ).values_list("job_id", "job__time_limit", "placed")
    return sorted(
        job_id
        for job_id, limit, placed in current
        if limit is not None and placed is not None and placed + timedelta(seconds=limit) <= now
    )


def stop_if_overdue(job_id: int, now: datetime | None = None) -> bool:
    """Stop the job (SIGTERM, then SIGKILL after the grace) and fail it with the reason, if its
    current attempt is past its limit as the row reads under its lock; whether it did."""
    now = now or timezone.now()
    with transaction.atomic():
        job = outcomes.locked_job(job_id)
        if (
            job is None
            or job.time_limit is None
            or job.state
            not in (
                Job.State.QUEUED,
                Job.State.RUNNING,
            )
        ):
            return False
        attempt = JobAttempt.objects.filter(job=job, number=job.attempt).first()
        if attempt is None or attempt.placed is None:
            return False
        if attempt.placed + timedelta(seconds=job.time_limit) > now:
            return False
        why = reached(job.time_limit)
        log.warning("job %s: %s", job.pk, why)
        outcomes.end_attempt(
            job,
            restarts.Cause.TIME_LIMIT,
            why,
            why,
            grace_seconds=settings.TRAINYARD_TIME_LIMIT_GRACE_SECONDS,
        )
        return True


def enforce(now: datetime | None = None) -> int:
    """Stop every job past its time limit (a reconciliation pass calls it); how many."""
    return sum(stop_if_overdue(job_id, now) for job_id in overdue(now))
