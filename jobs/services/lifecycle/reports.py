"""What node agents report about replicas: started, and how they ended. Every report is safe
to receive twice or late: a report that no longer applies changes nothing."""

import logging
import math
from datetime import UTC, datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from jobs.models import Job, LogAck, Replica
from jobs.services.lifecycle import outcomes, restarts, transitions

log = logging.getLogger(__name__)

# How the agent names an ending, and the replica state it becomes.
AGENT_OUTCOMES = {
    "succeeded": Replica.State.SUCCEEDED,
    "failed": Replica.State.FAILED,
    "stopped": Replica.State.STOPPED,
}
# The agent was asked about a replica it does not run and has no record of.
UNKNOWN = "unknown"


def _replica_on(job: Job, attempt: int, role: str, index: int, node: str) -> Replica | None:
    return (
        job.replicas.select_related("node")
        .filter(attempt=attempt, role=role, index=index, node__name=node)
        .first()
    )


def replica_started(
    job_id: int, role: str, index: int, node: str, incarnation: str = "", attempt: int = 0
) -> None:
    with transaction.atomic():
        job = outcomes.locked_job(job_id)
        if job is None:
            return
        replica = _replica_on(job, attempt, role, index, node)
        if replica is None:
            return
        if not transitions.move_replica(
            replica, Replica.State.RUNNING, started=timezone.now(), incarnation=incarnation
        ):
            return  # a repeated or late report: the replica has moved on already
        if (
            job.state == Job.State.QUEUED
            and attempt == job.attempt
            and not restarts.current_replicas(job)
            .filter(state__in=(Replica.State.PENDING, Replica.State.ASSIGNED))
            .exists()
        ):
            transitions.move_job(
                job, Job.State.RUNNING, "running on borrowed capacity" if job.borrowed else ""
            )
            restarts.attempt_started(job)


def replica_exited(
    job_id: int,
    role: str,
    index: int,
    node: str,
    outcome: str,
    exit_code: int | None,
    reason: str,
    stderr_tail: list[str],
    ended_at: float | None = None,
    attempt: int = 0,
    log_ends: dict[str, int] | None = None,
    usage: dict[str, Any] | None = None,
) -> None:
    """Record how a replica ended and what that means for its job; `log_ends`, where each of
    its files' lines end (the log keeper closes the log once the database has them)."""
    with transaction.atomic():
        job = outcomes.locked_job(job_id)
        if job is None:
            return
        replica = _replica_on(job, attempt, role, index, node)
        if replica is None or replica.state in Replica.FINAL_STATES:
            return
        # Before the end below may close the log: the goals are then in the same transaction.
        record_log_goals(job, log_ends or {})
        if outcome == UNKNOWN:
            not_running_on_its_node(job, replica)
            return
        state = AGENT_OUTCOMES.get(outcome, Replica.State.FAILED)
        if state == Replica.State.FAILED or (state != Replica.State.SUCCEEDED and job.is_active):
            # How it failed, in its own words; a replica stopped after its job ended needs none.
            reason = outcomes.with_stderr(reason, stderr_tail)
        record_usage(replica, usage)
        outcomes.replica_ended(
            job,
            replica,
            state,
            reason=reason,
            exit_code=exit_code,
            cause_at=datetime.fromtimestamp(ended_at, UTC) if ended_at else None,
        )


def _counter(value: Any) -> float | None:
    """A counter as the agent sent it: a finite number, not negative; None otherwise."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and value >= 0 else None


def record_usage(replica: Replica, usage: dict[str, Any] | None) -> None:
    """What the replica used, from its cgroup's counters (workers/cgroups.Usage); a malformed
    report leaves the figures unknown."""
    if not isinstance(usage, dict):
        return
    cpu = _counter(usage.get("cpu_seconds"))
    peak = _counter(usage.get("memory_peak_bytes"))
    replica.cpu_seconds = cpu
    replica.memory_peak_bytes = int(peak) if peak is not None else None
    replica.save(update_fields=["cpu_seconds", "memory_peak_bytes"])


def record_log_goals(job: Job, log_ends: dict[str, int]) -> None:
    """Note where each writer's lines end (a writer with none in the database yet gets a row at
    -1); a malformed entry is ignored, as the agent can only have sent it by mistake."""
    goals = [
        LogAck(job=job, writer=writer, seq=-1, goal=seq)
        for writer, seq in log_ends.items()
        if isinstance(writer, str) and len(writer) <= 100 and isinstance(seq, int) and seq >= 0
    ]
    LogAck.objects.bulk_create(
        goals, update_conflicts=True, unique_fields=["job", "writer"], update_fields=["goal"]
    )


def replica_taken_over(replica: Replica, incarnation: str) -> bool:
    """A restarted agent runs the replica on (its keeper held it meanwhile): from now on it is
    that agent's, and only that agent's silence about it means it is gone."""
    if replica.incarnation == incarnation:
        return False
    log.info(
        "%s of job %s on %s: taken over by agent incarnation %s",
        replica, replica.job_id, replica.node, incarnation,
    )  # fmt: skip
    Replica.objects.filter(pk=replica.pk).update(incarnation=incarnation)
    return True


def not_running_on_its_node(job: Job, replica: Replica, cause_at: datetime | None = None) -> None:
    """Its node's agent does not run the replica (any more): if the job has ended that is the
    stop it was waiting for; otherwise the replica is lost, and that fails the job."""
    node = replica.node.name if replica.node else "its node"
    if not job.is_active or replica.attempt < job.attempt:
        outcomes.replica_ended(
            job, replica, Replica.State.STOPPED, f"was not running on {node} when stopped"
        )
    else:
        outcomes.replica_ended(
            job,
            replica,
            Replica.State.FAILED,
            f"{node}'s agent does not run it any more",
            cause_at=cause_at,
        )
