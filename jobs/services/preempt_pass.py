"""Preemption inside a scheduling pass: what `scheduling.schedule` does for a waiting job that
does not fit and whose priority class may preempt.

The policy (which jobs) is `jobs.services.preemption`, pure; here the database's jobs become
its plain values, the chosen victims are evicted (SIGTERM, the grace, back to the queue), and
the room they free is reserved for the preemptor until it starts: it is placed only once their
processes are gone (their agents report them stopped), and no lower-priority job that waits
may take that room in between.
"""

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db.models import F

from jobs.models import Job, JobAttempt, PriorityClass, Replica
from jobs.services import transitions
from jobs.services.placement import Demand, Room, place
from jobs.services.preemption import Held, Preemptor, Running, choose_victims, rooms_without
from jobs.services.waiting import Holding, jobs_in_words


@dataclass
class Outcome:
    """What a preemptor got in this pass: the reason it shows while it waits, and the jobs it
    evicted now (none when it waits for earlier victims to stop)."""

    reason: str
    evicted: list[int]


class PreemptionPass:
    """One scheduling pass's view of preemption: read lazily, once, only when a job that may
    preempt does not fit (most passes have none)."""

    def __init__(self, held: list[Holding], now: datetime) -> None:
        self.held = held
        self.now = now
        self._classes: dict[int, PriorityClass] | None = None
        self._stopping: dict[int, list[Running]] | None = None
        self._running: list[Running] | None = None

    def may_preempt(self, priority_class_id: int | None) -> bool:
        """Whether a job of this priority class may preempt others."""
        pclass = self.classes().get(priority_class_id or 0)
        return bool(pclass and pclass.may_preempt)

    def classes(self) -> dict[int, PriorityClass]:
        if self._classes is None:
            self._classes = {c.pk: c for c in PriorityClass.objects.all()}
        return self._classes

    def stopping(self) -> dict[int, list[Running]]:
        """By preemptor: its victims whose old processes still hold capacity."""
        if self._stopping is None:
            self._stopping = {}
            old = Replica.objects.filter(
                state__in=Replica.HOLDING_STATES, attempt__lt=F("job__attempt")
            ).values_list("job_id", flat=True)
            victims = Job.objects.filter(pk__in=old, last_preempted__isnull=False).only(
                "id", "preempted_by", "priority", "attempt"
            )
            old_attempt_holdings = _old_holdings(list(victims))
            for victim in victims:
                if victim.preempted_by:
                    self._stopping.setdefault(int(victim.preempted_by[-1]), []).append(
                        Running(
                            victim.pk,
                            victim.priority,
                            False,
                            self.now,
                            old_attempt_holdings.get(victim.pk, ()),
                        )
                    )
        return self._stopping

    def running(self) -> list[Running]:
        """Every running job holding capacity, as preemption's values."""
        if self._running is None:
            by_job: dict[int, list[Held]] = {}
            for h in self.held:
                by_job.setdefault(h.job_id, []).append(Held(h.node, h.cpu, h.gpus, h.memory_gb))
            # Only jobs of a class that may be preempted can ever be chosen (`eligible`): on a
            # cluster running none, a thousand running jobs are not read once per pass.
            # Unordered (choose_victims orders them): the model's order, newest first, had
            # SQLite walk every job of the history by date (5 -> 0.6 ms at 11,000 jobs).
            jobs = [
                job
                for job in Job.objects.filter(
                    state=Job.State.RUNNING, priority_class__may_be_preempted=True
                )
                .order_by()
                .only("id", "priority", "priority_class_id", "preempted_by", "attempt", "started")
                if job.pk in by_job
            ]
            started = {
                (a.job_id, a.number): a.started
                for a in JobAttempt.objects.filter(job__in=jobs).only("job_id", "number", "started")
            }
            classes = self.classes()
            self._running = []
            for job in jobs:
                pclass = classes.get(job.priority_class_id or 0)
                self._running.append(
                    Running(
                        job.pk,
                        job.priority,
                        bool(pclass and pclass.may_be_preempted),
                        started.get((job.pk, job.attempt)) or job.started or self.now,
                        tuple(by_job[job.pk]),
                        len(job.preempted_by),
                    )
                )
        return self._running

    def has_victims_stopping(self, job_id: int) -> bool:
        return bool(self.stopping().get(job_id))

    def make_room(
        self,
        job: Job,
        demands: list[Demand],
        allowed: list[Room],
        may_name: Callable[[list[int]], set[int]],
    ) -> Outcome | None:
        """Evict what `job` needs (or wait for what it evicted before), and reserve the room in
        `allowed` (its Room objects are taken from, so the rest of the pass sees less).
        None when preemption cannot make room for it: it waits as any job does."""
        pending = self.stopping().get(job.pk, [])
        preemptor = Preemptor(
            job.pk,
            job.priority,
            True,
            tuple(demands),
            frozenset(int(j) for j in job.preempted_by),
        )
        victims = choose_victims(
            preemptor,
            rooms_without(allowed, pending),
            [r for r in self.running() if r.job_id != job.pk],
            self.now,
            settings.TRAINYARD_PREEMPTION_MIN_RUN_SECONDS,
        )
        if victims is None or not (victims or pending):
            return None
        evicted = [v.job_id for v in victims if _evict(v.job_id, job, self.classes())]
        if len(evicted) != len(victims):
            return None  # a victim ended meanwhile: the next pass looks again
        self._running = [r for r in self.running() if r.job_id not in evicted]
        freeing = pending + victims
        self._stopping = {**self.stopping(), job.pk: freeing}
        self._reserve(demands, allowed, freeing)
        waiting_for = jobs_in_words(sorted(v.job_id for v in freeing), may_name)
        verb = "preempted" if not evicted else "preempting"
        once = "it has" if len(freeing) == 1 else "they have"
        return Outcome(f"{verb} {waiting_for}: starts once {once} stopped", evicted)

    @staticmethod
    def _reserve(demands: list[Demand], allowed: list[Room], freeing: list[Running]) -> None:
        """Take the preemptor's demands out of the rooms where it will go once `freeing` is
        gone (a room may go below zero meanwhile: then nothing else fits there)."""
        assignment = place(demands, rooms_without(allowed, freeing))
        if assignment is None:
            return
        by_node = {room.node: room for room in allowed}
        for demand in demands:
            by_node[assignment[demand.key]].take(demand)


