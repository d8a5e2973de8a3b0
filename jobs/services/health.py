"""Health rules at work: the log keeper feeds every running job's log lines and metric points to
the job's rules (jobs.healthrules), and asks them about silence once a pass. What fires is
recorded (HealthEvent), said in the instance's own log, and acted on:

- warn: nothing more;
- stop: the job fails with the rule and the measured value as its reason, never restarted;
- restart: the whole job restarts, using up a restart (it fails when none is left);
- restart-exclude-node: the same, and later attempts avoid the instance's node.

One keeper watches every job, so no job's rules may hold it up: log patterns run on RE2 (linear
time) and under a CPU budget per job (workers/userregex.py); a rule that goes over it, or a
stored rule that today's checks refuse, is switched off for that job alone, and the job's
health events and log say so (action "switched-off").

A watch covers one attempt of one job and lives in the keeper's memory: after the keeper
restarts, the clocks of the no-progress rules start again from then (a rule never fires on a
guess), which can only make a hang be noticed later, never wrongly.
"""

import logging
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass

import redis
from django.db import transaction

from jobs import logstream
from jobs.healthrules import Firing, SwitchedOff, Watch, parse_stored_rules
from jobs.models import Framework, HealthEvent, Job, JobAttempt, Replica
from jobs.services.lifecycle import events, outcomes, restarts
from workers import contract
from workers.logsink import LogBatch, LogSink
from workers.userregex import MatchBudget

log = logging.getLogger(__name__)

WATCHED_STATES = (Job.State.QUEUED, Job.State.RUNNING)
SWITCHED_OFF = "switched-off"  # a HealthEvent's action for a rule the console stopped running
# Roles whose steps are progress: a parameter server's scheduler and servers take no steps.
PROGRESS_ROLES: dict[str, frozenset[str] | None] = {
    Framework.PYTORCH: None,
    Framework.KVSTORE: frozenset({"worker"}),
}


@dataclass
class _AttemptWatch:
    attempt: int
    watch: Watch


class HealthMonitor:
    """The watches of the running jobs that have rules; one per keeper process."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client
        self._by_job: dict[int, _AttemptWatch] = {}

    def refresh(self) -> None:
        """Watch the jobs that run now, each for its current attempt; forget the others."""
        jobs = Job.objects.filter(state__in=WATCHED_STATES).select_related("image")
        seen: set[int] = set()
        for job in jobs:
            if not job.health_rules:
                continue
            seen.add(job.pk)
            current = self._by_job.get(job.pk)
            if current is None or current.attempt != job.attempt:
                self._by_job[job.pk] = _AttemptWatch(job.attempt, _watch_for(job))
        for job_id in set(self._by_job) - seen:
            del self._by_job[job_id]

    def entries(self, job_id: int, entries: Iterable[tuple[str, dict[str, str]]]) -> None:
        """New stream entries of a job, in order, as the keeper read them."""
        watched = self._by_job.get(job_id)
        if watched is None:
            return
        firings: list[Firing] = []
        for entry_id, fields in entries:
            batch = logstream.parse_entry(entry_id, fields)
            if batch.attempt != watched.attempt or batch.kind != "lines":
                continue
            if batch.is_metrics:
                for point in batch.points():
                    firings += watched.watch.metric(
                        batch.role,
                        batch.index,
                        str(point["name"]),
                        logstream.point_value(point),
                        point.get("step"),
                        float(point.get("ts") or batch.ts),
                    )
            else:
                firings += watched.watch.lines(
                    batch.role, batch.index, batch.lines, batch.stream, batch.ts
                )
        self._act(job_id, watched.attempt, firings)
        for off in watched.watch.take_switched_off():
            try:
                switched_off(job_id, watched.attempt, off.rule.name, off.message, off, self._client)
            except Exception:  # as for a firing: the keeper goes on archiving
                log.exception("recording switched-off rule %r of job %s failed", off.rule, job_id)

    def tick(self, now: float | None = None) -> None:
        """Judge the rules that fire on silence, for every watched job."""
        now = time.time() if now is None else now
        for job_id, watched in list(self._by_job.items()):
            self._act(job_id, watched.attempt, watched.watch.tick(now))

    def _act(self, job_id: int, attempt: int, firings: list[Firing]) -> None:
        for firing in firings:
            try:
                fired(job_id, attempt, firing, self._client)
            except Exception:  # one bad firing must not stop the keeper archiving logs
                log.exception("acting on health rule %r of job %s failed", firing.rule, job_id)


def _watch_for(job: Job) -> Watch:
    # Checked at submission; but a rule stored before a check existed (a pattern RE2 refuses)
    # or a row an admin edited is switched off alone, and the job says so.
    rules, problems = parse_stored_rules(job.health_rules)
    for problem in problems:
        switched_off(job.pk, job.attempt, "stored rule", problem)
    attempt = JobAttempt.objects.filter(job=job, number=job.attempt).first()
    started = attempt.started if attempt and attempt.started else None
    return Watch(
        rules,
        started.timestamp() if started else None,
        progress_roles=PROGRESS_ROLES.get(job.image.framework),
        budget=MatchBudget(),
    )


def switched_off(
    job_id: int,
    attempt: int,
    rule: str,
    message: str,
    where: SwitchedOff | None = None,
    client: redis.Redis | None = None,
) -> None:
    """Record, once per attempt, that a rule of the job no longer runs and why: a health event
    on the job's page and in the API, and (when the instance is known) a line in its log."""
    with transaction.atomic():
        job = outcomes.locked_job(job_id)
        if job is None or job.attempt != attempt:
            return
        said = HealthEvent.objects.filter(
            job=job, attempt=attempt, action=SWITCHED_OFF, message=message
        ).exists()
        if said:  # the keeper restarted and looked at the same stored rule again
            return
        role, index = (where.role, where.index) if where is not None else ("", 0)
        HealthEvent.objects.create(
            job=job,
            attempt=attempt,
            rule=rule,
            action=SWITCHED_OFF,
            role=role,
            index=index,
            message=message,
            outcome="the rule was switched off for this attempt",
        )
        events.state_changed_on_commit(job.pk)
    if client is not None and where is not None:
        node = _node_of(job_id, attempt, where.role, where.index)
        _write_note(client, job_id, attempt, where.role, where.index, node, message)


