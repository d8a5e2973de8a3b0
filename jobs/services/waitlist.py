"""The waiting jobs as a scheduling pass reads them: plain values, in two queries.

A pass looks at every waiting job, and at a thousand nodes there are ten thousand of them
(issue 24). Read as model instances, with their replicas and packages, they cost 30,000 objects
and as many JSON decodings per pass, far more than the pass's own work. Here each job is the
few values placement, the queue order, preemption and backfill read, its unplaced instances'
demands folded in; the job is read whole, and locked, only when it is placed.
"""

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import connections
from django.db.models import QuerySet
from django.db.models.sql.constants import MULTI

from jobs.models import Job, Replica
from jobs.services.placement import Demand
from jobs.services.queue_order import ORDER_BY


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
    borrowed: bool
    demands: list[Demand] = field(default_factory=list)  # its charged unplaced instances
    # Its demands sorted, as (cpu, gpus, memory_gb): jobs of one shape place (or fail) alike.
    shape: tuple[tuple[int, int, int], ...] = ()
    # What decides its fate in a pass but for its own identity: two jobs alike meet the same
    # rooms, ledger, reservation and preemption choices the same way.
    alike: tuple[object, ...] = ()

    def demands_known(self) -> None:
        self.shape = tuple(sorted((d.cpu, d.gpus, d.memory_gb) for d in self.demands))
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
    "priority_class_id", "preempted_by", "time_limit", "borrowed",
)  # fmt: skip


def waiting_jobs() -> list[WaitingJob]:
    """Queued jobs not yet placed, by priority then submission (queue_order.ORDER_BY): the
    database's part of the queue's order, which `queue.in_order` completes with fair share."""
    unplaced = Replica.objects.filter(state=Replica.State.PENDING).values("job_id")
    found: dict[int, WaitingJob] = {}
    rows = Job.objects.filter(state=Job.State.QUEUED, pk__in=unplaced).order_by(*ORDER_BY)
    aware = _to_aware(rows.db)
    for pk, owner, created, reason, excluded, priority, pclass, by, limit, borrowed in _rows(
        rows.values_list(*JOB_FIELDS)
    ):
        found[pk] = WaitingJob(
            pk, owner, aware(created), reason, _names(excluded), priority, pclass, _ids(by),
            limit, bool(borrowed),
        )  # fmt: skip
    demands = (
        Replica.objects.filter(
            state=Replica.State.PENDING, job__state=Job.State.QUEUED, package__isnull=False
        )
        .order_by("id")
        .values_list("job_id", "role", "index", "package__cpu", "package__gpus",
                     "package__memory_gb")
    )  # fmt: skip
    for job_id, role, index, cpu, gpus, memory_gb in _rows(demands):
        job = found.get(job_id)
        if job is not None:  # queued after the first query: the next pass takes it
            job.demands.append(Demand((role, index), cpu, gpus, memory_gb))
    for job in found.values():
        job.demands_known()
    return list(found.values())


def _rows(query: "QuerySet[Any]") -> list[tuple[Any, ...]]:
    """The query's rows as the database driver returns them: Django's per-value converters
    (a JSON decoding, a date parsed in Python) cost more than the pass's own work; the few
    values that need one are converted here."""
    compiler = query.query.get_compiler(query.db)
    rows: list[tuple[Any, ...]] = []
    for chunk in compiler.execute_sql(MULTI):
        rows.extend(chunk)
    return rows


def _names(value: Any) -> tuple[str, ...]:
    """A JSON list column (text on SQLite and PostgreSQL alike), decoded only when not empty:
    it almost always is."""
    if value == "[]" or not value:
        return ()
    return tuple(json.loads(value) if isinstance(value, str) else value)


def _ids(value: Any) -> tuple[int, ...]:
    return () if value == "[]" or not value else tuple(map(int, _names(value)))


def _to_aware(database: str) -> Callable[[Any], datetime]:
    """A date column's value as the model has it: PostgreSQL's driver gives it so, SQLite's
    gives naive UTC (the connection's zone), or text."""
    connection = connections[database]
    zone = connection.timezone

    def aware(value: Any) -> datetime:
        if isinstance(value, datetime):
            return value if value.tzinfo is not None else value.replace(tzinfo=zone)
        converted = connection.ops.convert_datetimefield_value(  # type: ignore[attr-defined]
            value, Job._meta.get_field("created"), connection
        )
        assert isinstance(converted, datetime)
        return converted

    return aware
