"""Fairness figures (issue 25, "Measure it"), from the scheduler's own policy modules.

A discrete-time simulation (1 s steps, simulated time) of a cluster shared by two groups of
equal weight, each with half the cluster as its nominal share and the other half as its
borrowing limit. Every pass orders the waiting jobs with jobs.services.scheduler.fairshare, judges
them with jobs.services.scheduler.borrowing, places them with jobs.services.placement and, for a
group within its share that finds no room, stops borrowed jobs chosen by
jobs.services.scheduler.reclaim (their room reserved for it until they are gone), as
scheduling.schedule does; only the database and the agents are left out (this is not the real-time
fleet of bench/fleet.py: ten simulated minutes run in seconds, so that bench/scale.py can call
`run()` later).

Figures:
1. both groups submit without pause for 10 minutes: each group's share of the core-seconds
   used (target: within 5 % of 50/50);
2. group a alone fills the cluster (borrowing b's share), then b starts submitting: how long
   until b holds its nominal share, against the grace its victims get (target: one grace).

    python -m bench.fairness [--nodes 100] [--seed 1]
"""

import argparse
import os
import random
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import django

# The policy modules sit beside the models they read in production: Django must be set up.
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
django.setup()

from jobs.services import placement  # noqa: E402
from jobs.services.placement import (  # noqa: E402
    Demand,
    Holding,
    Room,
    place,
)
from jobs.services.scheduler import borrowing, fairshare, reclaim  # noqa: E402

CORES_PER_NODE = 8
GRACE_SECONDS = 30.0
HALF_LIFE_SECONDS = 6 * 3600.0
T0 = datetime(2026, 1, 1, tzinfo=UTC)


@dataclass
class SimJob:
    job_id: int
    group: str
    instances: int  # of 2 cores each
    seconds: float  # how long it runs to the end
    created: float
    started: float | None = None
    placed: dict[tuple[str, int], str] = field(default_factory=dict)
    borrowed: bool = False
    stop_at: float | None = None  # SIGTERM given: its processes are gone then
    reclaimed_for: int | None = None
    times_preempted: int = 0
    done: float = 0.0  # seconds of work done in earlier attempts

    @property
    def cores(self) -> int:
        return 2 * self.instances

    def demands(self) -> list[Demand]:
        return [Demand(("worker", i), 2, 0, 1) for i in range(self.instances)]


