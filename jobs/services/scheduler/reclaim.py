"""Reclaim (issue 25, item 3): when a job of a group within its nominal share waits for room,
jobs that run on borrowed capacity (jobs.services.scheduler.borrowing) of other groups are preempted
to make room for it, and the room they free is kept for it until it starts.

The choice is pure (`choose`): whole jobs only; the fewest whose removal lets the lender's job
be placed, none of them superfluous (Kueue #6763); among equals the most recently started
(they lose the least work); a job reclaimed before is not reclaimed again until its new attempt
has run TRAINYARD_PREEMPTION_MIN_RUN_SECONDS. `Reclaimer` applies it inside a scheduling pass,
which stops the victims (jobs.services.scheduler.evictions): SIGTERM,
TRAINYARD_PREEMPTION_GRACE_SECONDS for a checkpoint, back to the queue (Cause.PREEMPTION: no
restart used up), with the reason "preempted to return borrowed capacity to group X".

No loops (Kueue #3779): the lender is placed as soon as its victims' processes are gone, ahead
of every other waiting job, and until then no other job, its victims included, may take the
room they free: a reclaimed job cannot come straight back as a borrower onto that capacity.
"""

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db.models import F

from jobs.models import Job, JobAttempt, Replica
from jobs.services.lifecycle import restarts
from jobs.services.placement import Demand, Holding, Room, place, reserve, with_freed
from jobs.services.scheduler import preemption
from jobs.services.scheduler.evictions import Eviction
from jobs.services.scheduler.why_waiting import jobs_in_words

# What a reclaimed job's reason and attempt list say (its attempt's reason starts with it, so
# that "preempted before" can be read back from the attempts: see `times_preempted`).
PREEMPTED = "preempted"


@dataclass(frozen=True)
class Borrower:
    """A running job on borrowed capacity, as reclaim sees it."""

    job_id: int
    started: datetime  # when its current attempt started
    holdings: tuple[Holding, ...]
    times_preempted: int = 0


@dataclass(frozen=True)
class Plan:
    """What reclaim would do for a lender's job in this pass: the borrowers to stop now
    (`victims`, as `evictions`), what those stopped for it before still hold (`pending`), and
    what those stopped for other lenders hold (`others`: their excess is this job's too)."""

    victims: list[Borrower]
    pending: list[Holding]
    others: list[Holding]
    evictions: list[Eviction]


def _freed(victims: Iterable[Borrower]) -> list[Holding]:
    return [h for v in victims for h in v.holdings]


def eligible(job: Borrower, now: datetime, min_run_seconds: float) -> bool:
    """A job preempted before runs its minimum time before it may be reclaimed again."""
    return not job.times_preempted or (now - job.started).total_seconds() >= min_run_seconds


def choose(
    demands: Sequence[Demand],
    rooms: Sequence[Room],
    borrowers: Sequence[Borrower],
    now: datetime,
    min_run_seconds: float,
) -> list[Borrower] | None:
    """The borrowed jobs to stop so that `demands` can be placed in `rooms`: [] when they fit
    already, None when no allowed choice lets them. Fewest first; among sets of one size, the
    one whose jobs started last; no victim superfluous."""
    return preemption.fewest_to_stop(
        demands, rooms, [b for b in borrowers if eligible(b, now, min_run_seconds)]
    )


