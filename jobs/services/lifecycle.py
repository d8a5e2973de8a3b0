"""The one place that writes job and replica state.

Job:      pending -> queued -> running -> succeeded | failed | cancelled
          (queued -> failed | cancelled too; a job fails as soon as one replica fails)
Replica:  pending -> assigned -> running -> succeeded | failed | stopped
          (pending | assigned -> stopped when the job ends before they run)

Side effects (Celery messages to agents, websocket events, the log's end marker) happen on
commit, so nobody hears of a state that could still roll back. They are robust hooks: a broker
hiccup after commit is logged, and never turns an accepted change into an error for the caller.
"""

import logging
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from jobs.models import Job, JobRole, Node, Replica
from jobs.redis_client import get_redis
from jobs.services import dispatch, events
from jobs.services.placement import Demand, Room, gang_never_fits, never_fits, place
from jobs.services.totals import RoleRequest, Totals
from jobs.services.waiting import Holding, NodeView, why_waiting
from workers.logsink import LogSink

log = logging.getLogger(__name__)

STDERR_LINES_IN_REASON = 10


class InvalidTransition(Exception):
    """The job is not in a state that allows this; the message says which state it is in."""


def _set_job_state(job: Job, state: str, reason: str | None = None) -> None:
    job.state = state
    now = timezone.now()
    fields = ["state"]
    if reason is not None:
        job.reason = reason
        fields.append("reason")
    if state == Job.State.RUNNING and job.started is None:
        job.started = now
        fields.append("started")
    if state in Job.TERMINAL_STATES:
        job.finished = now
        fields.append("finished")
    job.save(update_fields=fields)
    events.state_changed_on_commit(job.pk, _state_of)


def _state_of(job_id: int) -> dict[str, Any] | None:
    job = Job.objects.filter(pk=job_id).first()
    return job_state_payload(job) if job is not None else None


def job_state_payload(job: Job) -> dict[str, Any]:
    """What websocket clients are told when a job or one of its replicas changes."""
    return {
        "id": job.pk,
        "state": job.state,
        "reason": job.reason,
        "queue_position": queue_position(job),
        "started": job.started.isoformat() if job.started else None,
        "finished": job.finished.isoformat() if job.finished else None,
        "replicas": [
            {
                "role": r.role,
                "index": r.index,
                "tag": r.tag,
                "node": r.node.name if r.node else None,
                "state": r.state,
                "exit_code": r.exit_code,
            }
            for r in job.replicas.select_related("node").order_by("id")
        ],
    }


# --- submission -------------------------------------------------------------------------------


def create_job(
    owner: User,
    name: str,
    image_id: int,
    program: dict[str, str],
    args: list[str],
    roles: list[RoleRequest],
    totals: Totals,
    kvstore: str = "",
    metric_definitions: list[dict[str, str]] | None = None,
) -> Job:
    """Write an admitted job with one replica row per instance, in state queued.

    The caller has checked the quota inside the same transaction.
    """
    job = Job.objects.create(
        owner=owner,
        name=name,
        image_id=image_id,
        program=program,
        args=args,
        state=Job.State.PENDING,
        cpu_total=totals.cpu,
        gpus_total=totals.gpus,
        memory_gb_total=totals.memory_gb,
        price_per_hour=totals.price_per_hour,
        kvstore=kvstore,
        metric_definitions=metric_definitions or [],
    )
    if kvstore:
        # The platform's scheduler: one, uncharged, placed beside server-0.
        Replica.objects.create(job=job, role="scheduler", index=0, package=None)
    for role in roles:
        JobRole.objects.create(
            job=job, role=role.role, package=role.package, instances=role.instances
        )
        # Seed 004's names: [master], [worker-1]... for PyTorch; [server-0], [worker-0]...
        # for parameter-server jobs.
        first = 1 if role.role == "worker" and not kvstore else 0
        Replica.objects.bulk_create(
            Replica(job=job, role=role.role, index=i, package=role.package)
            for i in range(first, first + role.instances)
        )
    _set_job_state(job, Job.State.QUEUED, "waiting for room on the nodes")
    return job


# --- placement --------------------------------------------------------------------------------


def ready_nodes(nodes: list[Node]) -> list[Node]:
    """Nodes that take new work: not drained, and heard from recently."""
    now = timezone.now()
    return [n for n in nodes if n.state == Node.State.READY and not n.is_lost(now)]


