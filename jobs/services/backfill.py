"""EASY backfill, as Slurm's: a job may pass the head of the queue only if that cannot delay
the head's start.

When the first waiting job (the head) does not fit, its start is reserved: the earliest time at
which, the running jobs ending by their time limits, its whole gang fits on the nodes. A later
job that fits now may then start out of order only if it ends (by its own limit, plus the stop
grace) before that time, or if the head still fits at that time beside it. Only the head gets
a reservation (that is what makes it EASY rather than conservative backfill); the scheduler
works out the rest of the queue as before.

When the reservation needs the nodes of a running job without a time limit, its start is
unknown: `reserve` returns None and the scheduler keeps the grace rule for that pass
(TRAINYARD_BACKFILL_GRACE_SECONDS).

Pure: plain values in, decisions out, tested without a database. The caller passes the rooms
as they are now (after what this pass has already placed) and each holding job's expected end
(jobs.services.time_limits.expected_ends): earlier than the real end, if anything, which can
only make the reservation earlier and backfill stricter, never delay the head.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from jobs.services.placement import Demand, Room, place
from jobs.services.waiting import Holding

Assignment = dict[tuple[str, int], str]


@dataclass(frozen=True)
class Reservation:
    """When, and on which nodes, the head of the queue is to start."""

    job_id: int
    start: datetime
    nodes: tuple[str, ...]

    def in_words(self, now: datetime) -> str:
        """ "reserved to start at 14:05 UTC on node-1, node-2" (with the day when not today)."""
        when = self.start.strftime("%H:%M" if self.start.date() == now.date() else "%Y-%m-%d %H:%M")
        return f"reserved to start at {when} UTC on {', '.join(self.nodes)}"


class Backfill:
    """One scheduling pass's reservation for the head, and the test every later job passes."""

    def __init__(
        self,
        now: datetime,
        holdings: Sequence[Holding],
        ends: Mapping[int, datetime | None],
        stop_grace: timedelta,
    ) -> None:
        self.now = now
        self.holdings = holdings
        # A holding whose job is not in `ends` is taken to run on with no known end.
        self.ends = ends
        self.stop_grace = stop_grace
        self.reservation: Reservation | None = None
        self._head: Sequence[Demand] = ()
        self._then: list[Room] = []  # what the head's nodes have free at the reserved start

    def reserve(
        self, job_id: int, demands: Sequence[Demand], rooms: Sequence[Room]
    ) -> Reservation | None:
        """Reserve the start of the head, `demands` being its gang and `rooms` what the nodes
        it may use have free now; None when the start is unknown (it needs the nodes of a job
        without a time limit) or it could not start even when every running job has ended."""
        by_end: dict[datetime, list[Holding]] = {}
        for holding in self.holdings:
            end = self.ends.get(holding.job_id)
            if end is not None:
                by_end.setdefault(max(end, self.now), []).append(holding)
        times = sorted(by_end)
        if not times or place(demands, self._rooms_at(rooms, times[-1], by_end)) is None:
            return None
        # Each release only adds room, so the first time the gang fits is found by halving.
        low, high = 0, len(times) - 1
        while low < high:
            mid = (low + high) // 2
            if place(demands, self._rooms_at(rooms, times[mid], by_end)) is None:
                low = mid + 1
            else:
                high = mid
        then = self._rooms_at(rooms, times[low], by_end)
        assignment = place(demands, then)
        if assignment is None:  # best fit is a heuristic: more room may place worse
            return None
        self._head = demands
        self._then = then
        self.reservation = Reservation(job_id, times[low], tuple(sorted(set(assignment.values()))))
        return self.reservation

    def _rooms_at(
        self, rooms: Sequence[Room], when: datetime, by_end: Mapping[datetime, list[Holding]]
    ) -> list[Room]:
        """What `rooms` will have free at `when`, once the jobs that end by then have."""
        free = {r.node: Room(r.node, r.cpu, r.gpus, r.memory_gb) for r in rooms}
        for end, holdings in by_end.items():
            if end > when:
                continue
            for h in holdings:
                room = free.get(h.node)
                if room is not None:
                    room.cpu += h.cpu
                    room.gpus += h.gpus
                    room.memory_gb += h.memory_gb
        return list(free.values())

    def admits(
        self,
        demands: Sequence[Demand],
        rooms: Sequence[Room],
        assignment: Assignment,
        time_limit: timedelta | None,
    ) -> Assignment | None:
        """Where a later job that fits now (`assignment`, on `rooms`) may start without delaying
        the head: there, or elsewhere beside the head's reserved nodes; None when nowhere.

        Without a reservation every job that fits may start (the caller's grace rule
        decides). A job admitted beside the reservation is counted in what remains free then.
        """
        reservation = self.reservation
        if reservation is None:
            return assignment
        if time_limit is not None and self.now + time_limit + self.stop_grace <= reservation.start:
            return assignment  # gone before the head starts
        if self._fits_beside(demands, assignment):
            return assignment
        away = [r for r in rooms if r.node not in reservation.nodes]
        elsewhere = place(demands, away)
        if elsewhere is not None and self._fits_beside(demands, elsewhere):
            return elsewhere
        return None

    def _fits_beside(self, demands: Sequence[Demand], assignment: Assignment) -> bool:
        """Whether the head still fits at its reserved start with this job still running; if
        so, the job's share is taken from what is free then."""
        then = {r.node: Room(r.node, r.cpu, r.gpus, r.memory_gb) for r in self._then}
        for demand in demands:
            room = then.get(assignment[demand.key])
            if room is not None:
                room.take(demand)
        if place(self._head, list(then.values())) is None:
            return False
        self._then = list(then.values())
        return True
