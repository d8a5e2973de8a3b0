"""Reconciliation: the database says what should run, agents' heartbeats say what does run;
each pass repairs the difference, one replica at a time.

- A node silent for longer than TRAINYARD_NODE_LOST_SECONDS, while the console could hear it,
  is lost: every replica on it fails ("node-1 lost: no heartbeat for 45 s").
- A replica its agent does not run:
  - ended there, by the agent's recent outcomes (its exit report was lost): that outcome;
  - the agent restarted since the replica started: failed, dated the old agent's last word;
  - assigned, its start never acknowledged: the start is sent again, up to
    TRAINYARD_START_ATTEMPTS times, then it fails as never started;
  - running, or its job has ended: gone, i.e. failed, or for an ended job the stop it waited
    for.
- A replica the agent runs although its job has ended: the stop is sent again.
- A process the agent runs that the database does not want running: told to stop.
- A job whose attempt has held its nodes for its whole time limit is stopped and fails
  ("time limit of 2 h reached", jobs.services.lifecycle.time_limits).
- Every agent's Redis ACL user is as the database says (jobs.services.agent_access): re-made
  after Redis restarts, a job's keys taken away once it ended there.

Whatever a pass decides, it decides against the rows as they are when it writes (each repair
re-reads its replica under the job's row lock, and every state write is a guarded transition),
so a second pass running at once, or a late report from an agent, does no harm: one of them
applies a change, the other finds nothing left to do. Messages to agents are idempotent.

A judgement needs evidence newer than the message it is about: nothing is concluded from a
heartbeat that may have been sent before the start or stop it would acknowledge
(TRAINYARD_ACK_GRACE_SECONDS), nor from silence while the console itself could not listen (its
worker starting, or Redis away): `listening_since` is when that last changed.
"""

import logging
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone
from redis import RedisError

from jobs.models import Job, Node, Replica
from jobs.redis_client import get_redis
from jobs.services import agent_access
from jobs.services.lifecycle import dispatch, elastic, outcomes, reports, restarts, time_limits
from jobs.services.periodic import PeriodicPass
from jobs.services.scheduler import scheduling

log = logging.getLogger(__name__)

ReplicaKey = tuple[int, int, str, int]  # job id, attempt, role, index


@dataclass
class PassReport:
    """What one pass looked at and what it did."""

    nodes: int = 0
    replicas: int = 0
    lost_nodes: list[str] = field(default_factory=list)
    ended: int = 0  # replicas failed or stopped because they are gone
    outcomes_applied: int = 0  # ends taken from heartbeats, their exit reports lost
    starts_resent: int = 0
    stops_resent: int = 0
    strays_stopped: int = 0
    restarts_resumed: int = 0
    taken_over: int = 0  # running replicas a new agent took over from their keepers
    timed_out: int = 0  # jobs stopped at their time limit
    seconds: float = 0.0

    @property
    def repaired(self) -> int:
        return (
            self.ended
            + self.outcomes_applied
            + self.starts_resent
            + self.stops_resent
            + self.strays_stopped
            + self.restarts_resumed
        )

    def summary(self) -> str:
        lost = f", lost nodes {', '.join(self.lost_nodes)}" if self.lost_nodes else ""
        if self.taken_over:
            lost += f", {self.taken_over} replicas taken over by restarted agents"
        if self.timed_out:
            lost += f", {self.timed_out} jobs stopped at their time limit"
        return (
            f"reconciled {self.replicas} replicas on {self.nodes} nodes in "
            f"{self.seconds * 1000:.0f} ms: {self.ended} ended, {self.outcomes_applied} outcomes "
            f"from heartbeats, {self.starts_resent} starts and {self.stops_resent} stops sent "
            f"again, {self.strays_stopped} stray processes stopped, {self.restarts_resumed} "
            f"restarted jobs queued{lost}"
        )


def _key(entry: dict[str, Any]) -> ReplicaKey:
    return (
        int(entry["job_id"]),
        int(entry.get("attempt", 0)),
        str(entry["role"]),
        int(entry["index"]),
    )


