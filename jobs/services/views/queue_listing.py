"""The queue as its users see it: every job waiting for room, in the order the scheduler
takes them (jobs.services.scheduler.queue), with why each waits.

Everyone sees the whole queue, because where a job stands depends on the jobs ahead of it, but
not what is not theirs: another user's job shows its place, its size and how long it has
waited, never its name, id, owner or reason (a reason is written for its owner and may name
their other jobs). Administrators see everything.
"""

import dataclasses
from dataclasses import dataclass, field
from datetime import datetime

from django.contrib.auth.models import AnonymousUser, User
from django.utils import timezone

from jobs.access import visible_jobs
from jobs.models import Job
from jobs.services.scheduler.preempt_pass import PreemptionPass
from jobs.services.scheduler.queue import queued_jobs, waiting_in_order
from jobs.services.scheduler.reclaim import Reclaimer


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


def entries(viewer: User | AnonymousUser) -> list[QueueEntry]:
    jobs = waiting_in_order(
        queued_jobs()
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
    all gone yet (preempted by it: jobs.services.scheduler.preempt_pass; or giving its group back
    borrowed capacity: jobs.services.scheduler.reclaim)."""
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
