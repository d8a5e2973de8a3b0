"""The one writer of job and replica state.

Every change is a transition that `Job.TRANSITIONS` or `Replica.TRANSITIONS` allows, written as
a guarded UPDATE (`... WHERE state IN (states that may move there)`): of two writers racing to
end the same replica (an agent's report and the reconciler, or two reconcilers), exactly one
wins and the other learns it lost from the row count, so nothing is decided twice.

Websocket clients hear of each change once the transaction commits (jobs.services.lifecycle.events).
"""

from datetime import datetime
from typing import Any

from django.db.models import F, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from jobs.models import Job, JobAttempt, Replica
from jobs.services.lifecycle import events, experiment_requests


class InvalidTransition(Exception):
    """The job is not in a state that allows this; the message says which state it is in."""


def sources(table: dict[str, frozenset[str]], target: str) -> list[str]:
    """The states a transition to `target` may start from."""
    return [state for state, targets in table.items() if target in targets]


def move_job(
    job: Job,
    to: str,
    reason: str | None = None,
    *,
    strict: bool = False,
    announce: bool = True,
    **also: Any,
) -> bool:
    """Move the job to state `to` if the table allows it from the state it is in now, writing
    the fields in `also` with it (a restart's new attempt number, say).

    Returns whether it moved; with `strict`, raises InvalidTransition instead of returning
    False. `job` is updated in place. `announce=False` tells no websocket client, for a job
    so new that none can be listening.
    """
    now = timezone.now()
    fields: dict[str, Any] = {"state": to, **also}
    if reason is not None:
        fields["reason"] = reason
    if to == Job.State.RUNNING:
        fields["started"] = Coalesce(F("started"), Value(now))
    if to in Job.TERMINAL_STATES:
        fields["finished"] = now
    moved = Job.objects.filter(pk=job.pk, state__in=sources(Job.TRANSITIONS, to)).update(**fields)
    if not moved:
        current = Job.objects.filter(pk=job.pk).values_list("state", flat=True).first()
        if strict:
            raise InvalidTransition(_refusal(job.pk, current, to))
        return False
    job.refresh_from_db(fields=["state", "reason", "started", "finished", *also])
    if to == Job.State.QUEUED:
        JobAttempt.objects.filter(job_id=job.pk, number=job.attempt).update(queued=now)
    if to in Job.TERMINAL_STATES:
        # A lender that ends before it ran (cancelled while it waited) has no room to keep.
        end_reservation(job.pk)
        # A trial's end lets its experiment tell the searcher and start the next trial.
        experiment_requests.job_ended(job.pk)
    if announce:
        events.state_changed_on_commit(job.pk)
    return True


def _refusal(job_id: int, current: str | None, to: str) -> str:
    if current in Job.TERMINAL_STATES:
        return f"Job {job_id} has already ended ({current})."
    return f"Job {job_id} cannot go from {current} to {to}."


def set_job_reason(job: Job, reason: str) -> bool:
    """Say why the job waits or ended, without changing its state."""
    if job.reason == reason:
        return False
    moved = Job.objects.filter(pk=job.pk, state=job.state).update(reason=reason)
    if moved:
        job.reason = reason
        events.state_changed_on_commit(job.pk)
    return bool(moved)


def set_waiting_reasons(reasons: dict[int, str]) -> int:
    """Say why each of these queued jobs waits: {job id: reason}, the reasons a scheduling
    pass found changed. One UPDATE per distinct reason (jobs alike wait alike: ten thousand
    waiting jobs have a few reasons), never touching a job that left the queue meanwhile.
    Returns how many jobs were given a new reason."""
    by_reason: dict[str, list[int]] = {}
    for job_id, reason in reasons.items():
        by_reason.setdefault(reason, []).append(job_id)
    written = 0
    for reason, job_ids in by_reason.items():
        for start in range(0, len(job_ids), _IDS_PER_UPDATE):
            chunk = job_ids[start : start + _IDS_PER_UPDATE]
            written += Job.objects.filter(pk__in=chunk, state=Job.State.QUEUED).update(
                reason=reason
            )
            for job_id in chunk:
                events.state_changed_on_commit(job_id)
    return written


