"""How replicas end and what that means for their job: success, failure with its root cause,
cancellation, the stops that follow, and the end of the log.

Every function here runs inside a transaction that holds the job's row lock, so decisions that
read several replicas ("did every replica succeed?") see them all as they are.

The job's reason names the first cause, not the first report: when an agent dies, the peers of
its trainers fail a moment later and their agents may report before anyone notices the node.
Each failure carries when it happened (`Replica.cause_at`: the process's exit as its agent saw
it, or the last heartbeat of a lost node), and the job's reason is always the earliest one.
The other instances' ends are kept on their own rows, never as the job's reason.
"""

import logging
from datetime import datetime

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from jobs.models import Job, Replica
from jobs.redis_client import get_redis
from jobs.services.lifecycle import dispatch, elastic, restarts, schedule_requests, transitions
from jobs.time_limit_text import reached
from workers.logsink import LogSink

log = logging.getLogger(__name__)

STDERR_LINES_IN_REASON = 10


def locked_job(job_id: int) -> Job | None:
    """The job, its row locked until the transaction ends (SQLite: the whole database)."""
    return Job.objects.select_for_update().filter(pk=job_id).first()


def with_stderr(reason: str, stderr_tail: list[str]) -> str:
    tail = [line for line in stderr_tail if line.strip()][-STDERR_LINES_IN_REASON:]
    return reason + ("\nlast lines of stderr:\n" + "\n".join(tail) if tail else "")


def replica_ended(
    job: Job,
    replica: Replica,
    state: str,
    reason: str = "",
    exit_code: int | None = None,
    cause_at: datetime | None = None,
) -> bool:
    """Record that `replica` ended in `state` (succeeded, failed or stopped), and decide what it
    means for `job`. Returns False, changing nothing, when the replica had already ended.

    A replica of the current attempt that stops while its job is still active was not stopped
    by the platform: it is a failure (an agent shutting down, say), like any other. Replicas
    of an earlier attempt were stopped by a restart: their end decides nothing, except that
    the last of them lets the next attempt start.
    """
    current = replica.attempt == job.attempt and job.state != Job.State.RESTARTING
    if state == Replica.State.STOPPED and job.is_active and current:
        state = Replica.State.FAILED
    moved = transitions.move_replica(
        replica,
        state,
        exit_code=exit_code,
        reason=reason,
        cause_at=cause_at or timezone.now(),
    )
    if not moved:
        return False
    if not current:
        if not (state == Replica.State.SUCCEEDED and restarts.finished_before_its_stop(job)):
            restarts.resume_when_ready(job)
    elif state == Replica.State.SUCCEEDED:
        if (
            job.is_active
            and not restarts.current_replicas(job).exclude(state=Replica.State.SUCCEEDED).exists()
        ):
            transitions.move_job(job, Job.State.SUCCEEDED, "")
            restarts.attempt_ended(job)
    elif state == Replica.State.FAILED:
        if job.is_active:
            attempt_failed(job, replica)
        elif (
            job.state == Job.State.FAILED
            and replica.attempt == job.attempt
            and not _ended_by_the_console(job)
        ):
            # A failure found late (a lost node) may have happened before the one reported.
            # (A health rule or the time limit that stopped the job decided its end: its
            # reason stands.)
            transitions.set_job_reason(job, restarts.final_reason(job, root_cause(job)))
    complete_log_if_done(job)
    # Capacity was freed: let waiting jobs in.
    schedule_requests.request_schedule()
    return True


def _ended_by_the_console(job: Job) -> bool:
    if job.time_limit is not None and reached(job.time_limit) in job.reason.split("\n", 1)[0]:
        return True
    return job.health_events.filter(attempt=job.attempt, action="stop").exists()


def attempt_failed(job: Job, replica: Replica) -> None:
    """One instance down means the distributed job cannot go on: restart the whole job if its
    policy allows, else fail it. An elastic job decides once its other instances have ended
    (elastic.regroup): what failed first may have been a node, which it is not known yet."""
    if job.is_elastic:
        elastic.regroup(job, replica)
        return
    node = replica.node.name if replica.node else ""
    end_attempt(
        job, restarts.Cause.INSTANCE_FAILED, root_cause(job), f"{replica.tag} failed", node=node
    )


def end_attempt(
    job: Job,
    cause: "restarts.Cause",
    why: str,
    stop_reason: str,
    *,
    node: str = "",
    grace_seconds: float | None = None,
) -> "restarts.Decision":
    """End the job's current attempt for `cause` and carry out what restarts.decide says
    follows: the next attempt, or the job's failure (its agents told `stop_reason`). The old
    attempt's processes get `grace_seconds` between SIGTERM and SIGKILL (None: the agent's)."""
    decision = restarts.decide(job, cause, why, node)
    if decision.restart:
        restarts.begin(
            job,
            decision.why,
            exclude=list(decision.exclude),
            counts=decision.counts,
            grace_seconds=grace_seconds,
            uncounted="preempted" if cause is restarts.Cause.PREEMPTION else "evicted",
        )
    else:
        fail(job, restarts.final_reason(job, decision.why), stop_reason, grace_seconds)
    return decision


