"""The console's side of its Slurm pools: submit, follow, stop and reconcile, every pass.

A job of a Slurm pool is admitted as any other (the quota is Trainyard's), and its replicas wait
as `pending`; Slurm, not the scheduling pass, places them. Each pass, per pool:

1. **Submit** each queued job whose current attempt has no Slurm job yet: its own Redis user
   (slurm_access), its plan and batch script on the shared file system, `sbatch`
   (slurm_batch), run outside any transaction behind a committed mark. Its replicas become
   `assigned`. The error model (slurm_client): Slurm *refusing* it (the partition can never
   hold it, an invalid account, a QOS limit) is the one thing that fails the job, with Slurm's
   words; Slurm *unreachable* (controller down, a timeout, munge) leaves every job of the pool
   queued, with a reason that says so, and stops the pool's pass until the next; anything else
   (a plan that cannot be written) leaves that one job waiting with its reason, and the others
   go on. One pool's failure never stops another's.
2. **Follow** every attempt whose replicas Slurm may still hold, with one `squeue --json`:
   - pending: the job's reason says why Slurm keeps it waiting, in words (slurm_states);
   - running: its replicas run, and the job too once all do; its time limit counts from now;
     an instance whose step wrapper has written its outcome ends at once (the job restarts or
     fails from it within the pass, as from an agent's report); one whose wrapper's beats
     have stopped (a hung or dead node) is said to be silent, then lost, as an agent's node;
   - ended, or no longer known to Slurm: each replica ends as its step wrapper's outcome file
     says (the instance's own reason: its exception and exit), or, without one, as Slurm says
     (NODE_FAIL: "a Slurm node it ran on failed"). outcomes.replica_ended then decides, as for
     an agent's report: succeeded, a restart per the job's policy (a new attempt, submitted
     by a later pass, resuming from the shared checkpoint folder), or failed.
3. **Stop** (scancel) a Slurm job the console no longer wants: its Trainyard job was cancelled,
   failed or restarted.
4. **Reconcile** the other way: a Slurm job named `trainyard-<id>` in the pool's partition that
   no attempt of an active job is (the console lost track of it: a database restored, a submit
   whose answer was lost) is cancelled.

Every change of state goes through outcomes and transitions, as the agents' reports do.
"""

import json
import logging
import os
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import redis
from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from console.celery import app
from jobs.models import Job, JobAttempt, Replica, SlurmPool
from jobs.redis_client import get_redis
from jobs.services.lifecycle import events, outcomes, reports, restarts, transitions
from jobs.services.periodic import PeriodicPass
from jobs.services.slurm import slurm_access, slurm_batch, slurm_client, slurm_states
from jobs.services.slurm.slurm_client import (
    CLIENT_TIMEOUT_SECONDS,
    SlurmError,
    SlurmRefused,
    SlurmTarget,
    SlurmUnavailable,
)
from jobs.services.slurm.slurm_states import SlurmStatus
from workers import contract, jobfiles
from workers.contract import tag_of
from workers.slurmstep import outcome_file, redis_file, where_file

log = logging.getLogger(__name__)


@dataclass
class PassReport:
    submitted: int = 0
    refused: int = 0
    started: int = 0
    ended: int = 0
    cancelled: int = 0
    errors: list[str] = field(default_factory=list)


class SlurmLoop(PeriodicPass[PassReport]):
    what = "slurm"

    def one_pass(self) -> PassReport:
        return run_pass()


def request_pass() -> None:
    """Run a pass as soon as this transaction commits (a job was admitted), not at the next
    tick: a submission should not wait up to TRAINYARD_SLURM_SECONDS for sbatch."""

    def send() -> None:
        app.send_task(contract.TASK_SLURM_NOW, queue=contract.CONSOLE_QUEUE)

    transaction.on_commit(send, robust=True)


