"""Placing waiting jobs on the nodes, first come first served with backfill.

`schedule()` runs in the console worker (the `schedule` task, and every reconciliation pass),
never on a user's request: it takes the node rows' locks (on SQLite, the database's one write
lock) for as long as placement takes, and a submission should not wait for that.
"""

import json
import logging
from collections.abc import Callable
from datetime import timedelta
from typing import NamedTuple

from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.db.models import BooleanField, ExpressionWrapper, Q, TextField
from django.db.models.functions import Cast
from django.utils import timezone
from redis import RedisError

from console.celery import app
from jobs.access import visible_jobs
from jobs.models import Job, Node, Replica
from jobs.redis_client import get_redis
from jobs.services import dispatch, queue, transitions
from jobs.services.placement import Demand, Room, gang_never_fits, never_fits, place
from jobs.services.totals import RoleRequest
from jobs.services.waiting import Holding, NodeView, jobs_in_words, why_waiting
from workers import contract

log = logging.getLogger(__name__)


def request_schedule() -> None:
    """Ask the console worker to run `schedule()` once this transaction commits."""
    transaction.on_commit(_send_schedule_task, robust=True)


# While a schedule request is on its way and its pass has not started, another request adds
# nothing: that pass will see what the newer one would. 1,000 nodes coming back at once asked
# for 1,000 passes (issue 24). schedule() clears the mark before it reads anything, so a
# request made during a pass sends a new one. Should the task be lost, the mark expires.
SCHEDULE_REQUESTED_KEY = "trainyard:console:schedule-requested"
SCHEDULE_REQUESTED_SECONDS = 30


def _send_schedule_task() -> None:
    try:
        if not get_redis().set(SCHEDULE_REQUESTED_KEY, "1", nx=True, ex=SCHEDULE_REQUESTED_SECONDS):
            return  # a request is on its way already
    except (RedisError, ImproperlyConfigured):
        pass  # cannot tell: ask anyway
    app.send_task(contract.TASK_SCHEDULE, queue=contract.CONSOLE_QUEUE)


def _requests_answered() -> None:
    """The pass starting now answers every request made so far."""
    try:
        get_redis().delete(SCHEDULE_REQUESTED_KEY)
    except (RedisError, ImproperlyConfigured):
        pass  # the mark expires by itself


def ready_nodes(nodes: list[Node]) -> list[Node]:
    """Nodes that take new work: not drained, heard from recently, with an agent recent enough
    and room on its disk, and isolated where the console asks for it (Node.status says which)."""
    return [n for n in nodes if n.status == Node.State.READY]


def holdings(nodes: list[Node]) -> list[Holding]:
    """What each active job holds on each of these nodes (per replica, summed per job)."""
    per: dict[tuple[int, str], Holding] = {}
    # Plain values, not model instances: at 1,000 nodes a pass read 10,000 replicas with
    # their nodes and packages as objects (issue 24).
    held = Replica.objects.filter(
        state__in=Replica.HOLDING_STATES, node__in=nodes, package__isnull=False
    ).values_list(  # the platform's own roles hold nothing
        "job_id", "node__name", "package__cpu", "package__gpus", "package__memory_gb"
    )
    for job_id, node, cpu, gpus, memory_gb in held:
        old = per.get((job_id, node), Holding(job_id, node, 0, 0, 0))
        per[(job_id, node)] = Holding(
            job_id, node, old.cpu + cpu, old.gpus + gpus, old.memory_gb + memory_gb
        )
    return list(per.values())


def free_rooms(nodes: list[Node], held: list[Holding]) -> list[Room]:
    rooms = {n.name: Room(n.name, n.cpu, n.gpus, n.memory_gb) for n in nodes}
    for h in held:
        if h.node in rooms:
            rooms[h.node].take(Demand(("held", h.job_id), h.cpu, h.gpus, h.memory_gb))
    return list(rooms.values())


def demands_of(replicas: list[Replica]) -> list[Demand]:
    """What each charged replica needs; the platform's own roles need nothing."""
    return [
        Demand((r.role, r.index), r.package.cpu, r.package.gpus, r.package.memory_gb)
        for r in replicas
        if r.package is not None
    ]


class WaitingJob(NamedTuple):
    """What a pass needs of a job waiting to be placed, read as plain values: 10,000 waiting
    jobs read as model instances (with their replicas and packages) made a pass that places
    nothing take a second (issue 24). A job about to be placed is read again whole, locked."""

    pk: int
    # Whether it has waited past TRAINYARD_BACKFILL_GRACE_SECONDS, worked out by the database:
    # converting 10,000 timestamps into datetimes took a tenth of a pass.
    waited_past_grace: bool
    owner_id: int
    reason: str
    excluded_nodes: tuple[str, ...]
    replica_ids: tuple[int, ...]  # its pending replicas, as read
    demands: tuple[Demand, ...]  # what its charged replicas need

    @property
    def shape(self) -> tuple[tuple[int, int, int], ...]:
        return tuple(sorted((d.cpu, d.gpus, d.memory_gb) for d in self.demands))