def set_estimated_start(job_id: int | None, start: datetime | None) -> None:
    """The start reserved for the queue's head in this pass (job_id None: none is); every
    other job's estimate is cleared, and only a change is written."""
    others = Job.objects.filter(estimated_start__isnull=False)
    if job_id is not None:
        others = others.exclude(pk=job_id)
        mine = Job.objects.filter(pk=job_id, state=Job.State.QUEUED)
        if mine.exclude(estimated_start=start).exists():  # as below: write only a change
            mine.update(estimated_start=start)
    if others.exists():  # a read, off an index: most passes have nothing to clear
        others.update(estimated_start=None)


# Ids in one UPDATE's IN list: within every database's limit on a statement's parameters.
_IDS_PER_UPDATE = 900


def move_replica(replica: Replica, to: str, **fields: Any) -> bool:
    """Move one replica to `to` if the table allows it from the state it is in now, writing
    `fields` with it; `replica` is updated in place. Returns whether it moved."""
    allowed = sources(Replica.TRANSITIONS, to)
    if to in Replica.FINAL_STATES:
        fields.setdefault("finished", timezone.now())
    moved = Replica.objects.filter(pk=replica.pk, state__in=allowed).update(state=to, **fields)
    if not moved:
        return False
    replica.state = to
    for name, value in fields.items():
        setattr(replica, name, value)
    events.state_changed_on_commit(replica.job_id)
    return True


def place_replicas(replicas: list[Replica], sent: datetime) -> None:
    """pending -> assigned for replicas whose `node` the scheduler has just set, in one query
    per node (the scheduler holds the node locks, so none of them can have moved meanwhile)."""
    by_node: dict[int, list[int]] = {}
    for replica in replicas:
        assert replica.node_id is not None
        by_node.setdefault(replica.node_id, []).append(replica.pk)
    for node_id, ids in by_node.items():
        moved = Replica.objects.filter(pk__in=ids, state=Replica.State.PENDING).update(
            state=Replica.State.ASSIGNED, node_id=node_id, start_sent=sent, starts_sent=1
        )
        assert moved == len(ids), "replicas moved while the scheduler held the node locks"
    for replica in replicas:
        replica.state = Replica.State.ASSIGNED
        replica.start_sent = sent
        replica.starts_sent = 1
    for job_id, attempt in {(r.job_id, r.attempt) for r in replicas}:
        # The attempt holds its nodes from now: its time limit counts from here.
        JobAttempt.objects.filter(job_id=job_id, number=attempt).update(placed=sent)
        events.state_changed_on_commit(job_id)


def stop_unplaced(job: Job, attempt: int | None = None) -> int:
    """pending -> stopped for the replicas of a job (of one attempt, if given) that ended
    before they were placed."""
    unplaced = Replica.objects.filter(job=job, state=Replica.State.PENDING)
    if attempt is not None:
        unplaced = unplaced.filter(attempt=attempt)
    stopped = unplaced.update(
        state=Replica.State.STOPPED,
        finished=timezone.now(),
        reason="the job ended before it ran" if attempt is None else "the attempt ended first",
    )
    if stopped:
        events.state_changed_on_commit(job.pk)
    return stopped


def mark_borrowed(job: Job, borrowed: bool) -> None:
    """Note whether the job's attempt now being placed runs on borrowed capacity (beyond its
    group's nominal share: jobs.services.scheduler.borrowing)."""
    if job.borrowed != borrowed:
        Job.objects.filter(pk=job.pk).update(borrowed=borrowed)
        job.borrowed = borrowed


def note_reclaimed(victim: Job, lender_id: int) -> None:
    """The victim's attempt was stopped to return borrowed capacity to job `lender_id`: that
    room stays reserved for the lender until it starts (jobs.services.scheduler.reclaim)."""
    Job.objects.filter(pk=victim.pk).update(reclaimed_for=lender_id, borrowed=False)
    victim.reclaimed_for = lender_id
    victim.borrowed = False


def end_reservation(lender_id: int) -> None:
    """What was reclaimed for the lender is reserved for it no longer: it has its room, or it
    ended without (cancelled while it waited)."""
    Job.objects.filter(reclaimed_for=lender_id).update(reclaimed_for=None)


def note_preempted(job: Job, attempt: int, by: int) -> None:
    """Job `by` preempted the job's attempt `attempt`: add it to the jobs that preempted the job
    (jobs.services.scheduler.preemption reads them), and record it on that attempt."""
    job.preempted_by = [*job.preempted_by, by]
    Job.objects.filter(pk=job.pk).update(preempted_by=job.preempted_by)
    JobAttempt.objects.filter(job=job, number=attempt).update(preempted_by=by)