class Reclaimer:
    """One scheduling pass's view of reclaim, read lazily: most passes need none of it."""

    def __init__(self, held: list[Holding], now: datetime) -> None:
        self.held = held
        self.now = now
        self._borrowers: dict[int, tuple[int, Borrower]] | None = None  # job -> (owner, it)
        self._stopping: dict[int, list[Holding]] | None = None

    def stopping(self) -> dict[int, list[Holding]]:
        """By lender: what its victims' stopped attempts still hold (their processes are not
        gone yet)."""
        if self._stopping is None:
            self._stopping = {}
            for job_id, lender, node, cpu, gpus, memory_gb in Replica.objects.filter(
                job__reclaimed_for__isnull=False,
                attempt__lt=F("job__attempt"),
                state__in=Replica.HOLDING_STATES,
                package__isnull=False,
                node__isnull=False,
            ).values_list(
                "job_id", "job__reclaimed_for", "node__name",
                "package__cpu", "package__gpus", "package__memory_gb",
            ):  # fmt: skip
                assert lender is not None  # filtered so
                self._stopping.setdefault(lender, []).append(
                    Holding(job_id, node, cpu, gpus, memory_gb)
                )
        return self._stopping

    def borrowers(self) -> dict[int, tuple[int, Borrower]]:
        """Every running job on borrowed capacity, with its owner."""
        if self._borrowers is None:
            jobs = list(
                Job.objects.filter(state=Job.State.RUNNING, borrowed=True).only(
                    "id", "owner_id", "attempt", "started"
                )
            )
            started = restarts.current_attempt_starts(jobs, self.now)
            preempted: dict[int, int] = {}
            for job_id in JobAttempt.objects.filter(
                job__in=jobs, reason__startswith=PREEMPTED
            ).values_list("job_id", flat=True):
                preempted[job_id] = preempted.get(job_id, 0) + 1
            by_job: dict[int, list[Holding]] = {}
            for h in self.held:
                by_job.setdefault(h.job_id, []).append(h)
            self._borrowers = {
                j.pk: (
                    j.owner_id,
                    Borrower(
                        j.pk,
                        started[j.pk],
                        tuple(by_job.get(j.pk, ())),
                        preempted.get(j.pk, 0),
                    ),
                )
                for j in jobs
            }
        return self._borrowers

    def plan(
        self,
        job: Job,
        demands: list[Demand],
        allowed: list[Room],
        group: str,
        not_of_group: Callable[[int], bool],
    ) -> Plan | None:
        """For a waiting job of `group`, within its nominal share, that does not fit: the
        borrowed jobs of owners for whom `not_of_group` holds that it needs stopped, or none
        when it waits for those stopped for it before; None when reclaim cannot help it (or
        it fits now). Nothing is stopped here: the scheduling pass carries out the plan's
        evictions (jobs.services.scheduler.evictions), then `claim`s the room."""
        pending = self.stopping().get(job.pk, [])
        # Victims are whole jobs: those stopped for the lenders ahead free more than these
        # need. That excess is this job's too, once they are gone (the lenders' own room is
        # taken out of `allowed` already: they are judged first). Without it, a group back
        # with more jobs than victims to spare got the rest of its share a grace later.
        others = [h for lender, hs in self.stopping().items() if lender != job.pk for h in hs]
        victims: list[Borrower] = []
        if not pending:
            candidates = [b for owner, b in self.borrowers().values() if not_of_group(owner)]
            chosen = choose(
                demands,
                with_freed(allowed, others),
                candidates,
                self.now,
                float(settings.TRAINYARD_PREEMPTION_MIN_RUN_SECONDS),
            )
            if chosen is None or (not chosen and place(demands, allowed) is not None):
                return None  # reclaim cannot help, or it fits now
            victims = chosen
        why = f"{PREEMPTED} to return borrowed capacity to group {group}"
        evictions = [Eviction(v.job_id, job.pk, why, reclaim=True) for v in victims]
        return Plan(victims, pending, others, evictions)

    def claim(
        self,
        job_id: int,
        plan: Plan,
        demands: list[Demand],
        allowed: list[Room],
        group: str,
        may_name: Callable[[list[int]], set[int]],
    ) -> str:
        """Once the plan's victims are stopped: reserve their room for job `job_id` in
        `allowed` (taken from in place); the reason it shows while it waits."""
        pending = plan.pending
        for v in plan.victims:
            self.borrowers().pop(v.job_id, None)
        if plan.victims:
            pending = _freed(plan.victims)
            self.stopping()[job_id] = pending
        going_to = reserve(demands, allowed, pending, plan.others)
        # The jobs whose stop it waits for: its own victims, else those freeing its nodes.
        freeing = sorted(
            {h.job_id for h in pending}
            or {h.job_id for h in plan.others if h.node in going_to}
            or {h.job_id for h in plan.others}
        )
        return (
            f"waiting for borrowed capacity to be returned to group {group}: "
            f"{jobs_in_words(freeing, may_name)} stopping"
        )