@dataclass(slots=True)
class HeldReplica:
    """A replica that holds capacity, as a pass compares it: plain values. At 10,000 replicas,
    reading them (and their jobs) as model instances took most of a pass (issue 24); one to
    repair is read again whole (_repair)."""

    pk: int
    job_id: int
    attempt: int
    role: str
    index: int
    node_id: int
    state: str
    incarnation: str
    start_sent: datetime | None
    started: datetime | None
    starts_sent: int
    stop_sent: datetime | None
    job_state: str
    job_attempt: int


_FIELDS = (
    "id", "job_id", "attempt", "role", "index", "node_id", "state", "incarnation",
    "start_sent", "started", "starts_sent", "stop_sent", "job__state", "job__attempt",
)  # fmt: skip


def _key_of(replica: HeldReplica) -> ReplicaKey:
    return (replica.job_id, replica.attempt, replica.role, replica.index)


def _unwanted(replica: HeldReplica) -> bool:
    """Should the replica's processes be gone? Its job ended, or restarted since."""
    return replica.job_state not in Job.ACTIVE_STATES or replica.attempt < replica.job_attempt


def run_pass(listening_since: datetime | None = None, now: datetime | None = None) -> PassReport:
    """One reconciliation pass over every node and every replica that holds capacity."""
    started = time.perf_counter()
    now = now or timezone.now()
    report = PassReport()
    holding: dict[int, list[HeldReplica]] = defaultdict(list)
    for replica in _holding_replicas(Replica.objects.all()):
        holding[replica.node_id].append(replica)
    for node in Node.objects.order_by("name"):
        _check_node(node, holding.pop(node.pk, []), now, listening_since, report)
    report.restarts_resumed = _resume_restarts()
    report.timed_out = time_limits.enforce(now)
    if report.repaired or _jobs_wait() or elastic.may_grow():
        # Room was freed, or a schedule request was lost with a broker that went away, or an
        # elastic job may have held its size long enough to grow.
        scheduling.schedule()
    report.seconds = time.perf_counter() - started
    return report


def _holding_replicas(replicas: QuerySet[Replica]) -> list[HeldReplica]:
    """Those of `replicas` that hold capacity, as the pass compares them."""
    held = replicas.filter(state__in=Replica.HOLDING_STATES, node__isnull=False)
    return [HeldReplica(*row) for row in held.order_by("id").values_list(*_FIELDS)]


def check_node_now(name: str) -> PassReport:
    """Reconcile one node at once (its agent has just come back as a new incarnation)."""
    report = PassReport()
    node = Node.objects.filter(name=name).first()
    if node is not None:
        replicas = _holding_replicas(Replica.objects.filter(node=node))
        _check_node(node, replicas, timezone.now(), None, report)
    return report


def _resume_restarts() -> int:
    """Restarting jobs whose back-off is over and whose old processes are gone: queue their
    next attempt (the delayed task that should have done it may have been lost)."""
    resumed = 0
    for job_id in Job.objects.filter(state=Job.State.RESTARTING).values_list("pk", flat=True):
        with transaction.atomic():
            job = outcomes.locked_job(job_id)
            if job is not None:
                resumed += int(restarts.resume_if_due(job))
    return resumed


def _jobs_wait() -> bool:
    return Replica.objects.filter(
        state=Replica.State.PENDING, job__state=Job.State.QUEUED, job__slurm_pool__isnull=True
    ).exists()