class Cluster:
    def __init__(self, nodes: int, seed: int) -> None:
        self.rng = random.Random(seed)  # noqa: S311 (a reproducible simulation, no secret)
        self.nodes = [f"n{i}" for i in range(nodes)]
        half = nodes * CORES_PER_NODE // 2
        self.shares = {
            g: borrowing.Share(g, borrowing.need_of(half, 0, 10**6), borrowing.need_of(half, 0, 0))
            for g in ("a", "b")
        }
        self.waiting: list[SimJob] = []
        self.running: list[SimJob] = []  # placed, including those stopping
        self.records: dict[str, list[fairshare.UsageRecord]] = {"a": [], "b": []}
        self.next_id = 1
        self.now = 0.0

    def submit(self, group: str) -> None:
        job = SimJob(
            self.next_id,
            group,
            self.rng.choice((1, 1, 2, 4)),
            self.rng.uniform(20, 120),
            self.now,
        )
        self.next_id += 1
        self.waiting.append(job)

    def at(self, seconds: float) -> datetime:
        return T0 + timedelta(seconds=seconds)

    def held(self) -> list[Holding]:
        out = []
        for job in self.running:
            for node in job.placed.values():
                out.append(Holding(job.job_id, node, 2, 0, 1))
        return out

    def rooms(self) -> list[Room]:
        rooms = {n: Room(n, CORES_PER_NODE, 0, 10**6) for n in self.nodes}
        for h in self.held():
            rooms[h.node].cpu -= h.cpu
        return list(rooms.values())

    def used_by(self, group: str) -> int:
        return sum(j.cores for j in self.running if j.group == group)

    def step(self) -> None:
        """One second: jobs end or finish stopping, then one scheduling pass."""
        for job in list(self.running):
            assert job.started is not None
            if job.stop_at is not None and self.now >= job.stop_at:
                self._ended(job, requeue=True)
            elif job.stop_at is None and self.now - job.started >= job.seconds - job.done:
                self._ended(job, requeue=False)
        self.schedule()

    def _ended(self, job: SimJob, requeue: bool) -> None:
        assert job.started is not None
        self.running.remove(job)
        self.records[job.group].append(
            fairshare.UsageRecord(
                self.at(job.started),
                self.at(self.now),
                fairshare.Resources(cpu=job.cores),
            )
        )
        if requeue:
            job.done += max(0.0, (job.stop_at or self.now) - job.started - GRACE_SECONDS)
            job.placed, job.started, job.stop_at, job.borrowed = {}, None, None, False
            self.waiting.append(job)

    def schedule(self) -> None:
        now = self.at(self.now)
        live = {
            g: self.records[g]
            + [
                fairshare.UsageRecord(self.at(j.started), None, fairshare.Resources(cpu=j.cores))
                for j in self.running
                if j.group == g and j.started is not None
            ]
            for g in ("a", "b")
        }
        usage = {g: fairshare.decayed_usage(r, now, HALF_LIFE_SECONDS) for g, r in live.items()}
        ratio = {
            g: fairshare.share_ratio(
                usage[g], fairshare.Resources(cpu=self.shares[g].nominal["cpu"]), HALF_LIFE_SECONDS
            )
            for g in ("a", "b")
        }
        reserved = {j.reclaimed_for for j in self.running if j.reclaimed_for is not None}
        order = sorted(
            self.waiting,
            key=lambda j: (
                j.job_id not in reserved,
                fairshare.sort_key(ratio[j.group], 0.0, self.at(j.created), j.job_id),
            ),
        )
        for g, share in self.shares.items():
            share.used = borrowing.need_of(self.used_by(g), 0, 0)
        rooms = self.rooms()
        held = self.held()
        for job in order:
            share = self.shares[job.group]
            need = borrowing.need_of(job.cores, 0, job.instances)
            verdict = borrowing.judge([share], need)
            if verdict.wait is not None:
                continue
            assignment = place(job.demands(), rooms)
            if assignment is None and verdict.lender is not None:
                stopping = [
                    h
                    for h in held
                    if any(
                        r.job_id == h.job_id and r.reclaimed_for == job.job_id for r in self.running
                    )
                ]
                if not stopping:
                    borrowers = [
                        reclaim.Borrower(
                            r.job_id,
                            self.at(r.started or 0),
                            tuple(h for h in held if h.job_id == r.job_id),
                            r.times_preempted,
                        )
                        for r in self.running
                        if r.borrowed and r.stop_at is None and r.group != job.group
                    ]
                    victims = reclaim.choose(job.demands(), rooms, borrowers, now, 0)
                    if not victims:
                        continue
                    for v in victims:
                        victim = next(r for r in self.running if r.job_id == v.job_id)
                        # It obeys SIGTERM once its checkpoint is saved: within the grace.
                        victim.stop_at = self.now + self.rng.uniform(1, GRACE_SECONDS)
                        victim.reclaimed_for = job.job_id
                        victim.borrowed = False
                        victim.times_preempted += 1
                    stopping = [h for v in victims for h in v.holdings]
                placement.reserve(job.demands(), rooms, stopping)
                share.take(need)
                continue
            if assignment is None:
                continue
            for demand in job.demands():
                next(r for r in rooms if r.node == assignment[demand.key]).take(demand)
            job.placed = assignment
            job.started = self.now
            job.borrowed = verdict.borrowing
            share.take(need)
            self.waiting.remove(job)
            self.running.append(job)
            for r in self.running:
                if r.reclaimed_for == job.job_id:
                    r.reclaimed_for = None


def keep_busy(cluster: Cluster, group: str, backlog: int) -> None:
    """Submitting without pause: the group always has `backlog` jobs waiting."""
    while sum(1 for j in cluster.waiting if j.group == group) < backlog:
        cluster.submit(group)


def both_groups(nodes: int, seed: int, seconds: int = 600) -> dict[str, float]:
    cluster = Cluster(nodes, seed)
    core_seconds = {"a": 0.0, "b": 0.0}
    for t in range(seconds):
        cluster.now = float(t)
        keep_busy(cluster, "a", 50)
        keep_busy(cluster, "b", 50)
        cluster.step()
        for g in core_seconds:
            core_seconds[g] += cluster.used_by(g)
    total = sum(core_seconds.values()) or 1.0
    return {g: v / total for g, v in core_seconds.items()}


def lender_returns(nodes: int, seed: int) -> float:
    """Seconds from b's first submission until b holds its nominal share."""
    cluster = Cluster(nodes, seed)
    arrive = 300
    for t in range(arrive + 600):
        cluster.now = float(t)
        keep_busy(cluster, "a", 50)
        if t >= arrive:
            keep_busy(cluster, "b", 50)
        cluster.step()
        if t >= arrive and cluster.used_by("b") >= cluster.shares["b"].nominal["cpu"] - 6:
            # within one job's size of its share (jobs are 2 to 8 cores)
            return t - arrive
    return float("inf")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    shares = both_groups(args.nodes, args.seed)
    returned = lender_returns(args.nodes, args.seed)
    cores = args.nodes * CORES_PER_NODE
    print(f"fair share, {args.nodes} nodes ({cores} cores), two groups of equal weight, 10 min:")
    print(f"  group a {shares['a']:.1%}, group b {shares['b']:.1%} (target: 50 % ± 5 %)")
    print(
        f"  the lender's share back after {returned:.0f} s "
        f"(grace {GRACE_SECONDS:.0f} s; target: within one grace)"
    )


if __name__ == "__main__":
    main()
