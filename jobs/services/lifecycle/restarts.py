"""Restarting a job as a whole, the way torch elastic restarts its worker group.

When an instance of the current attempt fails (it exits non-zero, its node is lost, a health
rule asks for it, or its node is evicted), every instance of that attempt is stopped and a new
attempt of the whole job waits for room: placed afresh, with a new rendezvous port, the same
job id and checkpoint folder, and TRAINYARD_RESTART_COUNT set. The old attempt's replicas keep
their rows (and their log lines keep their attempt), so the job page lists every attempt.

    running --(failure, restarts left)--> restarting --(old processes gone, back-off over)-->
    queued --(every new replica started)--> running

    restarting --(every old instance had exited 0 on its own)--> succeeded

Whether an attempt's end restarts the job or fails it is decided in one place, `decide`, for
every cause (see `Cause`); the callers only say what happened, and outcomes.end_attempt carries
the decision out.

The new attempt is not placed while any process of the old one may still run: it would meet
them in the checkpoint folder, and on the nodes' capacity. A restarting job keeps its quota.

Every function here runs inside a transaction that holds the job's row lock.
"""

import enum
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from console.celery import app
from jobs.models import Job, JobAttempt, Node, Replica, RestartPolicy
from jobs.services.lifecycle import dispatch, schedule_requests, transitions
from jobs.services.placement import Demand, Room, gang_never_fits
from workers import contract

log = logging.getLogger(__name__)


def current_replicas(job: Job) -> "QuerySet[Replica]":
    """The replicas of the job's current attempt."""
    return job.replicas.filter(attempt=job.attempt)


def current_attempt_starts(jobs: "list[Job]", default: datetime) -> dict[int, datetime]:
    """When each job's current attempt started (preemption's and reclaim's "last started"
    and minimum run): its attempt's start, else the job's, else `default`. One query."""
    started = {
        (a.job_id, a.number): a.started
        for a in JobAttempt.objects.filter(job__in=jobs).only("job_id", "number", "started")
    }
    return {j.pk: started.get((j.pk, j.attempt)) or j.started or default for j in jobs}


class Cause(enum.Enum):
    """What ended an attempt. Each says whether it may restart the job at all, whether the
    restart uses up one of the budget's, and which node the next attempts avoid."""

    # An instance failed: its trainer exited non-zero, or its node was lost, or its agent died
    # and none came back within the keepers' grace (outcomes.replica_ended sees them alike).
    INSTANCE_FAILED = "instance failed"
    RULE_STOP = "health rule: stop"
    RULE_RESTART = "health rule: restart"
    RULE_RESTART_AWAY = "health rule: restart-exclude-node"
    # The platform took the nodes (an admin's drain with eviction): not the job's failure.
    EVICTION = "eviction"
    # A job of a higher priority class takes the nodes (jobs.services.scheduler.preemption): the job
    # always goes back to the queue, whatever its policy, since it is not its failure.
    PREEMPTION = "preemption"
    # The attempt held its nodes for the job's whole time limit
    # (jobs.services.lifecycle.time_limits).
    TIME_LIMIT = "time limit"

    @property
    def may_restart(self) -> bool:
        # A time limit is not restarted: the next attempt would only run into it again.
        return self not in (Cause.RULE_STOP, Cause.TIME_LIMIT)

    @property
    def counts(self) -> bool:
        """Whether a restart for this cause uses up one of the job's restarts."""
        return self not in (Cause.EVICTION, Cause.PREEMPTION)

    def avoids_node(self, job: Job) -> bool:
        """Whether the next attempts avoid the node where the attempt ended."""
        if self is Cause.RULE_RESTART_AWAY:
            return True
        return self is Cause.INSTANCE_FAILED and job.exclude_failed_node


@dataclass(frozen=True)
class Decision:
    """What follows an attempt's end: a restart (counted or not, avoiding `exclude`) or the
    job's failure; `why` is the cause in words, as the job's reason will say it."""

    restart: bool
    why: str
    counts: bool = True
    exclude: tuple[str, ...] = ()