def run_pass() -> PassReport:
    report = PassReport()
    for pool in SlurmPool.objects.all():
        try:
            target = slurm_batch.target_of(pool)
            _submit_waiting(pool, target, report)
            _follow(pool, target, report)
        except SlurmUnavailable as exc:
            # Slurm away for a moment: its jobs wait, saying so, and everything is tried again
            # on the next pass. Nothing fails for it.
            report.errors.append(f"{pool.name}: {exc}")
            log.warning("Slurm pool %s: %s", pool.name, exc)
            _say_unreachable(pool, exc)
        except Exception as exc:  # one pool's fault must not stop the others
            report.errors.append(f"{pool.name}: {exc}")
            log.exception("Slurm pool %s: the pass failed", pool.name)
    return report


def _say_unreachable(pool: SlurmPool, exc: SlurmError) -> None:
    """Every job of the pool that waits: why it waits now."""
    words = (
        f"waiting: Slurm ({pool.name}) cannot be reached now ({exc}); "
        f"the console asks again every {settings.TRAINYARD_SLURM_SECONDS:g} s"
    )
    for job in Job.objects.filter(slurm_pool=pool, state=Job.State.QUEUED).only("pk", "reason"):
        if job.reason != words:
            with transaction.atomic():
                locked = outcomes.locked_job(job.pk)
                if locked is not None and locked.state == Job.State.QUEUED:
                    transitions.set_job_reason(locked, words)


# --- 1. submitting ------------------------------------------------------------------------
#
# sbatch runs outside any transaction, behind a committed mark (JobAttempt.slurm_submitting):
# a row lock held across a slow or hung sbatch would hold the job's row (and, on SQLite, the
# whole database) for as long, and a Slurm job submitted inside a transaction exists before
# its id is visible to any other pass, which then took it for a stray and cancelled it.

# A mark older than this is a pass that died between sbatch and writing Slurm's answer: the
# partition's two reads and sbatch, each within the client's timeout, and some.
SUBMITTING_EXPIRES = timedelta(seconds=3 * CLIENT_TIMEOUT_SECONDS + 30)


def _waiting(pool: SlurmPool) -> list[int]:
    """Queued jobs whose current attempt is not in Slurm and no live pass is submitting."""
    expired = timezone.now() - SUBMITTING_EXPIRES
    attempts = (
        JobAttempt.objects.filter(
            job__slurm_pool=pool,
            job__state=Job.State.QUEUED,
            number=F("job__attempt"),
            slurm_job_id="",
        )
        .filter(Q(slurm_submitting__isnull=True) | Q(slurm_submitting__lt=expired))
        .order_by("-job__priority", "job_id")
    )
    return list(attempts.values_list("job_id", flat=True))


def _submit_waiting(pool: SlurmPool, target: SlurmTarget, report: PassReport) -> None:
    for job_id in _waiting(pool):
        _submit(job_id, pool, target, report)


def _submit(job_id: int, pool: SlurmPool, target: SlurmTarget, report: PassReport) -> None:
    """Submit one job's current attempt. Raises SlurmUnavailable (the pool's pass stops: the
    next jobs would only wait for the same timeout); any other failure is this job's alone."""
    claimed = _claim(job_id)
    if claimed is None:
        return
    job, stale = claimed
    number = job.attempt
    try:
        if stale:
            _cancel_lost_submission(job, target)
        url, hashed = slurm_access.grant(job.pk, pool.redis_host)
        slurm_id = slurm_batch.submit(job, target, url)
    except SlurmRefused as exc:
        report.refused += 1
        _refused(job_id, number, exc)
        return
    except SlurmUnavailable:
        _unclaim(job_id, number)
        raise
    except Exception as exc:  # a plan not written, Redis away: this job waits
        report.errors.append(f"job {job_id}: {exc}")
        log.warning("job %s: not submitted to Slurm this pass: %s", job_id, exc, exc_info=True)
        _unclaim(
            job_id,
            number,
            f"waiting: it could not be submitted to Slurm ({pool.name}) yet: {exc}; "
            "tried again at every pass",
        )
        return
    _record(job_id, number, slurm_id, hashed, pool, target, report)