def fired(job_id: int, attempt: int, firing: Firing, client: redis.Redis | None = None) -> str:
    """Record a firing and act on it; returns what was done, in words ("" if nothing: the
    attempt it was about has ended meanwhile)."""
    if (
        client is not None
        and Job.objects.filter(pk=job_id, attempt=attempt, state__in=WATCHED_STATES).exists()
    ):
        # Said first, so that it comes before the lines of the stop or restart it causes.
        node = _node_of(job_id, attempt, firing.role, firing.index)
        _write_note(
            client,
            job_id,
            attempt,
            firing.role,
            firing.index,
            node,
            f"health rule fired: {firing.message}",
        )
    with transaction.atomic():
        job = outcomes.locked_job(job_id)
        if job is None or job.attempt != attempt or job.state not in WATCHED_STATES:
            return ""
        replica = (
            restarts.current_replicas(job)
            .filter(role=firing.role, index=firing.index)
            .select_related("node")
            .first()
        )
        node = replica.node.name if replica is not None and replica.node else ""
        outcome = _apply(job, firing, node)
        HealthEvent.objects.create(
            job=job,
            attempt=attempt,
            rule=firing.rule.name,
            action=firing.action,
            role=firing.role,
            index=firing.index,
            node=node,
            value=_json_number(firing.value),
            message=firing.message,
            outcome=outcome,
        )
        events.state_changed_on_commit(job.pk)
    return outcome


def _json_number(value: float | None) -> float | str | None:
    """JSON has no NaN or infinity: say them in words."""
    if value is None or math.isfinite(value):
        return value
    return str(value)


# What each action that ends the attempt is, as a cause of its end (restarts.decide).
RULE_CAUSES = {
    "stop": restarts.Cause.RULE_STOP,
    "restart": restarts.Cause.RULE_RESTART,
    "restart-exclude-node": restarts.Cause.RULE_RESTART_AWAY,
}


def _apply(job: Job, firing: Firing, node: str) -> str:
    if firing.action == "warn":
        return "warned"
    cause = RULE_CAUSES[firing.action]
    why = f"health rule: {firing.message}"
    decision = outcomes.end_attempt(job, cause, why, "stopped by health rule", node=node)
    if decision.restart:
        away = f", away from {node}" if decision.exclude else ""
        return f"restarting the job{away} (restart {job.restarts_used} of {job.max_restarts})"
    if cause is restarts.Cause.RULE_STOP:
        return "stopped the job"
    return "stopped the job: no restart left"


def _node_of(job_id: int, attempt: int, role: str, index: int) -> str:
    node = (
        Replica.objects.filter(job_id=job_id, attempt=attempt, role=role, index=index)
        .values_list("node__name", flat=True)
        .first()
    )
    return node or ""


def _write_note(
    client: redis.Redis, job_id: int, attempt: int, role: str, index: int, node: str, note: str
) -> None:
    """A note in the instance's own log (as from its node), where whoever reads the log will
    see it."""
    batch = LogBatch(
        job_id=job_id,
        role=role,
        index=index,
        node=node,
        stream=contract.STREAM_STDERR,
        ts=time.time(),
        lines=[f"[trainyard] {note}"],
        writer=f"health-{time.time_ns()}",
        seq=1,
        attempt=attempt,
    )
    try:
        LogSink(client).append([batch])
    except redis.RedisError as exc:  # the event is in the database and on the job page
        log.warning("could not write a health note into job %s's log: %s", job_id, exc)