def holdings(nodes: list[Node]) -> list[Holding]:
    """What each active job holds on each of these nodes (per replica, summed per job)."""
    per: dict[tuple[int, str], Holding] = {}
    held = Replica.objects.filter(state__in=Replica.HOLDING_STATES, node__in=nodes).select_related(
        "node", "package"
    )
    for r in held:
        assert r.node is not None
        if r.package is None:
            continue  # the platform's own roles hold nothing
        key = (r.job_id, r.node.name)
        old = per.get(key, Holding(r.job_id, r.node.name, 0, 0, 0))
        per[key] = Holding(
            r.job_id,
            r.node.name,
            old.cpu + r.package.cpu,
            old.gpus + r.package.gpus,
            old.memory_gb + r.package.memory_gb,
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
    """Queued jobs not yet placed, first come first served."""
    unplaced = Replica.objects.filter(state=Replica.State.PENDING).values("job_id")
    # A subquery, not a join with DISTINCT: PostgreSQL refuses FOR UPDATE with DISTINCT.
    return list(
        Job.objects.select_for_update()
        .filter(state=Job.State.QUEUED, pk__in=unplaced)
        .order_by("created", "id")
    )


def schedule() -> list[int]:
    """Place waiting jobs in submission order; returns the ids dispatched.

    A job that does not fit now does not hold back smaller jobs behind it that do (backfill),
    unless it has waited longer than TRAINYARD_BACKFILL_GRACE_SECONDS: from then on the queue
    is strictly first come, first served until it starts, so a large job is never starved.
    """
    dispatched = []
    with transaction.atomic():
        # Locking the node rows makes schedulers take turns.
        nodes = list(Node.objects.select_for_update().order_by("name"))
        usable = ready_nodes(nodes)
        held = holdings(nodes)
        rooms = free_rooms(usable, held)
        views = [NodeView(n.name, n.cpu, n.gpus, n.memory_gb, n.status) for n in nodes]
        grace = timedelta(seconds=settings.TRAINYARD_BACKFILL_GRACE_SECONDS)
        blocker: Job | None = None
        waiting = waiting_jobs()
        unplaced: dict[int, list[Replica]] = {job.pk: [] for job in waiting}
        for replica in (
            Replica.objects.filter(job__in=waiting, state=Replica.State.PENDING)
            .select_related("package")
            .order_by("id")
        ):
            unplaced[replica.job_id].append(replica)
        for job in waiting:
            replicas = unplaced[job.pk]
            demands = demands_of(replicas)
            if blocker is not None and timezone.now() - blocker.created > grace:
                _set_reason(job, f"waiting behind job {blocker.pk}, which has waited longest")
                continue
            assignment = place(demands, rooms)
            if assignment is None:
                _set_reason(job, why_waiting(demands, rooms, views, held))
                blocker = blocker or job
                continue
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
                replica.state = Replica.State.ASSIGNED
            Replica.objects.bulk_update(replicas, ["node", "state"])
            placed = sorted({r.node.name for r in replicas if r.node is not None})
            _set_job_state(job, Job.State.QUEUED, f"starting on {', '.join(placed)}")
            specs = dispatch.build_specs(job)
            job_id = job.pk
            transaction.on_commit(
                lambda j=job_id, s=specs: dispatch.send_starts(j, s),  # type: ignore[misc]
                robust=True,
            )
            dispatched.append(job_id)
    return dispatched


def _set_reason(job: Job, reason: str) -> None:
    if job.reason != reason:
        _set_job_state(job, Job.State.QUEUED, reason)


def queue_position(job: Job) -> int | None:
    """1 for the first job waiting for room, 2 for the next...; None when not waiting."""
    if (
        job.state != Job.State.QUEUED
        or not job.replicas.filter(state=Replica.State.PENDING).exists()
    ):
        return None
    unplaced = Replica.objects.filter(state=Replica.State.PENDING).values("job_id")
    ahead = Job.objects.filter(state=Job.State.QUEUED, pk__in=unplaced).filter(
        Q(created__lt=job.created) | Q(created=job.created, pk__lt=job.pk)
    )
    return ahead.count() + 1


# --- reports from agents ----------------------------------------------------------------------


def replica_started(job_id: int, role: str, index: int, node: str) -> None:
    with transaction.atomic():
        job = Job.objects.select_for_update().filter(pk=job_id).first()
        if job is None:
            return
        replica = job.replicas.filter(role=role, index=index, node__name=node).first()
        if replica is None or replica.state != Replica.State.ASSIGNED:
            return  # a repeated or late report: the replica has moved on already
        replica.state = Replica.State.RUNNING
        replica.started = timezone.now()
        replica.save(update_fields=["state", "started"])
        if job.state == Job.State.QUEUED and not (
            job.replicas.exclude(state=Replica.State.RUNNING).exists()
        ):
            _set_job_state(job, Job.State.RUNNING, "")
        events.state_changed_on_commit(job.pk, _state_of)  # the replica changed either way


def replica_exited(
    job_id: int,
    role: str,
    index: int,
    node: str,
    outcome: str,
    exit_code: int | None,
    reason: str,
    stderr_tail: list[str],
) -> None:
    """Record how a replica ended and what that means for its job. Safe to receive twice."""
    stop_nodes: list[str] = []
    with transaction.atomic():
        job = Job.objects.select_for_update().filter(pk=job_id).first()
        if job is None:
            return
        replica = (
            job.replicas.select_related("node")
            .filter(role=role, index=index, node__name=node)
            .first()
        )
        if replica is None or replica.state in Replica.FINAL_STATES:
            return
        replica.state = {
            "succeeded": Replica.State.SUCCEEDED,
            "failed": Replica.State.FAILED,
        }.get(outcome, Replica.State.STOPPED)
        replica.exit_code = exit_code
        replica.finished = timezone.now()
        replica.save(update_fields=["state", "exit_code", "finished"])

        if job.is_active:
            if replica.state == Replica.State.SUCCEEDED:
                if not job.replicas.exclude(state=Replica.State.SUCCEEDED).exists():
                    _set_job_state(job, Job.State.SUCCEEDED, "")
            else:
                # One replica down means the distributed job cannot go on: fail it whole.
                _set_job_state(
                    job, Job.State.FAILED, _failure_reason(replica, node, reason, stderr_tail)
                )
                stop_nodes = [r.node.name for r in dispatch.replicas_holding(job) if r.node]
                _stop_unplaced(job)
        if stop_nodes:
            reason_text = f"{replica.tag} failed"
            transaction.on_commit(
                lambda: dispatch.send_stops(job_id, stop_nodes, reason_text), robust=True
            )
        _complete_log_if_done(job)
        events.state_changed_on_commit(job.pk, _state_of)
    # Capacity was freed: let waiting jobs in.
    transaction.on_commit(schedule, robust=True)


def _failure_reason(replica: Replica, node: str, reason: str, stderr_tail: list[str]) -> str:
    head = f"{replica.tag} on {node}: {reason or 'stopped'}"
    tail = [line for line in stderr_tail if line.strip()][-STDERR_LINES_IN_REASON:]
    if tail:
        return head + "\nlast lines of stderr:\n" + "\n".join(tail)
    return head


# --- cancel -----------------------------------------------------------------------------------


def cancel(job_id: int, by: User) -> Job:
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job_id)
        if not job.is_active:
            raise InvalidTransition(f"Job {job.pk} has already ended ({job.state}).")
        _set_job_state(job, Job.State.CANCELLED, f"cancelled by {by.get_username()}")
        nodes = [r.node.name for r in dispatch.replicas_holding(job) if r.node]
        _stop_unplaced(job)
        if nodes:
            transaction.on_commit(
                lambda: dispatch.send_stops(job_id, nodes, "cancelled"), robust=True
            )
        _complete_log_if_done(job)
    transaction.on_commit(schedule, robust=True)
    return job


