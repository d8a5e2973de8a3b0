"""Preemption inside a scheduling pass: what `scheduling.schedule` does for a waiting job that
does not fit and whose priority class may preempt.

The policy (which jobs) is `jobs.services.scheduler.preemption`, pure; here the database's jobs
become its plain values, and the chosen victims are named for the scheduling pass to evict
(jobs.services.scheduler.evictions: SIGTERM, the grace, back to the queue). The room they free
is then reserved for the preemptor until it starts: it is placed only once their processes are
gone (their agents report them stopped), and no lower-priority job that waits may take that
room in between.
"""

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db.models import F

from jobs.models import Job, JobAttempt, PriorityClass, Replica
from jobs.services.lifecycle import restarts
from jobs.services.placement import Demand, Holding, Room, reserve
from jobs.services.scheduler.evictions import Eviction
from jobs.services.scheduler.preemption import (
    Preemptor,
    Running,
    choose_victims,
    rooms_without,
)
from jobs.services.scheduler.why_waiting import jobs_in_words


@dataclass(frozen=True)
class Plan:
    """What preemption would do for a preemptor in this pass: the running jobs to stop now
    (`victims`, as `evictions`), and those it stopped before whose processes are not gone yet
    (`pending`)."""

    victims: list[Running]
    pending: list[Running]
    evictions: list[Eviction]


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
        """By preemptor: its victims whose preempted attempts' processes still hold capacity.
        The preemptor is the one recorded on each such attempt: a job preempted once, whose
        later attempt ended for another reason, is nobody's victim while that one stops."""
        if self._stopping is None:
            self._stopping = {}
            preempted = {
                (a.job_id, a.number): a.preempted_by
                for a in JobAttempt.objects.filter(
                    preempted_by__isnull=False,
                    job__replicas__state__in=Replica.HOLDING_STATES,
                    job__replicas__attempt=F("number"),
                    number__lt=F("job__attempt"),
                ).only("job_id", "number", "preempted_by")
            }
            if not preempted:
                return self._stopping
            priorities = dict(
                Job.objects.filter(pk__in={job_id for job_id, _ in preempted}).values_list(
                    "id", "priority"
                )
            )
            holdings = _holdings_of_attempts(set(preempted))
            # By (preemptor, victim): what the victim's attempts that preemptor ended still hold.
            held: dict[tuple[int, int], list[Holding]] = {}
            for (job_id, number), preemptor in preempted.items():
                assert preemptor is not None  # filtered so
                held.setdefault((preemptor, job_id), []).extend(holdings.get((job_id, number), ()))
            for (preemptor, job_id), holding in held.items():
                self._stopping.setdefault(preemptor, []).append(
                    Running(job_id, priorities[job_id], False, self.now, tuple(holding))
                )
        return self._stopping

    def running(self) -> list[Running]:
        """Every running job holding capacity, as preemption's values."""
        if self._running is None:
            by_job: dict[int, list[Holding]] = {}
            for h in self.held:
                by_job.setdefault(h.job_id, []).append(h)
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
            started = restarts.current_attempt_starts(jobs, self.now)
            classes = self.classes()
            self._running = []
            for job in jobs:
                pclass = classes.get(job.priority_class_id or 0)
                self._running.append(
                    Running(
                        job.pk,
                        job.priority,
                        bool(pclass and pclass.may_be_preempted),
                        started[job.pk],
                        tuple(by_job[job.pk]),
                        len(job.preempted_by),
                    )
                )
        return self._running

    def has_victims_stopping(self, job_id: int) -> bool:
        return bool(self.stopping().get(job_id))

    def plan(self, job: Job, demands: list[Demand], allowed: list[Room]) -> Plan | None:
        """What `job` would evict to fit in `allowed` (or the victims it evicted before, whose
        stop it still waits for); None when preemption cannot make room for it: it waits as
        any job does. Nothing is stopped here: the scheduling pass carries out the plan's
        evictions (jobs.services.scheduler.evictions), then `claim`s the room."""
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
        pclass = self.classes().get(job.priority_class_id or 0)
        who = job.owner.get_username()
        why = f"preempted by job {job.pk} ({pclass.name if pclass else '?'}) of {who}"
        evictions = [Eviction(v.job_id, job.pk, why, reclaim=False) for v in victims]
        return Plan(victims, pending, evictions)

    def claim(
        self,
        job_id: int,
        plan: Plan,
        demands: list[Demand],
        allowed: list[Room],
        may_name: Callable[[list[int]], set[int]],
    ) -> str:
        """Once the plan's victims are stopped: reserve the room they free for job `job_id` in
        `allowed` (its Room objects are taken from, so the rest of the pass sees less); the
        reason it shows while it waits for them."""
        evicted = {v.job_id for v in plan.victims}
        self._running = [r for r in self.running() if r.job_id not in evicted]
        freeing = plan.pending + plan.victims
        self._stopping = {**self.stopping(), job_id: freeing}
        reserve(demands, allowed, [h for victim in freeing for h in victim.holdings])
        waiting_for = jobs_in_words(sorted(v.job_id for v in freeing), may_name)
        verb = "preempting" if plan.victims else "preempted"
        once = "it has" if len(freeing) == 1 else "they have"
        return f"{verb} {waiting_for}: starts once {once} stopped"


def _holdings_of_attempts(attempts: set[tuple[int, int]]) -> dict[tuple[int, int], list[Holding]]:
    """What the instances of these (job, attempt number) still hold, per node."""
    per: dict[tuple[int, int, str], list[int]] = {}
    for r in Replica.objects.filter(
        job__in={job_id for job_id, _ in attempts}, state__in=Replica.HOLDING_STATES
    ).select_related("node", "package"):
        if r.package is None or r.node is None or (r.job_id, r.attempt) not in attempts:
            continue
        total = per.setdefault((r.job_id, r.attempt, r.node.name), [0, 0, 0])
        total[0] += r.package.cpu
        total[1] += r.package.gpus
        total[2] += r.package.memory_gb
    result: dict[tuple[int, int], list[Holding]] = {}
    for (job_id, number, node), (cpu, gpus, memory_gb) in per.items():
        result.setdefault((job_id, number), []).append(Holding(job_id, node, cpu, gpus, memory_gb))
    return result