def _claim(job_id: int) -> tuple[Job, bool] | None:
    """Mark the job's current attempt as being submitted, and commit the mark; the job, and
    whether it had a mark that expired (its pass died). None: nothing to submit."""
    with transaction.atomic():
        job = outcomes.locked_job(job_id)
        if job is None or job.state != Job.State.QUEUED:
            return None
        attempt = JobAttempt.objects.filter(job=job, number=job.attempt, slurm_job_id="").first()
        if attempt is None:
            return None
        now = timezone.now()
        marked = attempt.slurm_submitting
        if marked is not None and marked >= now - SUBMITTING_EXPIRES:
            return None
        if not restarts.current_replicas(job).filter(state=Replica.State.PENDING).exists():
            return None
        JobAttempt.objects.filter(pk=attempt.pk).update(slurm_submitting=now)
    return job, marked is not None


def _cancel_lost_submission(job: Job, target: SlurmTarget) -> None:
    """A pass died after marking this attempt: if its sbatch went through, Slurm has a job of
    this attempt that no row names. Cancel it before submitting again."""
    folder = str(slurm_batch.attempt_folder(target, job))
    for slurm_id, status in slurm_states.query_all(target).items():
        if status.name == f"{slurm_batch.JOB_NAME_PREFIX}{job.pk}" and status.folder == folder:
            log.warning("job %s: cancelling Slurm job %s, a lost submission", job.pk, slurm_id)
            slurm_client.run_client(["scancel", slurm_id], target)


def _unclaim(job_id: int, number: int, reason: str = "") -> None:
    with transaction.atomic():
        job = outcomes.locked_job(job_id)
        JobAttempt.objects.filter(job_id=job_id, number=number).update(slurm_submitting=None)
        if reason and job is not None and job.state == Job.State.QUEUED:
            transitions.set_job_reason(job, reason)


def _refused(job_id: int, number: int, exc: SlurmError) -> None:
    with transaction.atomic():
        job = outcomes.locked_job(job_id)
        JobAttempt.objects.filter(job_id=job_id, number=number).update(slurm_submitting=None)
        if job is None or not job.is_active or job.attempt != number:
            return
        outcomes.fail(job, f"Slurm did not take it: {exc}", "not taken by Slurm")
        # Nothing of it ever ran: its log is whole as it is.
        outcomes.complete_log_if_done(job)
        transaction.on_commit(lambda: slurm_access.revoke(job_id), robust=True)


def _record(
    job_id: int,
    number: int,
    slurm_id: str,
    hashed: str,
    pool: SlurmPool,
    target: SlurmTarget,
    report: PassReport,
) -> None:
    """Slurm's id for the attempt, written with the mark's removal: from here the Slurm job is
    followed, or, if the job was cancelled while sbatch ran, cancelled."""
    with transaction.atomic():
        job = outcomes.locked_job(job_id)
        JobAttempt.objects.filter(job_id=job_id, number=number).update(
            slurm_job_id=slurm_id, slurm_redis_hash=hashed, slurm_submitting=None
        )
        if job is None or job.state != Job.State.QUEUED or job.attempt != number:
            _scancel_on_commit(slurm_id, target)
            report.cancelled += 1
            if job is None or not job.is_active:
                transaction.on_commit(lambda: slurm_access.revoke(job_id), robust=True)
            return
        now = timezone.now()
        for replica in restarts.current_replicas(job).filter(state=Replica.State.PENDING):
            transitions.move_replica(replica, Replica.State.ASSIGNED, start_sent=now)
        transitions.set_job_reason(job, f"submitted to Slurm ({pool.name}) as job {slurm_id}")
    report.submitted += 1
    log.info("job %s attempt %s: Slurm job %s", job_id, number, slurm_id)


