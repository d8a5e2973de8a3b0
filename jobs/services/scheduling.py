"""Placing waiting jobs on the nodes: higher priority first, then first come first served,
with backfill, and preemption for the classes that may preempt.

`schedule()` runs in the console worker (the `schedule` task, and every reconciliation pass),
never on a user's request: it takes the node rows' locks (on SQLite, the database's one write
lock) for as long as placement takes, and a submission should not wait for that.
"""

import logging
from collections.abc import Callable
from datetime import datetime, timedelta

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.utils import timezone
from redis import RedisError

from console.celery import app
from jobs.access import visible_jobs
from jobs.models import Job, Node, Replica
from jobs.redis_client import get_redis
from jobs.services import borrowing, dispatch, queue, time_limits, transitions
from jobs.services.backfill import Backfill, Reservation
from jobs.services.placement import Demand, Room, gang_never_fits, never_fits, place
from jobs.services.preempt_pass import PreemptionPass
from jobs.services.reclaim import Reclaimer
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


def waiting_jobs() -> list[Job]:
    """Queued jobs not yet placed, in the queue's order (jobs.services.queue.in_order):
    higher priority first, then fair share, then first come, first served."""
    unplaced = Replica.objects.filter(state=Replica.State.PENDING).values("job_id")
    # A subquery, not a join with DISTINCT: PostgreSQL refuses FOR UPDATE with DISTINCT.
    return queue.in_order(
        list(
            Job.objects.select_for_update()
            .filter(state=Job.State.QUEUED, pk__in=unplaced)
            .order_by("created", "id")
            # What placing needs, not the program, env and rules of 10,000 jobs: a job placed is
            # read again whole for its start messages.
            .only(
                "id",
                "created",
                "owner_id",
                "state",
                "reason",
                "excluded_nodes",
                "borrowed",
                "priority",
                "priority_class_id",
                "preempted_by",
                "time_limit",
            )
        )
    )