def waiting_jobs() -> list[WaitingJob]:
    """Queued jobs not yet placed, first come first served. Nothing is locked: schedule()
    locks a job only when it places it, and checks then that it still waits as read."""
    grace = timedelta(seconds=settings.TRAINYARD_BACKFILL_GRACE_SECONDS)
    rows = (
        queue.waiting_in_order()  # the queue's one order, as its page and positions show it
        .annotate(
            past_grace=ExpressionWrapper(
                Q(created__lt=timezone.now() - grace), output_field=BooleanField()
            ),
            # As text: nearly every job excludes no node, and decoding 10,000 "[]" costs.
            excluded_text=Cast("excluded_nodes", output_field=TextField()),
        )
        .values_list("id", "past_grace", "owner_id", "reason", "excluded_text")
    )
    replica_ids: dict[int, list[int]] = {}
    demands: dict[int, list[Demand]] = {}
    # Demands are values: the many alike (master 0 of a one-core job...) share one object.
    alike: dict[tuple[str, int, int, int, int], Demand] = {}
    for replica_id, job_id, role, index, cpu, gpus, memory_gb in (
        Replica.objects.filter(state=Replica.State.PENDING, job__state=Job.State.QUEUED)
        .order_by("id")
        .values_list("id", "job_id", "role", "index",
                     "package__cpu", "package__gpus", "package__memory_gb")
    ):  # fmt: skip
        replica_ids.setdefault(job_id, []).append(replica_id)
        if cpu is not None:  # the platform's own roles (no package) need nothing
            demand = alike.get((role, index, cpu, gpus, memory_gb))
            if demand is None:
                demand = Demand((role, index), cpu, gpus, memory_gb)
                alike[(role, index, cpu, gpus, memory_gb)] = demand
            demands.setdefault(job_id, []).append(demand)
    return [
        WaitingJob(
            pk,
            bool(past_grace),
            owner_id,
            reason,
            tuple(json.loads(excluded)) if excluded not in (None, "[]") else (),
            replica_ids=tuple(replica_ids.get(pk, ())),
            demands=tuple(demands.get(pk, ())),
        )
        for pk, past_grace, owner_id, reason, excluded in rows
    ]


def _lock_if_unchanged(waiting: WaitingJob) -> tuple[Job, list[Replica]] | None:
    """The job and its pending replicas, the job's row locked, if it still waits as `waiting`
    read it; None if it moved meanwhile (cancelled, say): the next pass sees it as it is."""
    job = Job.objects.select_for_update().filter(pk=waiting.pk, state=Job.State.QUEUED).first()
    if job is None:
        return None
    replicas = list(
        Replica.objects.filter(job=job, state=Replica.State.PENDING)
        .select_related("package")
        .order_by("id")
    )
    if tuple(r.pk for r in replicas) != waiting.replica_ids:
        return None
    return job, replicas