# --- 2. following, 3. stopping, 4. reconciling ------------------------------------------


def _follow(pool: SlurmPool, target: SlurmTarget, report: PassReport) -> None:
    # Attempts Slurm may still hold replicas of: submitted, and some replica not ended.
    attempts = list(
        JobAttempt.objects.filter(job__slurm_pool=pool)
        .exclude(slurm_job_id="")
        .filter(job__replicas__attempt=F("number"))
        .filter(job__replicas__state__in=Replica.HOLDING_STATES)
        .distinct()
    )
    statuses = slurm_states.query_all(target)
    _restore_users(attempts, report)
    places = slurm_states.places_in_queue(statuses, pool.partition)
    waiting = len(places)
    for attempt in attempts:
        place = places.get(attempt.slurm_job_id)
        if attempt.slurm_place != place:
            JobAttempt.objects.filter(pk=attempt.pk).update(slurm_place=place)
            attempt.slurm_place = place
        _apply(attempt, statuses.get(attempt.slurm_job_id), target, report, waiting)
    _reconcile(pool, target, statuses, report)


def _restore_users(attempts: list[JobAttempt], report: PassReport) -> None:
    """Make again the Redis user of each running attempt that Redis no longer has (it restarted:
    ACLs live in memory), so that its wrappers' spooled lines go on to the log."""
    wanted = {a.job_id: a.slurm_redis_hash for a in attempts if a.slurm_redis_hash}
    if not wanted:
        return
    try:
        missing = set(wanted) - slurm_access.granted()
        for job_id in sorted(missing):
            slurm_access.restore(job_id, wanted[job_id])
            log.info("job %s: its Redis user was gone (a Redis restart); made again", job_id)
    except redis.RedisError as exc:
        report.errors.append(f"Redis users: {exc}")


def _apply(
    attempt: JobAttempt,
    status: SlurmStatus | None,
    target: SlurmTarget,
    report: PassReport,
    waiting: int = 0,
) -> None:
    with transaction.atomic():
        job = outcomes.locked_job(attempt.job_id)
        if job is None:
            return
        holding = list(
            job.replicas.filter(attempt=attempt.number, state__in=Replica.HOLDING_STATES)
        )
        if not holding:
            return
        wanted = job.is_active and attempt.number == job.attempt
        if status is not None and status.state in (Job.State.QUEUED, Job.State.RUNNING):
            if not wanted:
                _cancel(attempt, target, report)
            elif status.state == Job.State.QUEUED:
                place = (
                    f" (place {attempt.slurm_place} of {waiting} waiting in "
                    f"{_partitions_words(target.partition)})"
                    if attempt.slurm_place
                    else ""
                )
                transitions.set_job_reason(job, status.words + place)
            else:
                _running(job, attempt, holding, status, report)
                folder = slurm_batch.attempt_folder(target, job, attempt.number)
                _note_nodes(job, folder, holding)
                _note_redis(job, folder, holding)
                _ended_meanwhile(job, attempt, holding, folder, target, report)
                _heard_from(job, attempt, folder, target, report)
            return
        _ended(job, attempt, holding, status, target, report)


UNREACHABLE_PREFIX = "running, but its lines cannot reach the console"


def _note_redis(job: Job, folder: Path, replicas: list[Replica]) -> None:
    """Say on a running job's page when its instances' lines cannot reach the console's Redis
    (their step wrappers write redis-<tag>.json after a while of spooling), and stop saying
    it once they do."""
    silent: list[tuple[str, dict[str, Any]]] = []
    for replica in replicas:
        tag = tag_of(replica.role, replica.index)
        said = _wrapper_file(redis_file(folder, tag))
        if said is not None:
            silent.append((tag, said))
    if silent:
        since = datetime.fromtimestamp(min(float(d.get("since") or 0) for _, d in silent), UTC)
        words = (
            f"{UNREACHABLE_PREFIX}: {', '.join(tag for tag, _ in silent)} cannot reach Redis at "
            f"{silent[0][1].get('redis', '?')} (since {since:%H:%M:%S} UTC); their lines wait "
            "in spools on the shared file system (docs/slurm.md, 'Connecting a real cluster')"
        )
        transitions.set_job_reason(job, words)
    elif job.reason.startswith(UNREACHABLE_PREFIX):
        transitions.set_job_reason(job, "")