def _check_node(
    node: Node,
    replicas: list[HeldReplica],
    now: datetime,
    listening_since: datetime | None,
    report: PassReport,
) -> None:
    report.nodes += 1
    report.replicas += len(replicas)
    heard = node.last_heartbeat
    if heard is None:
        return
    silent_since = max(heard, listening_since) if listening_since else heard
    if (now - silent_since).total_seconds() > settings.TRAINYARD_NODE_LOST_SECONDS:
        if replicas:
            report.lost_nodes.append(node.name)
            reason = f"{node.name} lost: no heartbeat for {(now - heard).total_seconds():.0f} s"
            by_job: dict[int, list[HeldReplica]] = defaultdict(list)
            for replica in replicas:
                by_job[replica.job_id].append(replica)
            for together in by_job.values():
                # All of a job's replicas there at once: nobody sees the job failed by the
                # node with some of its instances on it still "running".
                report.ended += _repair(together, _fail(reason, cause_at=heard))
        return
    if node.is_lost(now):
        return  # late, not yet lost: a heartbeat may still come
    observed = {_key(e): e for e in node.running}
    finished = {_key(e): e for e in node.finished}
    grace = timedelta(seconds=settings.TRAINYARD_ACK_GRACE_SECONDS)
    for replica in replicas:
        key = _key_of(replica)
        seen = observed.get(key)
        if seen is not None:
            if replica.state == Replica.State.RUNNING and replica.incarnation != node.incarnation:
                # A new agent took the replica over from its keeper: it runs on, under it.
                report.taken_over += _repair(replica, _taken_over(node.incarnation))
            if (
                _unwanted(replica)
                and seen.get("state") != "stopping"
                and _unanswered(replica.stop_sent, heard, grace)
            ):
                report.stops_resent += _repair(replica, _stop_again)
            continue
        if key in finished:
            report.outcomes_applied += _apply_outcome(replica, node.name, finished[key])
            continue
        if (
            replica.state == Replica.State.RUNNING
            and replica.incarnation
            and replica.incarnation != node.incarnation
        ):
            # The agent that started it is gone, and the one that came back did not find it:
            # its keeper had already stopped it (the agent stayed away beyond the keeper's
            # grace) or died, at about the old agent's last heartbeat.
            last_word = node.previous_heartbeat or heard
            reason = (
                f"{node.name}: its agent stopped unexpectedly (last heard at "
                f"{last_word:%H:%M:%S} UTC) and was restarted; its trainers did not survive "
                "until then"
            )
            report.ended += _repair(replica, _fail(reason, cause_at=last_word))
            continue
        sent = replica.start_sent if replica.state == Replica.State.ASSIGNED else replica.started
        if _unwanted(replica):
            sent = max(filter(None, (sent, replica.stop_sent)), default=None)
        if not _unanswered(sent, heard, grace):
            continue  # the last heartbeat may predate the message
        if (
            not _unwanted(replica)
            and replica.state == Replica.State.ASSIGNED
            and replica.starts_sent < settings.TRAINYARD_START_ATTEMPTS
        ):
            report.starts_resent += _repair(replica, _start_again)
        elif not _unwanted(replica) and replica.state == Replica.State.ASSIGNED:
            reason = (
                f"{node.name}'s agent never started it "
                f"({replica.starts_sent} start messages went unanswered)"
            )
            report.ended += _repair(replica, _fail(reason))
        else:
            report.ended += _repair(replica, _gone)
    expected = {_key_of(r) for r in replicas}
    for key, entry in observed.items():
        if key not in expected and entry.get("state") != "stopping":
            report.strays_stopped += _stop_stray(node, key)


def _unanswered(sent: datetime | None, heard: datetime, grace: timedelta) -> bool:
    """Has a heartbeat come in long enough after `sent` to have acknowledged it?"""
    return sent is None or heard - sent > grace


Repair = Callable[[Job, Replica], bool]


def _repair(replicas: HeldReplica | list[HeldReplica], action: Repair) -> int:
    """Run `action` on each replica (all of one job) as it is now, in one transaction under
    their job's lock; how many it did something to.

    The pass read the replicas a moment ago: one that has moved on since (its agent reported,
    or another pass got there first) has nothing left to repair.
    """
    together = replicas if isinstance(replicas, list) else [replicas]
    done = 0
    with transaction.atomic():
        job = outcomes.locked_job(together[0].job_id)
        if job is None:
            return 0
        for replica in together:
            current = (
                Replica.objects.select_related("node", "job")
                .filter(pk=replica.pk, state=replica.state, node_id=replica.node_id)
                .first()
            )
            if current is not None:
                done += int(action(job, current))
    return done