def decide(job: Job, cause: Cause, why: str, node: str = "") -> Decision:
    """The one restart decision, torch elastic's: restart while the budget lasts, else fail.

    A cause that is not the job's own (eviction, preemption) restarts it without using the
    budget, unless the policy is never, and then the reason says so. A preemption always
    requeues it, whatever its policy: the platform chose to stop it, and promised it its turn
    back. `node` is where the attempt ended (the failed instance's node), "" when unknown.
    """
    if cause is Cause.PREEMPTION:
        return Decision(True, why, counts=False)
    if not cause.may_restart or job.restart_policy != RestartPolicy.ON_FAILURE:
        if not cause.counts:
            why = f"{why}; its restart policy is never"
        return Decision(False, why, counts=cause.counts)
    if cause.counts and job.restarts_left <= 0:
        return Decision(False, why)
    exclude = (node,) if node and cause.avoids_node(job) else ()
    return Decision(True, why, counts=cause.counts, exclude=exclude)


def begin(
    job: Job,
    why: str,
    *,
    exclude: list[str] | None = None,
    counts: bool = True,
    grace_seconds: float | None = None,
    uncounted: str = "evicted",
    resize: str = "",
    judged: bool = True,
) -> None:
    """End the current attempt because of `why` and prepare the next one.

    `exclude` names nodes the next attempts avoid; `counts=False` (an eviction, a preemption:
    `uncounted` says which) does not use up a restart. The old attempt's processes get SIGTERM,
    then SIGKILL after `grace_seconds` (the agent's default when None). An elastic job's
    resize (`resize`, its reason in words) is neither counted nor delayed by the back-off;
    `judged=False` leaves the decision to when every old instance has ended
    (jobs.services.lifecycle.elastic.judge). The next attempt of an elastic job is prepared
    at its largest size: the scheduler places as many as fit.
    """
    now = timezone.now()
    old = job.attempt
    used = job.restarts_used + (1 if counts else 0)
    excluded, kept = _exclusions(job, exclude or [])
    backoff = timedelta(seconds=0 if resize or not judged else job.restart_backoff_seconds)
    note = f" ({', '.join(kept)} not excluded: the job does not fit without it)" if kept else ""
    if resize:
        reason = f"resizing: {resize}; attempt {old + 1} stops to restart at the new size"
    elif not judged:
        reason = (
            f"regrouping after attempt {old + 1} ended: {why}; waiting for its other instances "
            "to end, to tell whether a node was lost"
        )
    else:
        reason = f"{restart_label(job, counts, used, uncounted)} after attempt {old + 1} ended: "
        reason += f"{why}{note}"
    moved = transitions.move_job(
        job,
        Job.State.RESTARTING,
        reason,
        attempt=old + 1,
        restarts_used=used,
        restart_at=now + backoff,
        excluded_nodes=excluded,
    )
    if not moved:
        return
    JobAttempt.objects.filter(job=job, number=old).update(
        finished=now, reason=resize or why, counted=counts, judged=judged
    )
    JobAttempt.objects.create(job=job, number=job.attempt)
    previous = list(
        Replica.objects.filter(job=job, attempt=old).select_related("node").order_by("id")
    )
    Replica.objects.bulk_create(
        Replica(job=job, attempt=job.attempt, role=r.role, index=r.index, package=r.package)
        for r in _next_slots(job, previous)
    )
    transitions.stop_unplaced(job, attempt=old)
    holding = [r for r in previous if r.state in Replica.HOLDING_STATES]
    if holding:
        dispatch.send_stops_on_commit(
            job.pk, holding, f"restarting: {why}", up_to_attempt=old, grace_seconds=grace_seconds
        )
    log.warning("job %s: %s", job.pk, job.reason)
    resume_when_ready(job)


def restart_label(job: Job, counts: bool, used: int, uncounted: str) -> str:
    """ "restart 2 of 3", "restart (not counted: evicted)", and the back-off it waits."""
    label = (
        f"restart {used} of {job.max_restarts}" if counts else f"restart (not counted: {uncounted})"
    )
    wait = f" in {job.restart_backoff_seconds} s" if job.restart_backoff_seconds else ""
    return label + wait


def _next_slots(job: Job, previous: list[Replica]) -> list[Replica]:
    """The slots of the next attempt: the old attempt's; an elastic job's, with its elastic
    role's indices filled up to its largest size again."""
    if not job.is_elastic:
        return previous
    slots = list(previous)
    workers = [r for r in previous if r.role == "worker"]
    charged = sum(1 for r in previous if r.package is not None)
    role = job.roles.filter(role="worker").select_related("package").first()
    if role is None:
        return slots
    first = contract.first_index("worker", bool(job.kvstore))
    taken = {r.index for r in workers}
    index = first
    while charged < job.max_size:
        if index not in taken:
            slots.append(Replica(role="worker", index=index, package=role.package))
            charged += 1
        index += 1
    return slots


