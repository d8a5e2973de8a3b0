"""The queue as its users see it: every job waiting for room, in the order the scheduler
takes them (jobs.services.scheduler.queue), with why each waits; and the jobs waiting in a
Slurm pool's queue, at the place Slurm gives them (slurm_entries).

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
from jobs.models import Job, JobAttempt
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


@dataclass(frozen=True)
class SlurmQueueEntry:
    pool: str
    place: int | None  # in Slurm's queue of the pool's partition; None: not there yet
    slurm_job_id: str  # "" while it waits to be submitted
    job_id: int | None  # None: the viewer may not see the job
    name: str | None
    owner: str | None
    cpu: int
    gpus: int
    memory_gb: int
    submitted: datetime
    reason: str | None

    @property
    def shown(self) -> bool:
        return self.job_id is not None


def slurm_entries(viewer: User | AnonymousUser) -> list[SlurmQueueEntry]:
    """The jobs of Slurm pools that wait (to be submitted, or in Slurm's queue), by pool and
    Slurm's place, with the same privacy as the console's own queue."""
    waiting = list(
        Job.objects.filter(state=Job.State.QUEUED, slurm_pool__isnull=False)
        .select_related("owner", "slurm_pool")
        .only(
            "id", "name", "owner__username", "slurm_pool__name", "cpu_total", "gpus_total",
            "memory_gb_total", "created", "reason", "attempt",
        )
    )  # fmt: skip
    attempts = {
        (a.job_id, a.number): a
        for a in JobAttempt.objects.filter(job__in=[j.pk for j in waiting]).only(
            "job_id", "number", "slurm_job_id", "slurm_place"
        )
    }
    visible = set(
        visible_jobs(viewer).filter(pk__in=[j.pk for j in waiting]).values_list("pk", flat=True)
    )
    found = []
    for job in waiting:
        attempt = attempts.get((job.pk, job.attempt))
        shown = job.pk in visible
        found.append(
            SlurmQueueEntry(
                pool=job.slurm_pool.name if job.slurm_pool else "",
                place=attempt.slurm_place if attempt else None,
                slurm_job_id=attempt.slurm_job_id if attempt and shown else "",
                job_id=job.pk if shown else None,
                name=job.name if shown else None,
                owner=job.owner.get_username() if shown else None,
                cpu=job.cpu_total,
                gpus=job.gpus_total,
                memory_gb=job.memory_gb_total,
                submitted=job.created,
                reason=job.reason if shown else None,
            )
        )
    found.sort(key=lambda e: (e.pool, e.place is None, e.place or 0, e.submitted))
    return found
