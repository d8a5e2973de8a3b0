"""EASY backfill, as Slurm's: a job may pass the head of the queue only if that cannot delay
the head's start.

When the first waiting job (the head) does not fit, its start is reserved: the earliest time at
which, the running jobs ending by their time limits, its whole gang fits on the nodes. A later
job that fits now may then start out of order only if it ends (by its own limit, plus the stop
grace) before that time, or if it leaves the head's reserved nodes what the head needs of them
then (it runs beside the reservation; a job that would not may be placed on other nodes
instead). Only the head gets a reservation (that is what makes it EASY rather than
conservative backfill), and it keeps its nodes for the pass; the scheduler works out the rest
of the queue as before.

When the reservation needs the nodes of a running job without a time limit, its start is
unknown: `reserve` returns None and the scheduler keeps the grace rule for that pass
(TRAINYARD_BACKFILL_GRACE_SECONDS).

Pure: plain values in, decisions out, tested without a database. The caller passes the rooms
as they are now (after what this pass has already placed) and each holding job's expected end
(jobs.services.lifecycle.time_limits.expected_ends): earlier than the real end, if anything, which
can only make the reservation earlier and backfill stricter, never delay the head.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from jobs.services.placement import Demand, Holding, Room, place, smallest

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
        # On each reserved node: what it will have free at the reserved start, after the jobs
        # admitted beside the head, and what the head needs of it.
        self._then: dict[str, Room] = {}
        self._need: dict[str, Room] = {}

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
        releases = [(end, by_end[end]) for end in times]
        # A node that cannot hold the smallest instance takes no part: at a thousand full
        # nodes, placement then looks at the few that free up, not at every node each time.
        least = smallest(demands)

        # Only the nodes that free something by then are copied, per time tried: at a thousand
        # full nodes, copying every room a dozen times was most of the reservation's cost.
        by_node = {r.node: r for r in rooms}
        open_now = [r for r in rooms if r.fits(least)]

        def fits_at(when: datetime) -> tuple[list[Room], Assignment | None]:
            freed = self._freed_by(by_node, when, releases)
            free = [r for r in open_now if r.node not in freed]
            free += [r for r in freed.values() if r.fits(least)]
            return free, place(demands, free)

        if not times or fits_at(times[-1])[1] is None:
            return None
        # Each release only adds room, so the first time the gang fits is found by halving.
        low, high = 0, len(times) - 1
        while low < high:
            mid = (low + high) // 2
            if fits_at(times[mid])[1] is None:
                low = mid + 1
            else:
                high = mid
        then, assignment = fits_at(times[low])
        if assignment is None:  # best fit is a heuristic: more room may place worse
            return None
        nodes = sorted(set(assignment.values()))
        # Copies: `then` may hold the caller's own rooms, which change as it places jobs.
        self._then = {
            r.node: Room(r.node, r.cpu, r.gpus, r.memory_gb) for r in then if r.node in nodes
        }
        self._need = {node: Room(node, 0, 0, 0) for node in nodes}
        for demand in demands:
            need = self._need[assignment[demand.key]]
            need.cpu += demand.cpu
            need.gpus += demand.gpus
            need.memory_gb += demand.memory_gb
        self.reservation = Reservation(job_id, times[low], tuple(nodes))
        return self.reservation

    @staticmethod
    def _freed_by(
        rooms: Mapping[str, Room],
        when: datetime,
        releases: Sequence[tuple[datetime, list[Holding]]],
    ) -> dict[str, Room]:
        """By node, what the rooms (by node) that free something by `when` will have free
        then, once the jobs that end by then have (`releases`: the holdings by end, earliest
        first): copies (the rooms passed in are not changed); the other rooms stay as they
        are."""
        freed: dict[str, Room] = {}
        for end, holdings in releases:
            if end > when:
                break
            for h in holdings:
                room = freed.get(h.node)
                if room is None:
                    now = rooms.get(h.node)
                    if now is None:
                        continue
                    room = freed[h.node] = Room(now.node, now.cpu, now.gpus, now.memory_gb)
                room.cpu += h.cpu
                room.gpus += h.gpus
                room.memory_gb += h.memory_gb
        return freed

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
        """Whether the head still fits on its reserved nodes at its start with this job still
        running there; if so, the job's share is taken from what they have free then. (The
        head keeps its nodes: one pass's reservation does not move, as in Slurm.)"""
        then = {node: Room(node, r.cpu, r.gpus, r.memory_gb) for node, r in self._then.items()}
        for demand in demands:
            room = then.get(assignment[demand.key])
            if room is not None:
                room.take(demand)
        if not all(room.fits(self._as_demand(self._need[node])) for node, room in then.items()):
            return False
        self._then = then
        return True

    @staticmethod
    def _as_demand(need: Room) -> Demand:
        return Demand(("head", 0), need.cpu, need.gpus, need.memory_gb)
