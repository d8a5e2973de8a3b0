"""Node agents' heartbeats: register or refresh nodes, and notice an agent that restarted.

Heartbeats are written in batches (jobs/services/heartbeat_batch.py gathers them): one
transaction reads and locks every node a batch names, in the order of their names (two console
workers' batches never wait on each other in a cycle), applies each heartbeat in the order it
arrived exactly as if it were written alone, and writes each node once.
"""

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connections, models, router, transaction
from django.utils import timezone

from jobs.models import Job, Node, Replica
from jobs.services.lifecycle import schedule_requests
from workers import contract

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Beat:
    """What one heartbeat says, checked and converted (beat_of) before any database work, so
    that a malformed payload is refused on its own and never spoils a batch."""

    name: str
    address: str
    reported_cpu: int
    reported_gpus: int
    reported_memory_gb: int
    incarnation: str
    sent: float
    gpu_model: str
    isolation: str
    isolation_reason: str
    limits: str
    limits_reason: str
    protocol: int
    disk_full: str
    running: list[Any]
    finished: list[Any]


def beat_of(payload: dict[str, Any]) -> Beat:
    """A heartbeat's payload as a Beat; raises KeyError, TypeError or ValueError where a field
    is missing or nonsense."""
    return Beat(
        name=str(payload["node"]),
        address=str(payload["address"]),
        reported_cpu=int(payload["cpus"]),
        reported_gpus=int(payload["gpus"]),
        reported_memory_gb=int(payload["memory_gb"]),
        incarnation=str(payload.get("incarnation", "")),
        sent=float(payload.get("sent") or 0.0),
        gpu_model=str(payload.get("gpu_model", "")),
        isolation=str(payload.get("isolation", ""))[:30],
        isolation_reason=str(payload.get("isolation_reason", ""))[:300],
        limits=str(payload.get("limits", ""))[:30],
        limits_reason=str(payload.get("limits_reason", ""))[:300],
        protocol=_protocol_of(payload),
        disk_full=str(payload.get("disk_full") or "")[:300],
        running=list(payload.get("running", [])),
        finished=list(payload.get("finished", [])),
    )


def node_heartbeat(payload: dict[str, Any]) -> None:
    """Register or refresh a node from its agent's heartbeat (a batch of one: see
    node_heartbeats). Raises where the payload is malformed or the write fails."""
    for name in _write([beat_of(payload)], timezone.now()):
        _check_restarted(name)


def node_heartbeats(payloads: list[dict[str, Any]]) -> int:
    """Write a batch of heartbeats in one transaction; returns how many were written.

    Never raises for one heartbeat's sake: a malformed payload is logged and left out; where
    the batch's transaction fails (the database locked past its timeout, a value the database
    refuses), the batch is written again one node at a time, so that only the nodes whose own
    write fails lose their heartbeat, each with a log line (the next comes within seconds).
    """
    beats: list[Beat] = []
    for payload in payloads:
        try:
            beats.append(beat_of(payload))
        except (KeyError, TypeError, ValueError) as exc:
            log.warning("left out a malformed heartbeat of node %r: %r", _name_in(payload), exc)
    if not beats:
        return 0
    now = timezone.now()
    restarted: set[str] = set()
    written = 0
    try:
        restarted = _write(beats, now)
        written = len(beats)
    except Exception:
        if len({beat.name for beat in beats}) == 1:
            log.exception("could not write the heartbeat of node %r", beats[0].name)
        else:
            log.warning(
                "could not write a batch of %d heartbeats; writing them one node at a time",
                len(beats), exc_info=True,
            )  # fmt: skip
            for name in sorted({beat.name for beat in beats}):
                own = [beat for beat in beats if beat.name == name]
                try:
                    restarted |= _write(own, now)
                    written += len(own)
                except Exception:
                    log.exception("could not write the heartbeat of node %r", name)
    for name in sorted(restarted):
        try:
            _check_restarted(name)
        except Exception:  # the reconciliation pass checks the node again within seconds
            log.exception("could not check node %r, whose agent started again", name)
    return written


def _name_in(payload: Any) -> str:
    return str(payload.get("node", "")) if isinstance(payload, dict) else ""


def _check_restarted(name: str) -> None:
    from jobs.services import reconcile  # reconcile builds on this module

    reconcile.check_node_now(name)


