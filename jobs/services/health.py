"""Health rules at work: the log keeper feeds every running job's log lines and metric points to
the job's rules (jobs.healthrules), and asks them about silence once a pass. What fires is
recorded (HealthEvent), said in the instance's own log, and acted on:

- warn: nothing more;
- stop: the job fails with the rule and the measured value as its reason, never restarted;
- restart: the whole job restarts, using up a restart (it fails when none is left);
- restart-exclude-node: the same, and later attempts avoid the instance's node.

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
from jobs.healthrules import Firing, RuleError, Watch, parse_rules
from jobs.models import Framework, HealthEvent, Job, JobAttempt, Replica
from jobs.services import events, outcomes, presenters, restarts
from workers import contract
from workers.logsink import LogBatch, LogSink

log = logging.getLogger(__name__)

WATCHED_STATES = (Job.State.QUEUED, Job.State.RUNNING)
# Roles whose steps are progress: a parameter server's scheduler and servers take no steps.
PROGRESS_ROLES: dict[str, frozenset[str] | None] = {
    Framework.PYTORCH: None,
    Framework.KVSTORE: frozenset({"worker"}),
}


@dataclass
class _Watched:
    attempt: int
    watch: Watch


class HealthMonitor:
    """The watches of the running jobs that have rules; one per keeper process."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client
        self._watched: dict[int, _Watched] = {}

    def refresh(self) -> None:
        """Watch the jobs that run now, each for its current attempt; forget the others."""
        jobs = Job.objects.filter(state__in=WATCHED_STATES).select_related("image")
        seen: set[int] = set()
        for job in jobs:
            if not job.health_rules:
                continue
            seen.add(job.pk)
            current = self._watched.get(job.pk)
            if current is None or current.attempt != job.attempt:
                watch = _watch_for(job)
                if watch is not None:
                    self._watched[job.pk] = _Watched(job.attempt, watch)
        for job_id in set(self._watched) - seen:
            del self._watched[job_id]

    def entries(self, job_id: int, entries: Iterable[tuple[str, dict[str, str]]]) -> None:
        """New stream entries of a job, in order, as the keeper read them."""
        watched = self._watched.get(job_id)
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
                for text in batch.lines:
                    firings += watched.watch.line(
                        batch.role, batch.index, text, batch.stream, batch.ts
                    )
        self._act(job_id, watched.attempt, firings)

    def tick(self, now: float | None = None) -> None:
        """Judge the rules that fire on silence, for every watched job."""
        now = time.time() if now is None else now
        for job_id, watched in list(self._watched.items()):
            self._act(job_id, watched.attempt, watched.watch.tick(now))

    def _act(self, job_id: int, attempt: int, firings: list[Firing]) -> None:
        for firing in firings:
            try:
                fired(job_id, attempt, firing, self._client)
            except Exception:  # one bad firing must not stop the keeper archiving logs
                log.exception("acting on health rule %r of job %s failed", firing.rule, job_id)


def _watch_for(job: Job) -> Watch | None:
    try:
        rules = parse_rules(job.health_rules)
    except RuleError as exc:  # checked at submission; an admin may have edited the row since
        log.warning("job %s: health rules ignored: %s", job.pk, exc)
        return None
    attempt = JobAttempt.objects.filter(job=job, number=job.attempt).first()
    started = attempt.started if attempt and attempt.started else None
    return Watch(
        rules,
        started.timestamp() if started else None,
        progress_roles=PROGRESS_ROLES.get(job.image.framework),
    )


def fired(job_id: int, attempt: int, firing: Firing, client: redis.Redis | None = None) -> str:
    """Record a firing and act on it; returns what was done, in words ("" if nothing: the
    attempt it was about has ended meanwhile)."""
    if (
        client is not None
        and Job.objects.filter(pk=job_id, attempt=attempt, state__in=WATCHED_STATES).exists()
    ):
        # Said first, so that it comes before the lines of the stop or restart it causes.
        _say_in_log(client, job_id, attempt, firing, _node_of(job_id, attempt, firing))
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
        events.state_changed_on_commit(job.pk, presenters.state_of)
    return outcome


def _json_number(value: float | None) -> float | str | None:
    """JSON has no NaN or infinity: say them in words."""
    if value is None or math.isfinite(value):
        return value
    return str(value)


def _apply(job: Job, firing: Firing, node: str) -> str:
    why = f"health rule: {firing.message}"
    if firing.action == "warn":
        return "warned"
    if firing.action == "stop":
        outcomes.fail(job, restarts.final_reason(job, why), "stopped by health rule")
        return "stopped the job"
    exclude = [node] if firing.action == "restart-exclude-node" and node else []
    if restarts.may_restart(job):
        restarts.begin(job, why, exclude=exclude)
        away = f", away from {node}" if exclude else ""
        return f"restarting the job{away} (restart {job.restarts_used} of {job.max_restarts})"
    outcomes.fail(job, restarts.final_reason(job, why), "stopped by health rule")
    return "stopped the job: no restart left"


def _node_of(job_id: int, attempt: int, firing: Firing) -> str:
    node = (
        Replica.objects.filter(job_id=job_id, attempt=attempt, role=firing.role, index=firing.index)
        .values_list("node__name", flat=True)
        .first()
    )
    return node or ""


def _say_in_log(client: redis.Redis, job_id: int, attempt: int, firing: Firing, node: str) -> None:
    """The firing, in the instance's own log (as from its node), where whoever reads the log
    will see it."""
    batch = LogBatch(
        job_id=job_id,
        role=firing.role,
        index=firing.index,
        node=node,
        stream=contract.STREAM_STDERR,
        ts=time.time(),
        lines=[f"[trainyard] health rule fired: {firing.message}"],
        writer=f"health-{time.time_ns()}",
        seq=1,
        attempt=attempt,
    )
    try:
        LogSink(client).append([batch])
    except redis.RedisError as exc:  # the event is in the database and on the job page
        log.warning("could not write a health note into job %s's log: %s", job_id, exc)
