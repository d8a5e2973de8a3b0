"""A randomized 1,000-job simulation over the scheduler's policy functions (queue_order,
placement, preemption), as `scheduling.schedule` and `preempt_pass` use them: jobs of three
classes arrive on a small cluster, the high ones preempt, the victims stop after a grace
period and go back to the queue keeping their place, and resume where they stopped.

It shows what no single case can: no preemption loop (every job ends), no job preempted
again before the minimum run time, nor more often than that allows, and never by a job it had
preempted itself; victims always of strictly lower priority, whole jobs, and the room freed
for a preemptor taken by no lower-priority job.
"""

import heapq
import random
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest

from jobs.services.placement import Demand, Holding, Room, place
from jobs.services.scheduler.preemption import (
    Preemptor,
    Running,
    choose_victims,
    rooms_without,
)
from tests.unit.helpers import queue_key

EPOCH = datetime(2026, 11, 26, tzinfo=UTC)
MIN_RUN = 120.0
GRACE = 15.0
NODES = {f"node-{i}": 8 for i in range(6)}
# name: (value, may preempt, may be preempted, share of the jobs)
CLASSES = {
    "low": (-10, False, True, 0.5),
    "normal": (0, False, False, 0.3),
    "high": (10, True, False, 0.2),
}


@dataclass
class SimJob:
    job_id: int
    pclass: str
    created: float
    demands: tuple[Demand, ...]
    work: float  # seconds of running left
    started: float | None = None  # of the current attempt
    holdings: dict[str, int] = field(default_factory=dict)
    preempted_at: list[float] = field(default_factory=list)
    attempt_starts: list[float] = field(default_factory=list)
    preempted_by: list[int] = field(default_factory=list)
    stopping_until: float | None = None  # a victim within its grace
    done: float | None = None

    @property
    def priority(self) -> int:
        return CLASSES[self.pclass][0]


def at(t: float) -> datetime:
    return EPOCH + timedelta(seconds=t)