def _fail(reason: str, cause_at: datetime | None = None) -> Repair:
    def fail(job: Job, replica: Replica) -> bool:
        return outcomes.replica_ended(
            job, replica, Replica.State.FAILED, reason, cause_at=cause_at or timezone.now()
        )

    return fail


def _taken_over(incarnation: str) -> Repair:
    def take_over(job: Job, replica: Replica) -> bool:
        return reports.replica_taken_over(replica, incarnation)

    return take_over


def _gone(job: Job, replica: Replica) -> bool:
    reports.not_running_on_its_node(job, replica)
    return True


def _start_again(job: Job, replica: Replica) -> bool:
    log.warning("no agent acknowledged %s of job %s: sending its start again", replica, job.pk)
    dispatch.resend_starts(job, [replica])
    return True


def _stop_again(job: Job, replica: Replica) -> bool:
    log.warning("%s of job %s still runs after its stop: sending the stop again", replica, job.pk)
    dispatch.send_stops_on_commit(
        job.pk, [replica], f"job {job.state}", up_to_attempt=replica.attempt
    )
    return True


def _apply_outcome(replica: HeldReplica, node: str, entry: dict[str, Any]) -> int:
    """An end the agent's heartbeat lists but whose exit report never arrived."""
    before = replica.state
    reports.replica_exited(
        replica.job_id,
        replica.role,
        replica.index,
        node,
        str(entry.get("state", "failed")),
        entry.get("exit_code"),
        str(entry.get("reason", "")),
        [],
        ended_at=entry.get("ended_at"),
        attempt=replica.attempt,
    )
    return int(Replica.objects.filter(pk=replica.pk).exclude(state=before).exists())


def _stop_stray(node: Node, key: ReplicaKey) -> int:
    """The agent runs something no holding replica accounts for: stop it, unless a fresh read
    shows it was placed there a moment ago."""
    job_id, attempt, role, index = key
    same = Replica.objects.filter(job_id=job_id, attempt=attempt, role=role, index=index, node=node)
    if same.filter(state__in=Replica.HOLDING_STATES).exists():
        return 0
    grace = timedelta(seconds=settings.TRAINYARD_ACK_GRACE_SECONDS)
    if same.filter(finished__gt=timezone.now() - grace).exists():
        # It ended a moment ago: the heartbeat may predate its exit, which the agent has
        # reported already; nothing to stop.
        return 0
    log.warning(
        "%s runs %s-%s of job %s (attempt %s), which should not run: stopping it",
        node, role, index, job_id, attempt + 1,
    )  # fmt: skip
    dispatch.send_stops(
        job_id,
        {node.name: [{"role": role, "index": index, "attempt": attempt}]},
        "it should not be running",
        up_to_attempt=attempt,
        only_listed=True,
    )
    return 1


class ReconcileLoop(PeriodicPass[PassReport]):
    """Reconciles every `interval` seconds until stopped; lives in the console worker."""

    what = "reconciliation"

    def __init__(self, interval: float) -> None:
        super().__init__(interval)
        self._listening_since: datetime | None = None

    def one_pass(self) -> PassReport | None:
        if not self._broker_answers():
            return None
        # Redis may have restarted, and lost the agents' ACL users with it; and a job that
        # ended a while ago is no business of its nodes' agents any more.
        agent_access.sync_quietly()
        report = run_pass(self._listening_since)
        if report.repaired or report.lost_nodes or report.timed_out:
            log.warning("%s", report.summary())
        return report

    def _broker_answers(self) -> bool:
        """Heartbeats reach us through Redis: while it is away, silence proves nothing."""
        try:
            get_redis().ping()
        except RedisError:
            if self._listening_since is not None:
                log.warning("Redis unreachable: no node is judged lost until it is back")
            self._listening_since = None
            return False
        if self._listening_since is None:
            self._listening_since = datetime.now(UTC)
        return True