# What an evicted instance's agent is told, and its log says, when it is stopped.
EVICTED = "preempted"


def evict(victim_id: int, why: str) -> Job | None:
    """End a running job's attempt to make room for another (preemption, or reclaim of what
    its group borrowed: the scheduler's one eviction), `why` being the attempt's reason; it
    goes back to the queue, its processes given TRAINYARD_PREEMPTION_GRACE_SECONDS between
    SIGTERM and SIGKILL. The victim, locked, with the attempt that ended one below its
    current; None when it no longer runs."""
    victim = locked_job(victim_id)
    if victim is None or victim.state != Job.State.RUNNING:
        return None
    end_attempt(
        victim,
        restarts.Cause.PREEMPTION,
        why,
        EVICTED,
        grace_seconds=float(settings.TRAINYARD_PREEMPTION_GRACE_SECONDS),
    )
    return victim


def fail(job: Job, reason: str, stop_reason: str, grace_seconds: float | None = None) -> None:
    """Fail an active job for good and stop whatever of it still runs."""
    if transitions.move_job(job, Job.State.FAILED, reason):
        restarts.attempt_ended(job, reason)
        stop_the_rest(job, stop_reason, grace_seconds)


def root_cause(job: Job) -> str:
    """The job's reason: the earliest failure among its replicas, in words."""
    failed = _failed_replicas(job)
    if not failed:
        return job.reason
    first = restarts.earliest(failed)
    assert first is not None
    node = first.node.name if first.node else (first.slurm_node or "?")
    if restarts.node_wide(first):
        # A node-wide cause ("node-1 lost: …") speaks for every instance that ran there.
        there = [r.tag for r in failed if r.node_id == first.node_id and r.reason == first.reason]
        return f"{first.reason} ({', '.join(there)} ran there)"
    return f"{first.tag} on {node}: {first.reason or 'stopped'}"


def first_failure(job: Job) -> Replica | None:
    """The instance whose failure the job's reason names (root_cause): the earliest to fail
    in its current attempt."""
    failed = _failed_replicas(job)
    return restarts.earliest(failed)


def _failed_replicas(job: Job) -> list[Replica]:
    return list(
        restarts.current_replicas(job)
        .filter(state=Replica.State.FAILED)
        .select_related("node")
        .order_by("id")
    )


def stop_the_rest(job: Job, reason: str, grace_seconds: float | None = None) -> None:
    """The job has ended: stop its replicas that still run, drop those never placed.

    Running replicas keep their node's capacity until their agent says they stopped (or
    reconciliation finds they no longer run); a stop that never arrives is sent again.
    """
    transitions.stop_unplaced(job)
    holding = list(job.replicas.filter(state__in=Replica.HOLDING_STATES).select_related("node"))
    if holding:
        dispatch.send_stops_on_commit(job.pk, holding, reason, grace_seconds=grace_seconds)


def cancel(job_id: int, by: User) -> Job:
    return cancel_for(job_id, f"cancelled by {by.get_username()}")


def cancel_for(job_id: int, reason: str, strict: bool = True) -> Job:
    """Cancel the job saying `reason` (Cancel's own is "cancelled by USER"; an experiment's
    "stopped early: …" for a trial its pruner stopped): the same path, the same stops. Not
    `strict`, a job that has already ended is left as it is."""
    with transaction.atomic():
        job = locked_job(job_id)
        if job is None:
            raise Job.DoesNotExist(f"No job {job_id}.")
        if not transitions.move_job(job, Job.State.CANCELLED, reason, strict=strict):
            return job
        restarts.attempt_ended(job, job.reason)
        stop_the_rest(job, "cancelled")
        complete_log_if_done(job)
        schedule_requests.request_schedule()
    return job


def log_end_reason(job: Job) -> str:
    """What the log's end marker says: how the job ended, and why."""
    return f"job {job.state}" + (f": {job.reason.splitlines()[0]}" if job.reason else "")


def complete_log_if_done(job: Job) -> None:
    """Once a finished job has no process left, append the log's end marker (once)."""
    if job.is_active or job.log_complete:
        return
    if job.replicas.filter(state__in=Replica.HOLDING_STATES).exists():
        return
    if not Job.objects.filter(pk=job.pk, log_complete=False).update(log_complete=True):
        return
    job.log_complete = True
    end_reason = log_end_reason(job)
    job_id = job.pk
    # If Redis is away now, the log keeper appends the marker later (logarchive).
    transaction.on_commit(lambda: LogSink(get_redis()).append_end(job_id, end_reason), robust=True)