SILENT_PREFIX = "running, but not heard from"
# Missed beats (slurmstep.REDIS_WATCH_SECONDS apart) before the page says an instance is silent.
SILENT_AFTER_SECONDS = 7.0


def _heard_from(
    job: Job, attempt: JobAttempt, folder: Path, target: SlurmTarget, report: PassReport
) -> None:
    """Each running instance's step wrapper beats in Redis (contract.alive_key, lasting
    TRAINYARD_NODE_LOST_SECONDS). Silent a few beats, the page says so at once; silent that
    long, the instance is lost, as an agent's silent node is: it fails, and the job restarts
    or fails from it, within a pass, not when Slurm declares the node down (SlurmdTimeout: 300
    s by default) or a surviving rank gives up. Only an instance heard from before can fall
    silent, and one whose wrapper says it cannot reach Redis (redis-<tag>.json) is alive."""
    running = list(
        job.replicas.filter(attempt=attempt.number, state=Replica.State.RUNNING, slurm_node__gt="")
    )
    if not running:
        return
    tags = [tag_of(r.role, r.index) for r in running]
    try:
        with get_redis().pipeline(transaction=False) as ask:
            for tag in tags:
                ask.pttl(contract.alive_key(job.pk, attempt.number, tag))
            ask.hgetall(contract.heard_key(job.pk, attempt.number))
            *left_ms, heard = ask.execute()
    except redis.RedisError:
        return  # the console cannot hear anyone now: that is no instance's silence
    lost_seconds = settings.TRAINYARD_NODE_LOST_SECONDS
    lost: list[Replica] = []
    quiet: list[Replica] = []
    for replica, tag, left in zip(running, tags, left_ms, strict=True):
        if tag not in heard or _wrapper_file(redis_file(folder, tag)) is not None:
            continue
        if left == -2:  # expired: silent for lost_seconds
            lost.append(replica)
        elif left >= 0 and lost_seconds - left / 1000 >= SILENT_AFTER_SECONDS:
            quiet.append(replica)
    for replica in lost:
        words = (
            f"not heard from for {lost_seconds} s: its Slurm node {replica.slurm_node} is lost "
            "or the instance hangs (Slurm had not said so)"
        )
        _end_replicas(job, [replica], {replica.pk: None}, words)
    if lost:
        job.refresh_from_db()
        if not (job.is_active and attempt.number == job.attempt):
            _cancel(attempt, target, report)
        return
    if quiet:
        names = ", ".join(f"{tag_of(r.role, r.index)} (on {r.slurm_node})" for r in quiet)
        transitions.set_job_reason(
            job,
            f"{SILENT_PREFIX} {names} for more than {SILENT_AFTER_SECONDS:.0f} s; lost after "
            f"{lost_seconds} s of silence",
        )
    elif job.reason.startswith(SILENT_PREFIX):
        transitions.set_job_reason(job, "")