def _write(beats: list[Beat], now: datetime) -> set[str]:
    """Apply the heartbeats, in order, to the nodes they name, in one transaction; returns the
    nodes whose agent started again, for the caller to check once this has committed.

    The agent's capacity becomes the advertised one unless an admin has set it. A node that is
    new, or back after being lost, may let waiting jobs in. A heartbeat from a new incarnation
    of the agent (it started again) is checked against the database at once: whatever the old
    one ran is gone, and the jobs it belonged to should hear so now, not at the next pass.
    The agent's protocol version and whether its disk is full are kept; a node that takes new
    work again (disk freed, agent upgraded) may let waiting jobs in too. One scheduling pass is
    asked for however many nodes of the batch may let jobs in.
    """
    names = sorted({beat.name for beat in beats})
    restarted: set[str] = set()
    with transaction.atomic():
        # Locked in the order of their names: two workers' batches that share nodes take
        # their locks in the same order, so neither holds one the other waits for first.
        locked = Node.objects.select_for_update().filter(name__in=names).order_by("name")
        nodes = {node.name: node for node in locked.only(*READ_FIELDS)}
        known = set(nodes)  # in the database, or created by an earlier heartbeat of the batch
        changed: dict[str, Node] = {}
        schedule = False
        for beat in beats:
            node = nodes.get(beat.name)
            if node is None:
                node = nodes[beat.name] = Node(name=beat.name, cpu=0, memory_gb=0)
            applied, wants_pass, new_incarnation = _apply(node, beat, beat.name in known, now)
            if applied:
                known.add(beat.name)
                changed[beat.name] = node
                schedule = schedule or wants_pass
                if new_incarnation:
                    restarted.add(beat.name)
        _save(sorted(changed.values(), key=lambda node: node.name))
        if schedule:
            schedule_requests.request_schedule()
    return restarted


# What a batch reads of the nodes it locks: what _apply and Node.status look at, and what a
# heartbeat may leave as it is (an admin's capacity, the previous incarnation's last heartbeat).
# Not the running and finished lists (up to TRAINYARD_HEARTBEAT_MAX_ENTRIES each, decoded for
# nothing: a heartbeat replaces them).
READ_FIELDS = (
    "name", "state", "cpu", "gpus", "memory_gb", "capacity_set_by_admin", "last_heartbeat",
    "heartbeat_sent", "incarnation", "incarnation_since", "previous_heartbeat", "protocol",
    "disk_full", "isolation", "limits",
)  # fmt: skip

# What a heartbeat writes of a node it knows: its other fields (state, labels, whether an admin
# set the capacity) belong to admins and are left as they are.
HEARTBEAT_FIELDS = (
    "address", "gpu_model", "isolation", "isolation_reason", "limits", "limits_reason",
    "protocol", "disk_full",
    "reported_cpu", "reported_gpus", "reported_memory_gb", "cpu", "gpus", "memory_gb",
    "running", "finished", "last_heartbeat", "heartbeat_sent", "incarnation",
    "incarnation_since", "previous_heartbeat",
)  # fmt: skip


def _save(changed: list[Node]) -> None:
    """Write the nodes a batch changed: a new one is inserted; the known ones are updated by one
    statement run for each (executemany: no query built per node, as save() builds one)."""
    known = [node for node in changed if node.pk is not None]
    for node in changed:
        if node.pk is None:
            node.save()
    if not known:
        return
    connection = connections[router.db_for_write(Node)]
    fields = [field for field in Node._meta.concrete_fields if field.name in HEARTBEAT_FIELDS]
    quote = connection.ops.quote_name
    columns = ", ".join(f"{quote(str(field.column))} = %s" for field in fields)
    # Built from the model's own names only; every value is a parameter.
    sql = f"UPDATE {quote(Node._meta.db_table)} SET {columns} WHERE {quote('id')} = %s"  # noqa: S608
    # A text or number is written as the node holds it (beat_of made it one); the rest (JSON,
    # times) as its field converts it for this database, as save() would.
    plain = [isinstance(field, models.CharField | models.IntegerField | models.FloatField)
             for field in fields]  # fmt: skip
    rows = []
    for node in known:
        row = [
            value if is_plain else field.get_db_prep_save(value, connection)
            for field, is_plain in zip(fields, plain, strict=True)
            for value in (getattr(node, field.attname),)
        ]
        rows.append([*row, node.pk])
    with connection.cursor() as cursor:
        cursor.executemany(sql, rows)