def _exclusions(job: Job, wanted: list[str]) -> tuple[list[str], list[str]]:
    """The nodes to exclude from now on, and those of `wanted` kept because without them the
    job could never run (a restart that waits forever helps nobody)."""
    excluded = sorted(set(job.excluded_nodes) | set(wanted))
    if not wanted:
        return excluded, []
    open_nodes = list(Node.objects.exclude(state=Node.State.DRAINING).exclude(name__in=excluded))
    demands = [
        Demand.of((r.role, r.index), r.package, job.one_instance_per_node)
        for r in current_replicas(job).select_related("package")
        if r.package is not None
    ]
    rooms = [Room(n.name, n.cpu, n.gpus, n.memory_gb) for n in open_nodes]
    if rooms and not gang_never_fits(demands, rooms):
        return excluded, []
    kept = sorted(set(wanted) - set(job.excluded_nodes))
    return sorted(set(job.excluded_nodes)), kept


def resume_when_ready(job: Job) -> bool:
    """restarting -> queued once no process of an earlier attempt holds a node and the back-off
    is over; until then, ask again when the back-off ends (reconciliation asks too)."""
    if job.state != Job.State.RESTARTING:
        return False
    if Replica.objects.filter(
        job=job, attempt__lt=job.attempt, state__in=Replica.HOLDING_STATES
    ).exists():
        return False  # the last one to end calls again
    if JobAttempt.objects.filter(job=job, number=job.attempt - 1, judged=False).exists():
        if not judge_regrouped(job):
            return False
    now = timezone.now()
    if job.restart_at is not None and job.restart_at > now:
        delay = (job.restart_at - now).total_seconds()
        job_id = job.pk
        transaction.on_commit(lambda: _resume_later(job_id, delay), robust=True)
        return False
    moved = transitions.move_job(
        job, Job.State.QUEUED, f"attempt {job.attempt + 1}: waiting for room on the nodes"
    )
    if moved:
        schedule_requests.request_schedule()
    return moved


def finished_before_its_stop(job: Job) -> bool:
    """restarting -> succeeded when the attempt a restart ended had in fact finished: every one
    of its instances exited 0 on its own (their agents say succeeded, not stopped), the exits
    crossing the stop on the way, as when a preemption is decided the moment a job ends.
    Running it again would train it twice (and, from its last checkpoint, report a second
    result). The job succeeds in that attempt; the attempt the restart prepared, never placed,
    is dropped with what it noted (a restart used, a preemption), as if it had not been."""
    if job.state != Job.State.RESTARTING or job.attempt == 0:
        return False
    ended = job.attempt - 1
    if (
        Replica.objects.filter(job=job, attempt=ended)
        .exclude(state=Replica.State.SUCCEEDED)
        .exists()
        or current_replicas(job).exclude(state=Replica.State.PENDING).exists()
    ):
        return False
    row = JobAttempt.objects.filter(job=job, number=ended).first()
    counted = row is not None and row.counted
    preempted = row is not None and row.reason.startswith("preempted by job ") and job.preempted_by
    moved = transitions.move_job(
        job,
        Job.State.SUCCEEDED,
        "",
        attempt=ended,
        restarts_used=job.restarts_used - (1 if counted else 0),
        restart_at=None,
        preempted_by=job.preempted_by[:-1] if preempted else job.preempted_by,
    )
    if not moved:
        return False
    Replica.objects.filter(job=job, attempt=ended + 1).delete()
    JobAttempt.objects.filter(job=job, number=ended + 1).delete()
    JobAttempt.objects.filter(job=job, number=ended).update(
        reason="", counted=True, preempted_by=None
    )
    log.warning(
        "job %s: attempt %s had finished before its stop arrived: succeeded", job.pk, ended + 1
    )
    return True


def node_wide(replica: Replica) -> bool:
    """Whether the replica's end is its node's (lost, its agent gone), not its trainer's: the
    reconciler's reasons for those start with the node's name."""
    node = replica.node.name if replica.node else replica.slurm_node
    return bool(node) and replica.reason.startswith((node + " ", node + ":"))