def _ended_meanwhile(
    job: Job,
    attempt: JobAttempt,
    holding: list[Replica],
    folder: Path,
    target: SlurmTarget,
    report: PassReport,
) -> None:
    """End at once the instances whose step wrapper has written its outcome while the Slurm
    job still runs: a rank's exit shows on the page within a pass, not when Slurm has ended
    the whole job (srun's --kill-on-bad-exit, then KillWait, then a lost node's
    SlurmdTimeout), and the job's restart or failure follows from it as from an agent's
    report. A job that ends for it is cancelled in Slurm."""
    said = {replica.pk: _wrapper_said(folder, replica) for replica in holding}
    reported = [r for r in holding if said[r.pk] is not None]
    if not reported:
        return
    _end_replicas(job, reported, said, "")
    _note_lost_lines(job, reported, said)
    if not (job.is_active and attempt.number == job.attempt) and _still_held(job, attempt):
        _cancel(attempt, target, report)


def _still_held(job: Job, attempt: JobAttempt) -> bool:
    """Whether instances of the attempt may still run: a job that ended for one of them stops
    the others (scancel). One whose instances have all said how they ended is left to end in
    Slurm on its own: cancelled in the moment between the last outcome and the end of its
    batch script, a job that succeeded read CANCELLED in Slurm's accounting."""
    return job.replicas.filter(attempt=attempt.number, state__in=Replica.HOLDING_STATES).exists()


def _running(
    job: Job,
    attempt: JobAttempt,
    holding: list[Replica],
    status: SlurmStatus | None,
    report: PassReport,
) -> None:
    now = timezone.now()
    moved = [
        r
        for r in holding
        if r.state == Replica.State.ASSIGNED
        and transitions.move_replica(r, Replica.State.RUNNING, started=now)
    ]
    if moved:
        # Its time limit counts from here, not from sbatch: a job waiting in Slurm's queue
        # holds nothing yet (Slurm's own --time counts from the allocation too).
        JobAttempt.objects.filter(pk=attempt.pk, placed__isnull=True).update(placed=now)
    if moved and job.state == Job.State.QUEUED:
        transitions.move_job(job, Job.State.RUNNING, "")
        restarts.attempt_started(job)
        if status is not None and status.nodes:
            JobAttempt.objects.filter(pk=attempt.pk).update(nodes=[status.nodes])
        report.started += 1


def _note_nodes(job: Job, folder: Path, replicas: list[Replica]) -> None:
    """Which Slurm node each instance is on, once its step wrapper has said (where-*.json):
    Slurm names the job's nodes, not which task is on which."""
    noted = 0
    for replica in replicas:
        if replica.slurm_node:
            continue
        where = _wrapper_file(where_file(folder, tag_of(replica.role, replica.index)))
        if where is None:
            continue
        node = str(where.get("node") or "")[:100]
        if node:
            noted += Replica.objects.filter(pk=replica.pk).update(slurm_node=node)
            replica.slurm_node = node
    if noted:
        events.state_changed_on_commit(job.pk)


def _ended(
    job: Job,
    attempt: JobAttempt,
    holding: list[Replica],
    status: SlurmStatus | None,
    target: SlurmTarget,
    report: PassReport,
) -> None:
    """Each replica as its outcome file says; failures first (the earliest decides the job's
    reason), then the rest."""
    folder = slurm_batch.attempt_folder(target, job, attempt.number)
    _note_nodes(job, folder, holding)
    if job.state == Job.State.QUEUED and any(r.slurm_node for r in holding):
        # It ran and ended between two passes (a short job): it started, all the same.
        _running(job, attempt, holding, status, report)
    slurm_words = status.words if status is not None else "Slurm has no record of it any more"
    # What each step wrapper wrote, read once: how it ended, and what it used.
    said = {replica.pk: _wrapper_said(folder, replica) for replica in holding}
    _end_replicas(job, holding, said, slurm_words)
    _note_lost_lines(job, holding, said)
    _record_accounting(attempt, target)
    report.ended += 1
    if not job.is_active:
        job_id = job.pk
        transaction.on_commit(lambda: slurm_access.revoke(job_id), robust=True)