def _apply(node: Node, beat: Beat, known: bool, now: datetime) -> tuple[bool, bool, bool]:
    """One heartbeat applied to its node in memory: (whether it was applied, whether the node
    may let waiting jobs in, whether the agent started again)."""
    came_back = not known or node.is_lost(now)
    was_ready = known and node.status == Node.State.READY
    restarted = bool(node.incarnation) and beat.incarnation != node.incarnation
    if not restarted and known and beat.sent and beat.sent <= node.heartbeat_sent:
        return False, False, False  # overtaken by a newer heartbeat of the same agent: stale
    node.heartbeat_sent = beat.sent
    if beat.incarnation != node.incarnation:
        node.previous_heartbeat = node.last_heartbeat
        node.incarnation = beat.incarnation
        node.incarnation_since = now
    node.address = beat.address
    node.gpu_model = beat.gpu_model
    node.isolation = beat.isolation
    node.isolation_reason = beat.isolation_reason
    node.limits = beat.limits
    node.limits_reason = beat.limits_reason
    node.protocol = beat.protocol
    node.disk_full = beat.disk_full
    node.reported_cpu = beat.reported_cpu
    node.reported_gpus = beat.reported_gpus
    node.reported_memory_gb = beat.reported_memory_gb
    if not node.capacity_set_by_admin:
        node.cpu, node.gpus, node.memory_gb = (
            beat.reported_cpu,
            beat.reported_gpus,
            beat.reported_memory_gb,
        )
    node.running = list(beat.running)
    node.finished = list(beat.finished)
    node.last_heartbeat = now
    wants_pass = came_back or (not was_ready and node.status == Node.State.READY)
    return True, wants_pass, restarted


def _protocol_of(payload: dict[str, Any]) -> int:
    """The agent protocol a heartbeat says it speaks: 0 when it says none (an agent older than
    versioning) or nonsense."""
    try:
        return max(0, int(payload.get(contract.PROTOCOL_FIELD) or 0))
    except (TypeError, ValueError):
        return 0


# How long an evicted job's processes have between SIGTERM and SIGKILL to save a checkpoint,
# unless the drain says otherwise (a spot instance's notice is typically 30 s to 2 min).
EVICT_GRACE_SECONDS = 30.0


def drain(names: list[str], evict: bool = False, grace_seconds: float = EVICT_GRACE_SECONDS,
          by: str = "") -> list[int]:  # fmt: skip
    """Send no new work to these nodes; with `evict`, also move the jobs running there.

    An evicted job's processes get SIGTERM (with `grace_seconds` to checkpoint), and the job
    restarts on other nodes as its restart policy says, without using up a restart: the
    failure is the platform's, not the job's. A job whose policy is never fails, saying why.
    Returns the ids of the jobs evicted.
    """
    from jobs.services.lifecycle import outcomes, restarts

    Node.objects.filter(name__in=names).update(state=Node.State.DRAINING)
    if not evict:
        return []
    who = f" by {by}" if by else ""
    evicted = []
    job_ids = (
        Replica.objects.filter(node__name__in=names, state__in=Replica.HOLDING_STATES)
        .values_list("job_id", flat=True)
        .distinct()
    )
    for job_id in sorted(set(job_ids)):
        with transaction.atomic():
            job = outcomes.locked_job(job_id)
            if job is None or job.state not in (Job.State.QUEUED, Job.State.RUNNING):
                continue
            there = sorted(
                set(
                    restarts.current_replicas(job)
                    .filter(node__name__in=names, state__in=Replica.HOLDING_STATES)
                    .values_list("node__name", flat=True)
                )
            )
            if not there:
                continue
            why = f"{', '.join(there)} drained with eviction{who}"
            outcomes.end_attempt(
                job, restarts.Cause.EVICTION, why, "evicted", grace_seconds=grace_seconds
            )
            evicted.append(job_id)
    schedule_requests.request_schedule()
    return evicted


def return_to_service(names: list[str]) -> None:
    Node.objects.filter(name__in=names).update(state=Node.State.READY)
    schedule_requests.request_schedule()
