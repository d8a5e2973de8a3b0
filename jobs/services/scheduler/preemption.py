"""Which running jobs a waiting job may evict to start (issue 25, item 2).

Pure functions over plain values, so that the policy is tested without a database and the
queue page can ask "which jobs would it preempt" without evicting anything.

The rules, each against a failure seen in other schedulers:
- only jobs of strictly lower priority whose class may be preempted; whole jobs only, never
  half a gang (Volcano);
- the fewest jobs whose removal lets the waiting job be placed, and none of them superfluous
  (Kueue #6763: evicting more than needed);
- among equal choices, the jobs that started last: they lose the least work (Determined #3340);
- no loops (Kueue #3779): a job preempted before is not preempted again until its current
  attempt has run the minimum run time, and a job never preempts one that preempted it.
"""

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol, TypeVar

from jobs.services.placement import Demand, Holding, Room, place, smallest, with_freed

# How many candidate sets the exact search tries before it settles for a greedy choice: the
# exact one (fewest victims) is cheap for the handful of jobs a few nodes run; a fleet of
# thousands of small jobs gets the greedy one, still with no superfluous victim.
EXACT_SEARCH_LIMIT = 5000


@dataclass(frozen=True)
class Running:
    """A running job as preemption sees it."""

    job_id: int
    priority: int
    may_be_preempted: bool
    started: datetime  # when its current attempt started
    holdings: tuple[Holding, ...]
    times_preempted: int = 0


@dataclass(frozen=True)
class Preemptor:
    """The waiting job that wants room."""

    job_id: int
    priority: int
    may_preempt: bool
    demands: tuple[Demand, ...]
    # The jobs that preempted it: it never preempts them back.
    preempted_by: frozenset[int] = field(default_factory=frozenset)


def eligible(preemptor: Preemptor, job: Running, now: datetime, min_run_seconds: float) -> bool:
    """Whether `job` may be evicted for `preemptor` at all."""
    if not preemptor.may_preempt or not job.may_be_preempted:
        return False
    if job.priority >= preemptor.priority or job.job_id in preemptor.preempted_by:
        return False
    if job.times_preempted and (now - job.started).total_seconds() < min_run_seconds:
        return False  # preempted before: it runs its minimum time first
    return True


class Stoppable(Protocol):
    """A running job that could be stopped to make room: a preemption's candidate (Running) or
    a reclaim's (reclaim.Borrower)."""

    @property
    def job_id(self) -> int: ...
    @property
    def started(self) -> datetime: ...
    @property
    def holdings(self) -> Sequence[Holding]: ...


S = TypeVar("S", bound=Stoppable)


def rooms_without(rooms: Sequence[Room], victims: Sequence[Stoppable]) -> list[Room]:
    """The free rooms once the victims' holdings are given back (copies)."""
    return with_freed(rooms, (h for victim in victims for h in victim.holdings))


class _Trial:
    """Whether the demands fit once some victims are gone, looking only at the rooms that
    matter: those with room for the smallest instance now, and those the victims free. A
    thousand full nodes are then not copied and searched once per candidate set."""

    def __init__(self, demands: Sequence[Demand], rooms: Sequence[Room]) -> None:
        self.demands = demands
        least = smallest(self.demands)
        self.by_node = {r.node: r for r in rooms}
        self.open = [r for r in rooms if r.fits(least)]
        self.open_nodes = {r.node for r in self.open}

    def placement(self, victims: Sequence[Stoppable]) -> dict[tuple[str, int], str] | None:
        touched = {h.node for v in victims for h in v.holdings} - self.open_nodes
        rooms = self.open + [self.by_node[n] for n in sorted(touched) if n in self.by_node]
        return place(self.demands, rooms_without(rooms, victims))

    def fits(self, victims: Sequence[Stoppable]) -> bool:
        return self.placement(victims) is not None


def choose_victims(
    preemptor: Preemptor,
    rooms: Sequence[Room],
    running: Sequence[Running],
    now: datetime,
    min_run_seconds: float,
) -> list[Running] | None:
    """The jobs to evict so that `preemptor` can be placed, or None when no allowed choice
    lets it (or it may not preempt). [] when it fits already.

    `rooms` are the nodes' free rooms (the nodes it may use); `running` every job holding
    capacity there. Fewest victims first; among sets of the same size, the one whose jobs
    started last (compared latest start first, then the highest id); no victim superfluous.
    """
    return fewest_to_stop(
        preemptor.demands,
        rooms,
        [j for j in running if eligible(preemptor, j, now, min_run_seconds)],
    )


def fewest_to_stop(
    demands: Sequence[Demand], rooms: Sequence[Room], candidates: Sequence[S]
) -> list[S] | None:
    """Of the `candidates` (each allowed to be stopped), the ones to stop so that `demands`
    can be placed: [] when they fit already, None when stopping all of them would not do.
    Fewest first; among sets of one size, the one whose jobs started last (compared latest
    start first, then the highest id); none superfluous. Preemption and reclaim both choose so.
    """
    if place(demands, rooms) is not None:
        return []
    ordered = sorted(
        candidates,
        key=lambda j: (j.started, j.job_id),
        reverse=True,  # started last first: combinations come out in the preferred order
    )
    if not ordered:
        return None  # nothing may be stopped (the trial's rooms are not worth reading)
    trial = _Trial(demands, rooms)
    if not trial.fits(ordered):
        return None
    tried = 0
    for size in range(1, len(ordered) + 1):
        if tried + math.comb(len(ordered), size) > EXACT_SEARCH_LIMIT:
            break
        for victims in itertools.combinations(ordered, size):
            tried += 1
            if trial.fits(victims):
                return list(victims)
    return _greedy(trial, ordered)


def _greedy(trial: _Trial, candidates: list[S]) -> list[S]:
    """The shortest run of the latest-started candidates that the preemptor fits with (found
    by doubling, then halving), less the victims on nodes its placement does not use, then
    less every victim it still fits without (the earliest-started first, so the latest-started
    are the ones kept): no victim is superfluous, though a cleverer set might be smaller."""
    high = 1
    while high < len(candidates) and not trial.fits(candidates[:high]):
        high *= 2
    high = min(high, len(candidates))
    low = high // 2  # a run that does not fit (or none)
    while low + 1 < high:
        middle = (low + high) // 2
        if trial.fits(candidates[:middle]):
            high = middle
        else:
            low = middle
    chosen = candidates[:high]
    used = set((trial.placement(chosen) or {}).values())
    near = [v for v in chosen if any(h.node in used for h in v.holdings)]
    if trial.fits(near):
        chosen = near
    for job in list(reversed(chosen)):
        rest = [v for v in chosen if v is not job]
        if trial.fits(rest):
            chosen = rest
    return chosen