def schedule() -> list[int]:
    """Place waiting jobs in the queue's order; returns the ids dispatched.

    A job that does not fit and whose priority class may preempt evicts the running jobs
    jobs.services.preemption chooses, and the room they free is reserved for it until they
    have stopped and it starts (jobs.services.preempt_pass). A job that does not fit now does
    not hold back smaller jobs behind it that do (backfill). When the running jobs' time limits
    say when the first such job can start, that start is reserved and a later job may start
    first only if that cannot delay it (EASY backfill, jobs.services.backfill). When they do
    not, the grace rule holds: once that job has waited longer than
    TRAINYARD_BACKFILL_GRACE_SECONDS the queue is strictly first come, first served until it
    starts, so a large job is never starved.
    """
    dispatched: list[int] = []
    _requests_answered()
    if not Replica.objects.filter(
        state=Replica.State.PENDING, job__state=Job.State.QUEUED
    ).exists():
        return dispatched  # nothing waits: no need for the write lock
    with transaction.atomic():
        # Locking the node rows makes schedulers take turns.
        nodes = list(Node.objects.select_for_update().order_by("name"))
        usable = ready_nodes(nodes)
        held = holdings(nodes)
        rooms = free_rooms(usable, held)
        views = [
            NodeView(n.name, n.cpu, n.gpus, n.memory_gb, n.status, n.status_reason) for n in nodes
        ]
        grace = timedelta(seconds=settings.TRAINYARD_BACKFILL_GRACE_SECONDS)
        now = timezone.now()
        easy = Backfill(
            now,
            held,
            time_limits.expected_ends(now),
            time_limits.stop_grace(),
        )
        blocker: Job | None = None
        waiting = waiting_jobs()
        unplaced: dict[int, list[Replica]] = {job.pk: [] for job in waiting}
        for replica in (
            Replica.objects.filter(job__in=waiting, state=Replica.State.PENDING)
            .select_related("package")
            .only("id", "job_id", "role", "index", "state", "node_id",
                  "package__id", "package__cpu", "package__gpus", "package__memory_gb")
            .order_by("id")
        ):  # fmt: skip
            unplaced[replica.job_id].append(replica)
        # Until something is placed the rooms stay as they are, so jobs of one owner with the
        # same demands and exclusions wait for the same reason: worked out once per pass, not
        # once per job (10,000 waiting jobs are mostly a few shapes; issue 24).
        reasons: dict[tuple[object, ...], str] = {}
        preemption = PreemptionPass(held, timezone.now())
        # Fair share with borrowing: each group's share and use, and reclaim (read lazily).
        ledger = borrowing.Ledger.read((h.job_id, h.cpu, h.gpus, h.memory_gb) for h in held)
        reclaimer = Reclaimer(held, timezone.now())
        reserved = queue.reserved_lenders()
        for job in waiting:
            replicas = unplaced[job.pk]
            demands = demands_of(replicas)
            need = borrowing.need_of(
                sum(d.cpu for d in demands),
                sum(d.gpus for d in demands),
                sum(d.memory_gb for d in demands),
            )
            verdict = ledger.judge(job.owner_id, need)
            if verdict.wait is not None:
                # Its group is at its borrowing limit: room on the nodes would not help, so it
                # holds no one back.
                transitions.set_job_reason(job, verdict.wait)
                continue
            if (
                blocker is not None
                and easy.reservation is None
                and timezone.now() - blocker.created > grace
            ):
                key: tuple[object, ...] = ("behind", blocker.pk, job.owner_id)
                if key not in reasons:
                    behind = jobs_in_words([blocker.pk], _visible_to(job))
                    reasons[key] = f"waiting behind {behind}, which has waited longest"
                transitions.set_job_reason(job, reasons[key])
                continue
            # A restarted job may stay away from the nodes its earlier attempts failed on.
            allowed = (
                [room for room in rooms if room.node not in job.excluded_nodes]
                if job.excluded_nodes
                else rooms
            )
            shape = tuple(sorted((d.cpu, d.gpus, d.memory_gb) for d in demands))
            key = ("unplaced", shape, tuple(job.excluded_nodes), job.owner_id)
            assignment = None if key in reasons else place(demands, allowed)
            if assignment is not None and easy.reservation is not None:
                limit = _limit_of(job)
                held_back = ("held back", shape, tuple(job.excluded_nodes), limit, job.owner_id)
                if held_back not in reasons:
                    assignment = easy.admits(demands, allowed, assignment, limit)
                if held_back in reasons or assignment is None:
                    reasons.setdefault(held_back, _held_back(easy.reservation, now, job))
                    transitions.set_job_reason(job, reasons[held_back])
                    continue
            if assignment is None and preemption.may_preempt(job):
                # Jobs alike find no victims alike, until the rooms change (as `reasons`).
                alike = ("no victims", key, job.priority, tuple(job.preempted_by))
                made = None
                if alike not in reasons or preemption.has_victims_stopping(job):
                    made = preemption.make_room(job, demands, allowed, _visible_to(job))
                if made is not None:
                    reasons.clear()  # the rooms changed: room is reserved for this job
                    transitions.set_job_reason(job, made.reason)
                    blocker = blocker or job
                    continue
                reasons[alike] = ""
            if assignment is None and verdict.lender is not None:
                lender = verdict.lender
                why = reclaimer.make_room(
                    job,
                    demands,
                    allowed,
                    lender,
                    ledger.outside(lender),
                    _visible_to(job),
                )
                if why is not None:
                    reasons.clear()  # the rooms changed: room is reserved for this job
                    ledger.take(job.owner_id, need)  # its group's share counts it already
                    transitions.set_job_reason(job, why)
                    blocker = blocker or job
                    continue
            if assignment is None:
                if key not in reasons:
                    why = why_waiting(demands, allowed, views, held, _visible_to(job))
                    if job.excluded_nodes:
                        why += f" ({', '.join(job.excluded_nodes)} excluded after failures)"
                    reasons[key] = why
                reason = reasons[key]
                if blocker is None:
                    blocker = job
                    reservation = easy.reserve(job.pk, demands, allowed)
                    if reservation is not None:
                        reason = f"{reason}; {reservation.in_words(now)}"
                transitions.set_job_reason(job, reason)
                continue
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
            ledger.take(job.owner_id, need)
            transitions.mark_borrowed(job, verdict.borrowing)
            if job.pk in reserved:
                transitions.lender_started(job.pk)
            placed = sorted({r.node.name for r in replicas if r.node is not None})
            borrowed = " on borrowed capacity" if verdict.borrowing else ""
            transitions.set_job_reason(job, f"starting on {', '.join(placed)}{borrowed}")
            specs = dispatch.build_specs(Job.objects.get(pk=job.pk))
            job_id = job.pk
            transaction.on_commit(
                lambda j=job_id, s=specs: dispatch.send_starts(j, s),  # type: ignore[misc]
                robust=True,
            )
            dispatched.append(job_id)
    return dispatched


def _limit_of(job: Job) -> timedelta | None:
    return None if job.time_limit is None else timedelta(seconds=job.time_limit)


def _held_back(reservation: Reservation, now: datetime, job: Job) -> str:
    """Why a job that fits now waits: it would delay the head's reserved start."""
    head = jobs_in_words([reservation.job_id], _visible_to(job))
    return (
        f"waiting so as not to delay {head}, {reservation.in_words(now)} (a job whose time "
        "limit ends it before then may start now)"
    )


def _visible_to(job: Job) -> Callable[[list[int]], set[int]]:
    """Which of some job ids the owner of `job` may see: a reason names no one else's job."""

    def pick(job_ids: list[int]) -> set[int]:
        return set(visible_jobs(job.owner).filter(pk__in=job_ids).values_list("pk", flat=True))

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
