"""Node agents' heartbeats: register or refresh a node, and notice an agent that restarted."""

from typing import Any

from django.db import transaction
from django.utils import timezone

from jobs.models import Job, Node, Replica
from jobs.services import scheduling
from workers import contract


def node_heartbeat(payload: dict[str, Any]) -> None:
    """Register or refresh a node from its agent's heartbeat.

    The agent's capacity becomes the advertised one unless an admin has set it. A node that is
    new, or back after being lost, may let waiting jobs in. A heartbeat from a new incarnation
    of the agent (it started again) is checked against the database at once: whatever the old
    one ran is gone, and the jobs it belonged to should hear so now, not at the next pass.
    The agent's protocol version and whether its disk is full are kept; a node that takes new
    work again (disk freed, agent upgraded) may let waiting jobs in too.
    """
    name = str(payload["node"])
    reported = {
        "reported_cpu": int(payload["cpus"]),
        "reported_gpus": int(payload["gpus"]),
        "reported_memory_gb": int(payload["memory_gb"]),
    }
    incarnation = str(payload.get("incarnation", ""))
    now = timezone.now()
    with transaction.atomic():
        node = Node.objects.select_for_update().filter(name=name).first()
        came_back = node is None or node.is_lost(now)
        was_ready = node is not None and node.status == Node.State.READY
        if node is None:
            node = Node(name=name, cpu=0, memory_gb=0)
        restarted = bool(node.incarnation) and incarnation != node.incarnation
        sent = float(payload.get("sent") or 0.0)
        if not restarted and node.pk is not None and sent and sent <= node.heartbeat_sent:
            return  # overtaken by a newer heartbeat of the same agent: what it says is stale
        node.heartbeat_sent = sent
        if incarnation != node.incarnation:
            node.previous_heartbeat = node.last_heartbeat
            node.incarnation = incarnation
            node.incarnation_since = now
        node.address = str(payload["address"])
        node.gpu_model = str(payload.get("gpu_model", ""))
        node.isolation = str(payload.get("isolation", ""))[:30]
        node.isolation_reason = str(payload.get("isolation_reason", ""))[:300]
        node.protocol = _protocol_of(payload)
        node.disk_full = str(payload.get("disk_full") or "")[:300]
        for field, value in reported.items():
            setattr(node, field, value)
        if not node.capacity_set_by_admin:
            node.cpu, node.gpus, node.memory_gb = (
                reported["reported_cpu"],
                reported["reported_gpus"],
                reported["reported_memory_gb"],
            )
        node.running = list(payload.get("running", []))
        node.finished = list(payload.get("finished", []))
        node.last_heartbeat = now
        node.save()
        if came_back or (not was_ready and node.status == Node.State.READY):
            scheduling.request_schedule()
    if restarted:
        from jobs.services import reconcile  # reconcile builds on this module

        reconcile.check_node_now(name)


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
    from jobs.services import outcomes, restarts  # both build on this module's neighbours

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
    scheduling.request_schedule()
    return evicted


def return_to_service(names: list[str]) -> None:
    Node.objects.filter(name__in=names).update(state=Node.State.READY)
    scheduling.request_schedule()
