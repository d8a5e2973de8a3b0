"""The one place that writes job and replica state.

Job:      pending -> queued -> running -> succeeded | failed | cancelled
          (queued -> failed | cancelled too; a job fails as soon as one replica fails)
Replica:  pending -> assigned -> running -> succeeded | failed | stopped
          (pending | assigned -> stopped when the job ends before they run)

Side effects (Celery messages to agents, websocket events, the log's end marker) happen on
commit, so nobody hears of a state that could still roll back.
"""

import logging
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from jobs.models import Job, JobRole, Node, Replica
from jobs.redis_client import get_redis
from jobs.services import dispatch, events
from jobs.services.placement import Demand, Room, gang_never_fits, never_fits, place
from jobs.services.totals import RoleRequest, Totals
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
    events.send_on_commit(job.pk, {"type": "state", "job": job_state_payload(job)})


def job_state_payload(job: Job) -> dict[str, Any]:
    """What websocket clients are told when a job or one of its replicas changes."""
    return {
        "id": job.pk,
        "state": job.state,
        "reason": job.reason,
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
    )
    for role in roles:
        JobRole.objects.create(
            job=job, role=role.role, package=role.package, instances=role.instances
        )
        first = 0 if role.role == "master" else 1
        Replica.objects.bulk_create(
            Replica(job=job, role=role.role, index=i, package=role.package)
            for i in range(first, first + role.instances)
        )
    _set_job_state(job, Job.State.QUEUED, "waiting for room on the nodes")
    return job


# --- placement --------------------------------------------------------------------------------


def live_nodes() -> list[Node]:
    cutoff = timezone.now() - timedelta(seconds=settings.TRAINYARD_NODE_STALE_SECONDS)
    return list(
        Node.objects.select_for_update()
        .filter(state=Node.State.READY, last_heartbeat__gte=cutoff)
        .order_by("name")
    )


def free_rooms(nodes: list[Node]) -> list[Room]:
    rooms = {n.name: Room(n.name, n.cpu, n.gpus, n.memory_gb) for n in nodes}
    held = list(
        Replica.objects.filter(
            state__in=Replica.HOLDING_STATES, node__name__in=list(rooms)
        ).select_related("node", "package")
    )
    for replica, demand in zip(held, demands_of(held), strict=True):
        assert replica.node is not None
        rooms[replica.node.name].take(demand)
    return list(rooms.values())


def demands_of(replicas: list[Replica]) -> list[Demand]:
    return [
        Demand((r.role, r.index), r.package.cpu, r.package.gpus, r.package.memory_gb)
        for r in replicas
    ]


def schedule() -> list[int]:
    """Place waiting jobs in submission order while they fit; returns the ids dispatched.

    Strictly first come, first served: a job that does not fit holds back the ones behind it,
    so a large job is never starved by a stream of small ones.
    """
    dispatched = []
    with transaction.atomic():
        nodes = live_nodes()  # locks the node rows: one scheduler at a time
        rooms = free_rooms(nodes)
        # A subquery, not a join with DISTINCT: PostgreSQL refuses FOR UPDATE with DISTINCT.
        unplaced = Replica.objects.filter(state=Replica.State.PENDING).values("job_id")
        waiting = (
            Job.objects.select_for_update()
            .filter(state=Job.State.QUEUED, pk__in=unplaced)
            .order_by("created", "id")
        )
        for job in waiting:
            replicas = list(
                job.replicas.filter(state=Replica.State.PENDING).select_related("package")
            )
            assignment = place(demands_of(replicas), rooms)
            if assignment is None:
                reason = (
                    "waiting for a node agent to register"
                    if not nodes
                    else "waiting for room on the nodes"
                )
                if job.reason != reason:
                    _set_job_state(job, Job.State.QUEUED, reason)
                break
            by_name = {n.name: n for n in nodes}
            for replica in replicas:
                replica.node = by_name[assignment[(replica.role, replica.index)]]
                replica.state = Replica.State.ASSIGNED
            Replica.objects.bulk_update(replicas, ["node", "state"])
            by_room = {room.node: room for room in rooms}
            for demand in demands_of(replicas):  # keep `rooms` true for the jobs behind
                by_room[assignment[demand.key]].take(demand)
            placed = sorted({r.node.name for r in replicas if r.node is not None})
            _set_job_state(job, Job.State.QUEUED, f"starting on {', '.join(placed)}")
            specs = dispatch.build_specs(job)
            job_id = job.pk
            transaction.on_commit(lambda j=job_id, s=specs: dispatch.send_starts(j, s))  # type: ignore[misc]
            dispatched.append(job_id)
    return dispatched


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
        if job.state == Job.State.QUEUED:
            if not job.replicas.exclude(state=Replica.State.RUNNING).exists():
                _set_job_state(job, Job.State.RUNNING, "")
            else:
                events.send_on_commit(job.pk, {"type": "state", "job": job_state_payload(job)})


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
            transaction.on_commit(lambda: dispatch.send_stops(job_id, stop_nodes, reason_text))
        _complete_log_if_done(job)
        events.send_on_commit(job.pk, {"type": "state", "job": job_state_payload(job)})
    # Capacity was freed: let waiting jobs in.
    transaction.on_commit(schedule)


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
            transaction.on_commit(lambda: dispatch.send_stops(job_id, nodes, "cancelled"))
        _complete_log_if_done(job)
    transaction.on_commit(schedule)
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
    end_reason = f"job {job.state}" + (f": {job.reason.splitlines()[0]}" if job.reason else "")
    transaction.on_commit(lambda: LogSink(get_redis()).append_end(job.pk, end_reason))


# --- nodes ------------------------------------------------------------------------------------


def node_heartbeat(payload: dict[str, Any]) -> None:
    """Register or refresh a node from its agent's heartbeat; a new node may admit jobs."""
    name = str(payload["node"])
    with transaction.atomic():
        node, created = Node.objects.select_for_update().get_or_create(
            name=name,
            defaults={
                "address": payload["address"],
                "cpu": payload["cpus"],
                "gpus": payload["gpus"],
                "gpu_model": payload.get("gpu_model", ""),
                "memory_gb": payload["memory_gb"],
                "last_heartbeat": timezone.now(),
            },
        )
        was_stale = (
            created
            or node.last_heartbeat is None
            or (
                timezone.now() - node.last_heartbeat
                > timedelta(seconds=settings.TRAINYARD_NODE_STALE_SECONDS)
            )
        )
        if not created:
            node.address = payload["address"]
            node.last_heartbeat = timezone.now()
            node.save(update_fields=["address", "last_heartbeat"])
        if was_stale:
            transaction.on_commit(schedule)


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
