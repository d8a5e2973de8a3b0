"""The waiting jobs as a scheduling pass reads them: plain values.

At a thousand nodes ten thousand jobs wait (issue 24). Read as model instances, with their
replicas and packages, they cost 30,000 objects and as many JSON decodings per pass, far more
than the pass's own work. Here the queue's order is read first from a few integers per job
(`queued`), then the jobs a pass judges, a few hundred at a time (`read`): the few values
placement, preemption and backfill look at, their unplaced instances' demands folded in. A job
is read whole, and locked, only when it is placed.
"""

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

from django.db.models import BooleanField, ExpressionWrapper, Q

from jobs.models import Job, Replica
from jobs.services.placement import Demand
from jobs.services.plain_rows import aware_dates, plain_rows
from jobs.services.scheduler import queue


@dataclass(slots=True)
class WaitingJob:
    """A queued job with instances not yet placed, as of the start of the pass."""

    pk: int
    owner_id: int
    created: datetime
    reason: str
    excluded_nodes: tuple[str, ...]
    priority: int
    priority_class_id: int | None
    preempted_by: tuple[int, ...]
    time_limit: int | None
    one_instance_per_node: bool = False
    demands: list[Demand] = field(default_factory=list)  # its charged unplaced instances
    # An elastic job: `demands` are the instances it needs to start (its minimum), `extra`
    # those it takes as well where they fit (up to its maximum), and `kept` (role, node) where
    # its attempt before ran, tried first (placement.place_elastic).
    min_size: int = 0
    extra: list[Demand] = field(default_factory=list)
    kept: tuple[tuple[str, str], ...] = ()
    # Its demands sorted, as (cpu, gpus, memory_gb, alone): jobs of one shape place (or fail)
    # alike.
    shape: tuple[tuple[object, ...], ...] = ()
    # What decides its fate in a pass but for its own identity: two jobs alike meet the same
    # rooms, ledger, reservation and preemption choices the same way.
    alike: tuple[object, ...] = ()

    def demands_known(self) -> None:
        if self.min_size and len(self.demands) > self.min_size:
            # The workers of the highest indices are the ones it may go without.
            workers = sorted((d for d in self.demands if d.key[0] == "worker"), key=_index)
            self.extra = workers[-(len(self.demands) - self.min_size) :]
            extra = {d.key for d in self.extra}
            self.demands = [d for d in self.demands if d.key not in extra]
        self.shape = tuple(sorted((d.cpu, d.gpus, d.memory_gb, d.alone) for d in self.demands))
        if self.extra:
            # Two elastic jobs place alike only if what they may add, and keep, is alike too.
            more = tuple(sorted((d.cpu, d.gpus, d.memory_gb, d.alone) for d in self.extra))
            self.shape += ((-1, more, self.kept),)
        self.alike = (
            self.owner_id,
            self.shape,
            self.excluded_nodes,
            self.priority,
            self.priority_class_id,
            self.preempted_by,
            self.time_limit,
        )


JOB_FIELDS = (
    "id", "owner_id", "created", "reason", "excluded_nodes", "priority",
    "priority_class_id", "preempted_by", "time_limit", "one_instance_per_node", "min_size",
    "max_size", "attempt",
)  # fmt: skip


# What a waiting job far back in a long queue is told while it only waits for room: the same
# whether a pass judged it or not (scheduling.SchedulingPass.run), so that its reason does not
# change back and forth as cores free and fill.
FAR_BACK = "waiting for room, far back in the queue: the jobs ahead of it go first"


class Queued(NamedTuple):
    """A waiting job as the queue's order reads it, with whether it was told FAR_BACK (a
    tuple: ten thousand are made per pass)."""

    pk: int
    owner_id: int
    priority: int
    told_far_back: bool


def queued(reserved: set[int] | None = None) -> list[Queued]:
    """Every waiting job, in the queue's order (queue.in_order, `reserved` its reserved
    lenders when read already), from a few integers each."""
    told = ExpressionWrapper(Q(reason=FAR_BACK), output_field=BooleanField())
    rows = queue.queued_jobs().annotate(told=told).values_list("id", "owner_id", "priority", "told")
    # The driver's values as they are (a 0 or 1 for `told`): Django's converters, one call
    # per value, were half the cost of reading the order of 10,000 jobs.
    return queue.in_order([Queued(*row) for row in plain_rows(rows)], reserved)


def read(job_ids: list[int]) -> list[WaitingJob]:
    """These waiting jobs whole, as a pass judges them, in the order given; one that left the
    queue since is not among them. Call it with at most a few hundred ids at once."""
    found: dict[int, WaitingJob] = {}
    rows = Job.objects.filter(pk__in=job_ids, state=Job.State.QUEUED)
    aware = aware_dates(rows.db)
    resumed: list[tuple[int, int]] = []  # elastic jobs' (id, attempt before)
    for (
        pk, owner, created, reason, excluded, priority, pclass, by, limit, alone, least, most,
        attempt,
    ) in plain_rows(rows.values_list(*JOB_FIELDS)):  # fmt: skip
        elastic = least < most
        found[pk] = WaitingJob(
            pk, owner, aware(created), reason, _names(excluded), priority, pclass, _ids(by), limit,
            bool(alone), min_size=least if elastic else 0,
        )  # fmt: skip
        if elastic and attempt > 0:
            resumed.append((pk, attempt - 1))
    demands = (
        Replica.objects.filter(
            job_id__in=list(found), state=Replica.State.PENDING, package__isnull=False
        )
        .order_by("id")
        .values_list("job_id", "role", "index", "package__cpu", "package__gpus",
                     "package__memory_gb")
    )  # fmt: skip
    for job_id, role, index, cpu, gpus, memory_gb in plain_rows(demands):
        job = found[job_id]
        job.demands.append(Demand((role, index), cpu, gpus, memory_gb, job.one_instance_per_node))
    if resumed:
        _read_kept(found, resumed)
    jobs = [found[pk] for pk in job_ids if pk in found]
    for job in jobs:
        job.demands_known()
    return jobs


def _index(demand: Demand) -> int:
    return demand.key[1]


def _read_kept(found: dict[int, WaitingJob], resumed: list[tuple[int, int]]) -> None:
    """Where each resumed elastic job's attempt before ran, by role and index."""
    wanted = Q()
    for pk, before in resumed:
        wanted |= Q(job_id=pk, attempt=before)
    rows = (
        Replica.objects.filter(wanted, node__isnull=False, package__isnull=False)
        .order_by("job_id", "role", "index")
        .values_list("job_id", "role", "node__name")
    )
    kept: dict[int, list[tuple[str, str]]] = {}
    for job_id, role, node in plain_rows(rows):
        kept.setdefault(job_id, []).append((role, node))
    for job_id, slots in kept.items():
        found[job_id].kept = tuple(slots)


def _names(value: Any) -> tuple[str, ...]:
    """A JSON list column (text on SQLite and PostgreSQL alike), decoded only when not empty:
    it almost always is."""
    if value == "[]" or not value:
        return ()
    return tuple(json.loads(value) if isinstance(value, str) else value)


def _ids(value: Any) -> tuple[int, ...]:
    return tuple(map(int, _names(value)))