def judge_regrouped(job: Job) -> bool:
    """Every instance of the attempt a failure ended has ended: decide what it was. A node's
    end (the earliest failure among them is node-wide) shrinks the job, uncounted; the job's
    own failure is a restart of its policy, or its end. Returns whether the next attempt may
    go on (False: the job failed)."""
    ended = job.attempt - 1
    failed = list(
        Replica.objects.filter(job=job, attempt=ended, state=Replica.State.FAILED)
        .select_related("node")
        .order_by("id")
    )
    first = earliest(failed)
    JobAttempt.objects.filter(job=job, number=ended).update(judged=True)
    if first is None:
        why = "stopped"
        cause_is_the_node = False
    else:
        node = first.node.name if first.node else (first.slurm_node or "?")
        cause_is_the_node = node_wide(first)
        why = first.reason if cause_is_the_node else f"{first.tag} on {node}: {first.reason}"
    if cause_is_the_node:
        JobAttempt.objects.filter(job=job, number=ended).update(reason=why, counted=False)
        transitions.set_job_reason(
            job, f"regrouping after attempt {ended + 1} ended: {why} (not counted: a node's)"
        )
        return True
    decision = decide(job, Cause.INSTANCE_FAILED, why)
    if decision.restart:
        used = job.restarts_used + 1
        label = restart_label(job, True, used, "")
        Job.objects.filter(pk=job.pk).update(
            restarts_used=used,
            restart_at=timezone.now() + timedelta(seconds=job.restart_backoff_seconds),
        )
        job.refresh_from_db(fields=["restarts_used", "restart_at"])
        JobAttempt.objects.filter(job=job, number=ended).update(reason=why, counted=True)
        transitions.set_job_reason(job, f"{label} after attempt {ended + 1} ended: {why}")
        return True
    # The job ends in the attempt that failed: the one prepared for after it never was.
    Replica.objects.filter(job=job, attempt=job.attempt).delete()
    JobAttempt.objects.filter(job=job, number=job.attempt).delete()
    Job.objects.filter(pk=job.pk).update(attempt=ended)
    job.attempt = ended
    reason = final_reason(job, decision.why)
    if transitions.move_job(job, Job.State.FAILED, reason):
        JobAttempt.objects.filter(job=job, number=ended).update(reason=reason)
    return False


def earliest(failed: list[Replica]) -> Replica | None:
    """The first to fail of these: by when what ended it happened, not by its report."""
    return min(
        failed, key=lambda r: (r.cause_at or r.finished or timezone.now(), r.pk), default=None
    )


def _resume_later(job_id: int, delay: float) -> None:
    app.send_task(
        contract.TASK_RESUME_RESTART,
        kwargs={"job_id": job_id},
        queue=contract.CONSOLE_QUEUE,
        countdown=max(0.0, delay),
    )


def attempt_started(job: Job) -> None:
    """Every replica of the current attempt runs: note when, and where."""
    nodes = sorted(
        set(current_replicas(job).exclude(node=None).values_list("node__name", flat=True))
    )
    JobAttempt.objects.filter(job=job, number=job.attempt, started=None).update(
        started=timezone.now(), nodes=nodes
    )


def attempt_ended(job: Job, reason: str = "") -> None:
    """The job ended in its current attempt (succeeded, failed for good, cancelled)."""
    JobAttempt.objects.filter(job=job, number=job.attempt, finished=None).update(
        finished=timezone.now(), reason=reason
    )


def final_reason(job: Job, cause: str) -> str:
    """Why a job failed for good: this attempt's cause, then the earlier attempts' in brief."""
    earlier = list(JobAttempt.objects.filter(job=job, number__lt=job.attempt).order_by("number"))
    if not earlier:
        return cause
    gave_up = (
        f"gave up after {job.restarts_used} restart{'s' if job.restarts_used != 1 else ''}"
        if job.restart_policy == RestartPolicy.ON_FAILURE
        else "no restart: the policy is never"
    )
    lines = [f"attempt {job.attempt + 1}: {cause}", f"{gave_up}; earlier attempts:"]
    lines += [
        f"attempt {a.number + 1}: {a.reason.splitlines()[0] if a.reason else '?'}" for a in earlier
    ]
    return "\n".join(lines)


def resume(job_id: int) -> bool:
    """The back-off of a restarting job is over (a delayed task): start its next attempt if
    nothing of the old one still runs."""
    with transaction.atomic():
        job = Job.objects.select_for_update().filter(pk=job_id).first()
        return job is not None and resume_if_due(job)


def resume_if_due(job: Job) -> bool:
    """Reconciliation's backstop for a lost resume message."""
    if job.restart_at is not None and job.restart_at > timezone.now():
        return False
    return resume_when_ready(job)