def _old_holdings(victims: list[Job]) -> dict[int, tuple[Held, ...]]:
    """What the earlier attempts of these jobs still hold, per job and node."""
    per: dict[tuple[int, str], list[int]] = {}
    attempts = {j.pk: j.attempt for j in victims}
    for r in Replica.objects.filter(
        job__in=victims, state__in=Replica.HOLDING_STATES
    ).select_related("node", "package"):
        if r.package is None or r.node is None or r.attempt >= attempts[r.job_id]:
            continue
        total = per.setdefault((r.job_id, r.node.name), [0, 0, 0])
        total[0] += r.package.cpu
        total[1] += r.package.gpus
        total[2] += r.package.memory_gb
    result: dict[int, list[Held]] = {}
    for (job_id, node), (cpu, gpus, memory_gb) in per.items():
        result.setdefault(job_id, []).append(Held(node, cpu, gpus, memory_gb))
    return {k: tuple(v) for k, v in result.items()}


def _evict(victim_id: int, preemptor: Job, classes: dict[int, PriorityClass]) -> bool:
    """End the victim's attempt for the preemptor; False when it no longer runs."""
    from jobs.services import outcomes, restarts  # both build on the scheduler

    victim = outcomes.locked_job(victim_id)
    if victim is None or victim.state != Job.State.RUNNING:
        return False
    pclass = classes.get(preemptor.priority_class_id or 0)
    who = preemptor.owner.get_username()
    why = f"preempted by job {preemptor.pk} ({pclass.name if pclass else '?'}) of {who}"
    outcomes.end_attempt(
        victim,
        restarts.Cause.PREEMPTION,
        why,
        "preempted",
        grace_seconds=float(settings.TRAINYARD_PREEMPTION_GRACE_SECONDS),
    )
    transitions.note_preempted(victim, preemptor.pk)
    return True