def _record_accounting(attempt: JobAttempt, target: SlurmTarget) -> None:
    """Where the cluster keeps accounting (slurmdbd): Slurm's own record of the ended job on
    the attempt, and its start and end as the attempt's (Slurm's clock, not when a pass saw
    them)."""
    record = slurm_states.accounting_of(target, attempt.slurm_job_id)
    if not record:
        return
    fields: dict[str, Any] = {"slurm_accounting": record}
    for name in ("start", "end"):
        at = parse_datetime(str(record.get(name) or ""))
        if at is not None:
            when = at.replace(tzinfo=UTC) if timezone.is_naive(at) else at
            fields["started" if name == "start" else "finished"] = when
    JobAttempt.objects.filter(pk=attempt.pk).update(**fields)


def _note_lost_lines(
    job: Job, replicas: list[Replica], said: dict[int, dict[str, Any] | None]
) -> None:
    """An instance whose wrapper could not send every line to Redis by its end: the job's
    reason says that its log lacks them, and where they are (never "succeeded" and silent)."""
    lost = [
        (tag_of(r.role, r.index), undelivered)
        for r in replicas
        if isinstance(data := said[r.pk], dict)
        and isinstance(undelivered := data.get("log_undelivered"), dict)
    ]
    if not lost:
        return
    where = lost[0][1]
    words = (
        f"its log is incomplete: lines of {', '.join(tag for tag, _ in lost)} never reached "
        f"Redis at {where.get('redis', '?')} from the Slurm nodes; they are in "
        f"{where.get('spool', 'the spool')} (docs/slurm.md, 'Connecting a real cluster')"
    )
    job.refresh_from_db()
    if words not in job.reason:
        transitions.set_job_reason(job, f"{job.reason}; {words}" if job.reason else words)


def _end_replicas(
    job: Job,
    replicas: list[Replica],
    said: dict[int, dict[str, Any] | None],
    slurm_words: str,
) -> None:
    """End each replica as its wrapper said (`said`, by replica id), or, without a word from
    it, as Slurm says (`slurm_words`); failures first (the earliest decides the job's reason),
    then the rest."""
    attempt_number = replicas[0].attempt
    ends: list[tuple[str, int | None, str, float | None]] = []
    for replica in replicas:
        ended = _outcome(said[replica.pk])
        if ended is None:
            # No word from its wrapper: its node died, or Slurm killed the step before it could
            # write. Slurm's reason is the replica's.
            current = job.is_active and attempt_number == job.attempt
            state = Replica.State.FAILED if current else Replica.State.STOPPED
            ends.append((state, None, slurm_words, None))
        else:
            ends.append(ended)
    order = sorted(
        zip(replicas, ends, strict=True),
        key=lambda pair: (pair[1][0] != Replica.State.FAILED, pair[1][3] or 0.0),
    )
    for replica, (how, exit_code, reason, ended_at) in order:
        # Its step's use, from the cgroups the site's task/cgroup made (where it has them).
        reports.record_usage(replica, _step_usage(said[replica.pk]))
        outcomes.replica_ended(
            job,
            replica,
            how,
            reason=reason,
            exit_code=exit_code,
            cause_at=datetime.fromtimestamp(ended_at, UTC) if ended_at else None,
        )
        job.refresh_from_db()


def _outcome(data: dict[str, Any] | None) -> tuple[str, int | None, str, float | None] | None:
    """How the instance's step wrapper said it ended: state, exit code, reason, when."""
    if data is None:
        return None
    # The wrapper names its end as an agent's report does.
    state = reports.AGENT_OUTCOMES.get(str(data.get("state")), Replica.State.FAILED)
    reason = str(data.get("reason", "")) if state != Replica.State.SUCCEEDED else ""
    code = data.get("exit_code")
    at = data.get("ended_at")
    return (
        state,
        code if isinstance(code, int) else None,
        reason,
        float(at) if isinstance(at, int | float) else None,
    )


def _step_usage(data: dict[str, Any] | None) -> dict[str, Any] | None:
    usage = data.get("usage") if data is not None else None
    return usage if isinstance(usage, dict) else None