class Cluster:
    def __init__(self, seed: int, jobs: int) -> None:
        rng = random.Random(seed)
        self.jobs: dict[int, SimJob] = {}
        t = 0.0
        names = list(CLASSES)
        weights = [CLASSES[n][3] for n in names]
        for job_id in range(1, jobs + 1):
            t += rng.expovariate(1 / 6.0)  # about a job every 6 s: the queue fills and drains
            instances = rng.choice([1, 1, 1, 2, 3])
            cpu = rng.choice([1, 2, 2, 4])
            self.jobs[job_id] = SimJob(
                job_id,
                rng.choices(names, weights)[0],
                t,
                tuple(Demand(("worker", k), cpu, 0, 1) for k in range(instances)),
                rng.uniform(20, 400),
            )
        self.events: list[tuple[float, int, str, int]] = []
        self.seq = 0
        for job in self.jobs.values():
            self.push(job.created, "arrive", job.job_id)
        self.waiting: set[int] = set()
        self.running: set[int] = set()
        self.pending: dict[int, list[int]] = {}  # preemptor -> its victims still stopping
        self.violations: list[str] = []

    def push(self, t: float, kind: str, job_id: int) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, job_id))

    def free_rooms(self) -> list[Room]:
        rooms = {n: Room(n, cpu, 0, 64) for n, cpu in NODES.items()}
        for job in self.jobs.values():
            for node, cpu in job.holdings.items():
                rooms[node].cpu -= cpu
        return list(rooms.values())

    def as_running(self, job: SimJob) -> Running:
        assert job.started is not None
        return Running(
            job.job_id,
            job.priority,
            CLASSES[job.pclass][2],
            at(job.started),
            tuple(Holding(job.job_id, n, c, 0, 0) for n, c in job.holdings.items()),
            len(job.preempted_at),
        )

    def start(self, job: SimJob, assignment: dict[tuple[str, int], str], now: float) -> None:
        for d in job.demands:
            node = assignment[d.key]
            job.holdings[node] = job.holdings.get(node, 0) + d.cpu
        job.started = now
        job.attempt_starts.append(now)
        self.waiting.discard(job.job_id)
        self.running.add(job.job_id)
        self.push(now + job.work, "finish", job.job_id)

    def schedule(self, now: float) -> None:
        rooms = self.free_rooms()
        by_node = {r.node: r for r in rooms}
        order = sorted(
            (self.jobs[j] for j in self.waiting),
            key=lambda j: queue_key(j.priority, at(j.created), j.job_id),
        )
        for job in order:
            assignment = place(job.demands, rooms)
            if assignment is not None:
                self.start(job, assignment, now)
                for d in job.demands:
                    by_node[assignment[d.key]].take(d)
                continue
            if not CLASSES[job.pclass][1]:
                continue
            stopping = [self.jobs[v] for v in self.pending.get(job.job_id, [])]
            stopping_held = [
                Running(v.job_id, v.priority, False, at(now), tuple(
                    Holding(v.job_id, n, c, 0, 0) for n, c in v.holdings.items()
                ))
                for v in stopping
            ]  # fmt: skip
            victims = choose_victims(
                Preemptor(job.job_id, job.priority, True, job.demands, frozenset(job.preempted_by)),
                rooms_without(rooms, stopping_held),
                [self.as_running(self.jobs[r]) for r in sorted(self.running)],
                at(now),
                MIN_RUN,
            )
            if victims is None:
                continue
            for victim in victims:
                self.preempt(self.jobs[victim.job_id], job, now)
            freeing = stopping_held + list(victims)
            self.pending[job.job_id] = [v.job_id for v in freeing]
            # Reserve: what it will take once they are gone is nobody else's meanwhile.
            target = place(job.demands, rooms_without(rooms, freeing))
            assert target is not None
            for d in job.demands:
                by_node[target[d.key]].take(d)

    def preempt(self, victim: SimJob, preemptor: SimJob, now: float) -> None:
        assert victim.started is not None
        if victim.priority >= preemptor.priority:
            self.violations.append(f"job {victim.job_id} preempted by one not higher")
        if victim.preempted_at and now - victim.started < MIN_RUN:
            self.violations.append(
                f"job {victim.job_id} preempted again after {now - victim.started} s"
            )
        if victim.job_id in preemptor.preempted_by:
            self.violations.append(f"job {preemptor.job_id} preempted its preemptor")
        victim.work -= now - victim.started  # it resumes from where it checkpointed (SIGTERM)
        victim.preempted_at.append(now)
        victim.preempted_by.append(preemptor.job_id)
        victim.stopping_until = now + GRACE
        self.running.discard(victim.job_id)
        victim.started = None
        self.push(now + GRACE, "stopped", victim.job_id)

    def run(self) -> float:
        now = 0.0
        while self.events:
            now, _, kind, job_id = heapq.heappop(self.events)
            job = self.jobs[job_id]
            if kind == "arrive":
                self.waiting.add(job_id)
            elif kind == "finish":
                if job_id not in self.running or job.started is None:
                    continue  # a finish of an attempt that was preempted meanwhile
                if abs(job.started + job.work - now) > 1e-6:
                    continue
                job.done = now
                job.holdings.clear()
                self.running.discard(job_id)
            elif kind == "stopped":
                job.holdings.clear()
                job.stopping_until = None
                self.waiting.add(job_id)  # back in the queue, in its old place
                for victims in self.pending.values():
                    if job_id in victims:
                        victims.remove(job_id)
            self.pending = {p: v for p, v in self.pending.items() if v and p in self.waiting}
            self.schedule(now)
        return now


@pytest.mark.parametrize("seed", [1])
def test_a_thousand_random_jobs_end_without_preemption_loops(seed: int) -> None:
    cluster = Cluster(seed, 1000)
    cluster.run()
    jobs = list(cluster.jobs.values())
    assert cluster.violations == []
    assert all(j.done is not None for j in jobs), "every job ends: no preemption loop"
    preempted = [j for j in jobs if j.preempted_at]
    assert preempted, "the mix makes high jobs preempt"
    assert all(j.pclass == "low" for j in preempted)
    for job in preempted:
        # Each preemption after the first came at least MIN_RUN after the attempt it ended began.
        for when, began in zip(job.preempted_at[1:], job.attempt_starts[1:], strict=False):
            assert when - began >= MIN_RUN
        assert len(job.preempted_at) <= 1 + int(sum(
            end - began for end, began in zip(job.preempted_at, job.attempt_starts, strict=False)
        ) // MIN_RUN)  # fmt: skip
        # Never preempted by a job it had preempted.
        assert not any(job.job_id in cluster.jobs[p].preempted_by for p in job.preempted_by)
    print(
        f"\nseed {seed}: {len(preempted)} jobs preempted, "
        f"{sum(len(j.preempted_at) for j in jobs)} preemptions, "
        f"most of one job: {max(len(j.preempted_at) for j in jobs)}"
    )
