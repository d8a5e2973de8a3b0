"""The queue's order: every job waiting for room, in the order the scheduler takes them (the
Queue page shows it: jobs.services.views.queue_listing)."""

from dataclasses import dataclass
from typing import Protocol, TypeVar

from django.db.models import QuerySet

from jobs.models import Job, Replica
from jobs.services.scheduler import fairshare
from jobs.services.scheduler.queue_order import ORDER_BY


class Prioritised(Protocol):
    """What the order reads of a waiting job: a Job, or a scheduling pass's plain values."""

    @property
    def pk(self) -> int: ...
    @property
    def owner_id(self) -> int: ...
    @property
    def priority(self) -> int: ...


QueuedT = TypeVar("QueuedT", bound=Prioritised)  # a Job, or a pass's waitlist.WaitingJob


def queued_jobs() -> "QuerySet[Job]":
    """The jobs waiting for room (queued, with an instance not yet placed), by priority and
    submission (the database's part of the order: `in_order` adds fair share). A Slurm pool's
    jobs wait in Slurm's queue instead (jobs.services.slurm.slurm_pass)."""
    unplaced = Replica.objects.filter(state=Replica.State.PENDING).values("job_id")
    return Job.objects.filter(
        state=Job.State.QUEUED, pk__in=unplaced, slurm_pool__isnull=True
    ).order_by(*ORDER_BY)


# What `in_order` reads of each job: a leaner query must load at least these.
ORDER_FIELDS = ("id", "owner_id", "priority")


@dataclass(frozen=True, slots=True)
class Ranked:
    """What the order reads of a waiting job, as plain values."""

    pk: int
    owner_id: int
    priority: int


def ranking() -> list[int]:
    """The waiting jobs' ids, first the one the scheduler takes first: every job's place in
    the queue, from plain values (a state event may need the places of 10,000 jobs)."""
    rows = queued_jobs().values_list(*ORDER_FIELDS)
    return [job.pk for job in in_order([Ranked(*row) for row in rows])]


def waiting_in_order(jobs: "QuerySet[Job] | None" = None) -> list[Job]:
    """The jobs waiting for room (`jobs`, a narrower or leaner `queued_jobs()`), first the one the
    scheduler takes first."""
    return in_order(list(queued_jobs() if jobs is None else jobs))


def in_order(jobs: list[QueuedT], reserved: set[int] | None = None) -> list[QueuedT]:
    """The one waiting order: a job that borrowed capacity was reclaimed for first (its room
    is kept for it: jobs.services.scheduler.reclaim), then higher priority
    (jobs.services.scheduler.queue_order), then by fair share (the group, then the user, furthest
    below its share: jobs.services.scheduler.fairshare), then first come, first served.

    `jobs` come as `queued_jobs()` orders them (ORDER_BY: priority, then submission time and id):
    the sort is stable, so jobs alike in the keys before keep that order, which is the
    submission order (fairshare.sort_key's last terms) without reading a date per job.
    `reserved`: reserved_lenders(), where the caller has read it already."""
    if not jobs:
        return jobs
    keys = fairshare.owner_keys({j.owner_id for j in jobs})
    if reserved is None:
        reserved = reserved_lenders()
    unknown = (0.0, 0.0)
    return sorted(
        jobs, key=lambda j: (j.pk not in reserved, -j.priority, keys.get(j.owner_id, unknown))
    )


def reserved_lenders() -> set[int]:
    """The jobs that a borrowed job was stopped for (Job.reclaimed_for) and that have not
    started since: few, and read off an index."""
    # Unordered: the model's default order would make DISTINCT sort every such job by date.
    ids = (
        Job.objects.filter(reclaimed_for__isnull=False)
        .order_by()
        .values_list("reclaimed_for", flat=True)
    )
    return {int(i) for i in ids.distinct() if i is not None}