def _wrapper_said(folder: Path, replica: Replica) -> dict[str, Any] | None:
    """The instance's outcome file, as its step wrapper wrote it; None without one."""
    return _wrapper_file(outcome_file(folder, tag_of(replica.role, replica.index)))


# A step wrapper's files are a few hundred bytes; more is not one of them.
WRAPPER_FILE_LIMIT = 1 << 20


def _wrapper_file(path: Path) -> dict[str, Any] | None:
    """A JSON object a step wrapper wrote in its attempt's folder; None when it is not there or
    is not such a file. On a pool whose jobs run as their owners the folder is the job's: a
    link, a FIFO or a hard link planted there is refused (jobfiles), never followed, opened
    or waited on by the pass. The owner that counts is the folder's, which the console set."""
    folder = path.parent
    try:
        owner = os.stat(folder, follow_symlinks=False).st_uid
        data = json.loads(jobfiles.read_file(path, folder.parent, owner, limit=WRAPPER_FILE_LIMIT))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, jobfiles.UnsafeFile) as exc:
        log.warning("%s: not read: %s", path, exc)
        return None
    return data if isinstance(data, dict) else None


def _cancel(attempt: JobAttempt, target: SlurmTarget, report: PassReport) -> None:
    _scancel_on_commit(attempt.slurm_job_id, target)
    report.cancelled += 1


def _scancel_on_commit(slurm_id: str, target: SlurmTarget) -> None:
    def scancel() -> None:
        try:
            slurm_client.run_client(["scancel", slurm_id], target)
        except SlurmError as exc:
            log.warning("scancel %s: %s (the next pass tries again)", slurm_id, exc)

    transaction.on_commit(scancel, robust=True)


def _reconcile(
    pool: SlurmPool,
    target: SlurmTarget,
    statuses: dict[str, SlurmStatus],
    report: PassReport,
) -> None:
    """Cancel Slurm jobs of this pool that no attempt of an active job is. Ours: named
    trainyard-<id> and working in this pool's shared root (another console on the same Slurm
    has a root of its own)."""
    wanted = set(
        JobAttempt.objects.filter(job__slurm_pool=pool, job__state__in=Job.ACTIVE_STATES)
        .exclude(slurm_job_id="")
        .values_list("slurm_job_id", flat=True)
    )
    # Read after squeue (the caller's `statuses`): a job another pass submitted before it has
    # its mark or its id committed by now, so it is never taken for a stray.
    submitting = {
        f"{slurm_batch.JOB_NAME_PREFIX}{job_id}"
        for job_id in JobAttempt.objects.filter(
            job__slurm_pool=pool, slurm_submitting__isnull=False
        ).values_list("job_id", flat=True)
    }
    jobs_root = str(slurm_batch.jobs_folder(target)) + "/"
    for slurm_id, status in statuses.items():
        if status.name in submitting:
            continue
        ours = status.name.startswith(slurm_batch.JOB_NAME_PREFIX) and (
            status.folder + "/"
        ).startswith(jobs_root)
        if not ours or slurm_id in wanted:
            continue
        if status.state not in (Job.State.QUEUED, Job.State.RUNNING):
            continue
        if JobAttempt.objects.filter(slurm_job_id=slurm_id, job__slurm_pool=pool).exists():
            continue  # an attempt of an ended job: _apply cancels it, and follows it to its end
        log.warning(
            "Slurm job %s (%s) is no job's of this console: cancelling it", slurm_id, status.name
        )
        try:
            slurm_client.run_client(["scancel", slurm_id], target)
            report.cancelled += 1
        except SlurmError as exc:
            report.errors.append(f"scancel {slurm_id}: {exc}")


def _partitions_words(partitions: str) -> str:
    names = partitions.split(",")
    return f"partition {names[0]}" if len(names) == 1 else f"partitions {', '.join(names)}"