def schedule() -> list[int]:
    """Place waiting jobs in submission order; returns the ids dispatched.

    A job that does not fit now does not hold back smaller jobs behind it that do (backfill),
    unless it has waited longer than TRAINYARD_BACKFILL_GRACE_SECONDS: from then on the queue
    is strictly first come, first served until it starts, so a large job is never starved.
    """
    dispatched: list[int] = []
    _requests_answered()
    if not Replica.objects.filter(
        state=Replica.State.PENDING, job__state=Job.State.QUEUED
    ).exists():
        return dispatched  # nothing waits: no need for the write lock
    with transaction.atomic():
        # Locking the node rows makes schedulers take turns.
        # Not what each agent said it runs (a list per node, decoded for nothing at 1,000
        # nodes): the reconciler reads those.
        nodes = list(
            Node.objects.select_for_update().defer("running", "finished", "labels").order_by("name")
        )
        usable = ready_nodes(nodes)
        held = holdings(nodes)
        rooms = free_rooms(usable, held)
        views = [
            NodeView(n.name, n.cpu, n.gpus, n.memory_gb, n.status, n.status_reason) for n in nodes
        ]
        blocker: WaitingJob | None = None
        waiting = waiting_jobs()
        # Until something is placed the rooms stay as they are, so jobs of one owner with the
        # same demands and exclusions wait for the same reason: worked out once per pass, not
        # once per job (10,000 waiting jobs are mostly a few shapes; issue 24).
        reasons: dict[tuple[object, ...], str] = {}
        # The reasons that changed, written together at the end: a pass that places nothing
        # writes nothing when nothing changed.
        new_reasons: dict[int, str] = {}
        for job in waiting:
            demands = list(job.demands)
            if blocker is not None and blocker.waited_past_grace:
                key: tuple[object, ...] = ("behind", blocker.pk, job.owner_id)
                if key not in reasons:
                    behind = jobs_in_words([blocker.pk], _visible_to(job.owner_id))
                    reasons[key] = f"waiting behind {behind}, which has waited longest"
                _note_reason(new_reasons, job, reasons[key])
                continue
            # A restarted job may stay away from the nodes its earlier attempts failed on.
            allowed = (
                [room for room in rooms if room.node not in job.excluded_nodes]
                if job.excluded_nodes
                else rooms
            )
            key = ("unplaced", job.shape, job.excluded_nodes, job.owner_id)
            assignment = None if key in reasons else place(demands, allowed)
            if assignment is None:
                if key not in reasons:
                    why = why_waiting(demands, allowed, views, held, _visible_to(job.owner_id))
                    if job.excluded_nodes:
                        why += f" ({', '.join(job.excluded_nodes)} excluded after failures)"
                    reasons[key] = why
                _note_reason(new_reasons, job, reasons[key])
                blocker = blocker or job
                continue
            locked = _lock_if_unchanged(job)
            if locked is None:
                continue  # it moved since it was read; the rooms are as they were
            placed_job, replicas = locked
            reasons.clear()  # the rooms change now
            by_name = {n.name: n for n in usable}
            by_room = {room.node: room for room in rooms}
            for demand in demands:
                by_room[assignment[demand.key]].take(demand)  # keep `rooms` true for the rest
                held.append(
                    Holding(
                        job.pk, assignment[demand.key], demand.cpu, demand.gpus, demand.memory_gb
                    )
                )
            for replica in replicas:
                # The scheduler goes where server-0 goes: it only coordinates.
                key = ("server", 0) if replica.package is None else (replica.role, replica.index)
                replica.node = by_name[assignment[key]]
            transitions.place_replicas(replicas, sent=timezone.now())
            placed = sorted({r.node.name for r in replicas if r.node is not None})
            transitions.set_job_reason(placed_job, f"starting on {', '.join(placed)}")
            specs = dispatch.build_specs(placed_job)
            job_id = job.pk
            transaction.on_commit(
                lambda j=job_id, s=specs: dispatch.send_starts(j, s),  # type: ignore[misc]
                robust=True,
            )
            dispatched.append(job_id)
        transitions.set_waiting_reasons(new_reasons)
    return dispatched


def _note_reason(new_reasons: dict[int, str], job: WaitingJob, reason: str) -> None:
    if job.reason != reason:
        new_reasons[job.pk] = reason


def _visible_to(owner_id: int) -> Callable[[list[int]], set[int]]:
    """Which of some job ids the owner `owner_id` may see: a reason names no one else's job.
    The owner is read only when a reason names jobs at all."""

    def pick(job_ids: list[int]) -> set[int]:
        owner = User.objects.get(pk=owner_id)
        return set(visible_jobs(owner).filter(pk__in=job_ids).values_list("pk", flat=True))

    return pick


def why_never_placeable(roles: list[RoleRequest]) -> dict[str, str]:
    """Why the request could not start even on empty nodes, by field; {} when it could.

    Judged against the nodes that are not draining; with no node known yet nothing is judged
    (agents may still be starting), and the job waits instead.
    """
    # Plain values: a submission read 1,000 node rows whole, with what each runs (issue 24).
    capacities = [
        Room(*row)
        for row in Node.objects.exclude(state=Node.State.DRAINING).values_list(
            "name", "cpu", "gpus", "memory_gb"
        )
    ]
    if not capacities:
        return {}
    total = sum(c.cpu for c in capacities), sum(c.gpus for c in capacities)
    problems: dict[str, str] = {}
    for role in roles:
        p = role.package
        if never_fits([Demand((role.role, 0), p.cpu, p.gpus, p.memory_gb)], capacities):
            problems[f"roles.{role.role}.package"] = (
                f"No node can hold {p.name!r} ({p.summary}), so it could never start."
            )
    if problems:
        return problems
    demands = [
        Demand((r.role, i), r.package.cpu, r.package.gpus, r.package.memory_gb)
        for r in roles
        for i in range(r.instances)
    ]
    if gang_never_fits(demands, capacities):
        problems["roles"] = (
            f"The {len(demands)} instances could never all run at once: the {len(capacities)} "
            f"nodes hold {total[0]} CPU cores and {total[1]} GPUs in all. Use fewer instances."
        )
    return problems
