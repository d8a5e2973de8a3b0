"""The queue as its users see it: every job waiting for room, in the order the scheduler
takes them, with why each waits.

Everyone sees the whole queue, because where a job stands depends on the jobs ahead of it, but
not what is not theirs: another user's job shows its place, its size and how long it has
waited, never its name, id, owner or reason (a reason is written for its owner and may name
their other jobs). Administrators see everything.
"""

import dataclasses
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol, TypeVar

from django.contrib.auth.models import AnonymousUser, User
from django.db.models import QuerySet
from django.utils import timezone

from jobs.access import visible_jobs
from jobs.models import Job, Replica
from jobs.services import fairshare
from jobs.services.queue_order import ORDER_BY


class Prioritised(Protocol):
    """What the order reads of a waiting job: a Job, or a scheduling pass's plain values."""

    @property
    def pk(self) -> int: ...
    @property
    def owner_id(self) -> int: ...
    @property
    def priority(self) -> int: ...


QueuedT = TypeVar("QueuedT", bound=Prioritised)  # a Job, or a pass's waitlist.WaitingJob


@dataclass(frozen=True)
class QueueEntry:
    position: int  # 1 for the job the scheduler tries first
    job_id: int | None  # None: the viewer may not see the job
    name: str | None
    owner: str | None
    priority: str  # the job's priority class: the queue's first order
    cpu: int
    gpus: int
    memory_gb: int
    submitted: datetime
    reason: str | None
    # The jobs being stopped to make room for it (it preempted them, or they gave back
    # borrowed capacity to its group): those the viewer may see, and how many others.
    preempting: list[int] = field(default_factory=list)
    preempting_others: int = 0
    # The start reserved for it from the running jobs' time limits (the head of the queue).
    estimated_start: datetime | None = None

    @property
    def shown(self) -> bool:
        return self.job_id is not None


def waiting() -> "QuerySet[Job]":
    """The jobs waiting for room (queued, with an instance not yet placed), by priority and
    submission (the database's part of the order: `in_order` adds fair share). A Slurm pool's
    jobs wait in Slurm's queue instead (jobs.services.slurm_pass)."""
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
    rows = waiting().values_list(*ORDER_FIELDS)
    return [job.pk for job in in_order([Ranked(*row) for row in rows])]


def waiting_in_order(jobs: "QuerySet[Job] | None" = None) -> list[Job]:
    """The jobs waiting for room (`jobs`, a narrower or leaner `waiting()`), first the one the
    scheduler takes first."""
    return in_order(list(waiting() if jobs is None else jobs))


def in_order(jobs: list[QueuedT], reserved: set[int] | None = None) -> list[QueuedT]:
    """The one waiting order: a job that borrowed capacity was reclaimed for first (its room
    is kept for it: jobs.services.reclaim), then higher priority (jobs.services.queue_order),
    then by fair share (the group, then the user, furthest below its share:
    jobs.services.fairshare), then first come, first served.

    `jobs` come as `waiting()` orders them (ORDER_BY: priority, then submission time and id):
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


def entries(viewer: User | AnonymousUser) -> list[QueueEntry]:
    jobs = waiting_in_order(
        waiting()
        .select_related("owner", "priority_class")
        .only(
            "id", "name", "owner__username", "priority_class__name", "priority",
            "cpu_total", "gpus_total", "memory_gb_total", "created", "reason", "estimated_start",
        )
    )  # fmt: skip
    stopping = stopping_for()
    victims = {v for vs in stopping.values() for v in vs}
    visible = set(
        visible_jobs(viewer)
        .filter(pk__in=[j.pk for j in jobs] + sorted(victims))
        .values_list("pk", flat=True)
    )
    entries = []
    for place, job in enumerate(jobs, 1):
        shown = job.pk in visible
        entry = _entry(place, job, shown)
        if shown:
            mine = stopping.get(job.pk, [])
            entry = dataclasses.replace(
                entry,
                preempting=[v for v in mine if v in visible],
                preempting_others=sum(1 for v in mine if v not in visible),
                estimated_start=job.estimated_start,
            )
        entries.append(entry)
    return entries


def stopping_for() -> dict[int, list[int]]:
    """By waiting job: the jobs being stopped to make room for it, whose processes have not
    all gone yet (preempted by it: jobs.services.preempt_pass; or giving its group back
    borrowed capacity: jobs.services.reclaim)."""
    # They build on the scheduler, which builds on this module.
    from jobs.services.preempt_pass import PreemptionPass
    from jobs.services.reclaim import Reclaimer

    now = timezone.now()
    found = {
        preemptor: sorted(r.job_id for r in victims)
        for preemptor, victims in PreemptionPass([], now).stopping().items()
    }
    for lender, holdings in Reclaimer([], now).stopping().items():
        found[lender] = sorted({*found.get(lender, []), *(h.job_id for h in holdings)})
    return found


def _entry(position: int, job: Job, shown: bool) -> QueueEntry:
    return QueueEntry(
        position=position,
        job_id=job.pk if shown else None,
        name=job.name if shown else None,
        owner=job.owner.get_username() if shown else None,
        priority=job.priority_class.name if job.priority_class is not None else str(job.priority),
        cpu=job.cpu_total,
        gpus=job.gpus_total,
        memory_gb=job.memory_gb_total,
        submitted=job.created,
        reason=job.reason if shown else None,
    )