def _stop_unplaced(job: Job) -> None:
    job.replicas.filter(state=Replica.State.PENDING).update(
        state=Replica.State.STOPPED, finished=timezone.now()
    )


def _complete_log_if_done(job: Job) -> None:
    """Once a finished job has no process left, append the log's end marker (once)."""
    if job.is_active or job.log_complete:
        return
    if job.replicas.filter(state__in=Replica.HOLDING_STATES).exists():
        return
    job.log_complete = True
    job.save(update_fields=["log_complete"])
    end_reason = log_end_reason(job)
    # If Redis is away now, the log keeper appends the marker later (logarchive).
    transaction.on_commit(lambda: LogSink(get_redis()).append_end(job.pk, end_reason), robust=True)


def log_end_reason(job: Job) -> str:
    """What the log's end marker says: how the job ended, and why."""
    return f"job {job.state}" + (f": {job.reason.splitlines()[0]}" if job.reason else "")


# --- nodes ------------------------------------------------------------------------------------


def node_heartbeat(payload: dict[str, Any]) -> None:
    """Register or refresh a node from its agent's heartbeat.

    The agent's capacity becomes the advertised one unless an admin has set it. A node that is
    new, or back after being lost, may let waiting jobs in.
    """
    name = str(payload["node"])
    reported = {
        "reported_cpu": int(payload["cpus"]),
        "reported_gpus": int(payload["gpus"]),
        "reported_memory_gb": int(payload["memory_gb"]),
    }
    now = timezone.now()
    with transaction.atomic():
        node = Node.objects.select_for_update().filter(name=name).first()
        came_back = node is None or node.is_lost(now)
        if node is None:
            node = Node(name=name, cpu=0, memory_gb=0)
        node.address = str(payload["address"])
        node.gpu_model = str(payload.get("gpu_model", ""))
        for field, value in reported.items():
            setattr(node, field, value)
        if not node.capacity_set_by_admin:
            node.cpu, node.gpus, node.memory_gb = (
                reported["reported_cpu"],
                reported["reported_gpus"],
                reported["reported_memory_gb"],
            )
        node.running = list(payload.get("running", []))
        node.last_heartbeat = now
        node.save()
        if came_back:
            transaction.on_commit(schedule, robust=True)


def why_never_placeable(roles: list[RoleRequest]) -> dict[str, str]:
    """Why the request could not start even on empty nodes, by field; {} when it could.

    Judged against the nodes that are not draining; with no node known yet nothing is judged
    (agents may still be starting), and the job waits instead.
    """
    nodes = list(Node.objects.exclude(state=Node.State.DRAINING))
    if not nodes:
        return {}
    capacities = [Room(n.name, n.cpu, n.gpus, n.memory_gb) for n in nodes]
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
        total = sum(n.cpu for n in nodes), sum(n.gpus for n in nodes)
        problems["roles"] = (
            f"The {len(demands)} instances could never all run at once: the {len(nodes)} "
            f"nodes hold {total[0]} CPU cores and {total[1]} GPUs in all. Use fewer instances."
        )
    return problems
