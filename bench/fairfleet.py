"""Fair share, borrowing and preemption on the simulated fleet, against the real console
(issue 25, "Measure it"): web, console worker, log keeper and Redis as `make run` starts them,
and N fake agents (bench/fleet.py) that speak the real agent protocol. Jobs are submitted
through the HTTP API; what each group holds is read from the console's database.

Time is compressed by a factor F: the console's settings that the figures depend on (the
preemption grace and minimum run, the fair-share half-life, the backfill and acknowledgement
graces, the reconciliation period) and every job's duration are divided by F, and every figure
is printed in simulated seconds (real seconds × F), with F beside it. Node timings are divided
too, but kept above floors (heartbeat and reconciliation 2 s, node stale 30 s, lost 120 s
real): on a loaded
2-core machine a console that lags a second behind its fleet must not take live nodes for
lost. A fake job runs for its `--fleet-seconds`; a preempted one obeys the stop after
`stop_seconds` (its checkpoint), at most the grace, and runs its whole duration again when it
is placed again (the fleet keeps no checkpoint).

Parts (each in a process of its own, with a console of its own):
- shares: two groups of equal weight (quota = half the cluster, borrowing limit = the other
  half), two users each, submitting without pause (every group keeps a backlog of waiting
  jobs, as far as its quota admits) for 10 simulated minutes: each group's mean share of the
  cores held (target: within 5 % of 50/50);
- lender: group a alone fills the whole cluster, half of it borrowed; then group b submits:
  the time until b holds its nominal share (target: one grace period);
- preemption: 1,000 jobs of random priority classes (low, normal, high), sizes and durations
  on a small fleet; at the end every job's attempts are read from the database and checked:
  each ended exactly once and succeeded, no attempt after a preemption was preempted before
  the minimum run time, no job preempted by a job it preempted, victims always of a strictly
  lower class that may be preempted, no node over-committed.

    python -m bench.fairfleet                       (every part, then the policy simulation)
    python -m bench.fairfleet shares lender         (some parts)
    python -m bench.fairfleet preemption --jobs 200 (a smaller run)
    python -m bench.fairfleet --part PART --json    (one part, in this process: Django binds
                                                     one database per process)
"""

import argparse
import json
import logging
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PARTS = ("shares", "lender", "preemption")

# The console's defaults (docs/operations.md#settings), in simulated seconds.
DEFAULTS = {
    "TRAINYARD_PREEMPTION_GRACE_SECONDS": 30,
    "TRAINYARD_PREEMPTION_MIN_RUN_SECONDS": 600,
    "TRAINYARD_FAIR_SHARE_HALF_LIFE_SECONDS": 21600,
    "TRAINYARD_BACKFILL_GRACE_SECONDS": 300,
    "TRAINYARD_ACK_GRACE_SECONDS": 30,
    "TRAINYARD_RECONCILE_SECONDS": 5,
    "TRAINYARD_NODE_STALE_SECONDS": 15,
    "TRAINYARD_NODE_LOST_SECONDS": 45,
}
# Real seconds below which a setting is not compressed (see the module's docstring).
FLOORS = {
    "TRAINYARD_PREEMPTION_GRACE_SECONDS": 1,
    "TRAINYARD_PREEMPTION_MIN_RUN_SECONDS": 1,
    "TRAINYARD_FAIR_SHARE_HALF_LIFE_SECONDS": 1,
    "TRAINYARD_BACKFILL_GRACE_SECONDS": 1,
    "TRAINYARD_ACK_GRACE_SECONDS": 5,
    "TRAINYARD_RECONCILE_SECONDS": 2,
    # Not under test, and not compressed: a console worker 30 s behind its queue (another
    # bench beside this one on 2 cores) took live simulated nodes for lost and failed their jobs.
    "TRAINYARD_NODE_STALE_SECONDS": 30,
    "TRAINYARD_NODE_LOST_SECONDS": 120,
}
HEARTBEAT_SECONDS = 5.0  # the agents' default
# Twenty heartbeats a second and a reconciliation pass a second kept a console worker on a
# loaded 2-core machine 200 to 400 messages behind: the starts and exits the figures depend on
# waited behind them, and heartbeats expired in the queue made live nodes look lost.
HEARTBEAT_FLOOR = 2.0
RESTART_BACKOFF_SECONDS = 10  # a job's default back-off (jobs.models), before a preempted one
# requeues
# Each replica takes REPLICA_CORES: fewer, larger replicas than the starter cpu-2 mean fewer
# start and exit messages for the console worker for the same cores.
PACKAGE = "bench-4c"
REPLICA_CORES = 4
WINDOW_SECONDS = 600.0  # simulated: the ten minutes
SETTLE_SECONDS = 300.0  # real: a bound on waiting for the console (not a figure)


@dataclass(frozen=True)
class Clock:
    factor: float

    def real(self, simulated: float) -> float:
        return simulated / self.factor

    def simulated(self, real: float) -> float:
        return real * self.factor

    def settings(self) -> dict[str, int]:
        """Each setting in real seconds: the default divided by the factor, above its floor."""
        return {
            name: max(FLOORS[name], round(value / self.factor)) for name, value in DEFAULTS.items()
        }

    @property
    def heartbeat(self) -> float:
        return max(HEARTBEAT_FLOOR, HEARTBEAT_SECONDS / self.factor)

    @property
    def grace(self) -> float:
        """The preemption grace in real seconds, as the console has it."""
        return float(self.settings()["TRAINYARD_PREEMPTION_GRACE_SECONDS"])

    @property
    def min_run(self) -> float:
        return float(self.settings()["TRAINYARD_PREEMPTION_MIN_RUN_SECONDS"])

    def describe(self) -> str:
        s = self.settings()
        parts = [f"{name.removeprefix('TRAINYARD_').removesuffix('_SECONDS').lower()} "
                 f"{value} s (= {self.simulated(value):g} s simulated)"
                 for name, value in s.items()]  # fmt: skip
        parts.append(f"heartbeat {self.heartbeat:g} s (= {self.simulated(self.heartbeat):g} s)")
        return f"time × {self.factor:g}: " + ", ".join(parts)


def _wait(what: str, condition: Callable[[], bool], seconds: float = SETTLE_SECONDS) -> None:
    """Until `condition()`; a bench's bound (past it the part reports why), not a figure."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"waited {seconds:.0f} s for {what}")
        time.sleep(0.2)


# --- a console of its own, with the fleet's nodes provisioned ---


@dataclass
class Console:
    stack: Any
    urls: dict[str, str]
    clock: Clock
    tokens: dict[str, str] = field(default_factory=dict)

    def client(self, user: str) -> Any:
        import httpx

        return httpx.Client(
            base_url=self.stack.url,
            headers={"Authorization": f"Token {self.tokens[user]}"},
            timeout=120,
        )

    def add_users(self, groups: dict[str, list[str]], nominal: int, borrow: int) -> None:
        """Each group with quota `nominal` cores (its nominal share) and borrowing limit
        `borrow`; each user with a quota of their own that binds nothing. An empty group name:
        users in no group."""
        from django.contrib.auth.models import Group, User

        from jobs.models import Package, Quota

        Package.objects.get_or_create(
            name=PACKAGE, defaults={"cpu": REPLICA_CORES, "memory_gb": 1, "roles": []}
        )
        for group_name, users in groups.items():
            group = None
            if group_name:
                group = Group.objects.create(name=group_name)
                Quota.objects.create(group=group, cpu=nominal, gpus=0, memory_gb=10**6,
                                     running_jobs=10**5, borrow_cpu=borrow)  # fmt: skip
            for name in users:
                user = User.objects.create_user(name)
                if group is not None:
                    user.groups.add(group)
                Quota.objects.create(user=user, cpu=10**6, gpus=0, memory_gb=10**8,
                                     running_jobs=10**5)  # fmt: skip
                self.tokens[name] = self.stack.manage("token", name).strip()


@contextmanager
def console(clock: Clock, nodes: int) -> Iterator[Console]:
    from bench.fleet import provision
    from stack.redis_server import free_port
    from stack.run import Stack

    with tempfile.TemporaryDirectory(prefix="fairfleet-") as folder:
        database_url = f"sqlite:///{Path(folder) / 'fairfleet.sqlite3'}"
        env = {"DATABASE_URL": database_url, **{k: str(v) for k, v in clock.settings().items()}}
        stack = Stack(var_dir=Path(folder) / "var", port=free_port(), nodes=0, extra_env=env,
                      announce=lambda line: None)  # fmt: skip
        stack.prepare()
        stack.start()
        try:
            os.environ.update(env)
            os.environ.update({"DJANGO_SETTINGS_MODULE": "console.settings",
                               "REDIS_URL": stack.redis_url,
                               "TRAINYARD_VAR_DIR": str(stack.var_dir)})  # fmt: skip
            import django

            django.setup()
            urls = provision(stack.manage, [f"fair-{i:03}" for i in range(nodes)])
            yield Console(stack, urls, clock)
        finally:
            stack.stop()


def _ready(urls: dict[str, str]) -> Callable[[], bool]:
    from jobs.models import Node

    def ready() -> bool:
        return (
            Node.objects.filter(name__in=list(urls), state=Node.State.READY).count() >= len(urls)
            and not Node.objects.filter(name__in=list(urls), last_heartbeat=None).exists()
        )

    return ready


def request(name: str, instances: int, real_seconds: float, backoff: int,
            priority: str | None = None) -> dict[str, Any]:  # fmt: skip
    """A job of `instances` replicas of PACKAGE that runs `real_seconds` on the fleet."""
    from bench.fleet import SECONDS_ARG

    roles: dict[str, Any] = {"master": {"package": PACKAGE, "instances": 1}}
    if instances > 1:
        roles["worker"] = {"package": PACKAGE, "instances": instances - 1}
    body: dict[str, Any] = {
        "name": name,
        "image": "pytorch:2.13-cpu",
        "roles": roles,
        "program": {"script": "digits-ddp", "args": [SECONDS_ARG, f"{real_seconds:.3f}"]},
        # A preempted job waits its back-off before it goes back to the queue: compressed too.
        "restart": {"policy": "never", "backoff_seconds": backoff},
    }
    if priority is not None:
        body["priority"] = priority
    return body


def held_by_group() -> dict[str, int]:
    """Cores each group's jobs hold now, from the database: replicas placed or running,
    earlier attempts still stopping included."""
    from django.db.models import Sum

    from jobs.models import Replica

    rows = (
        Replica.objects.filter(state__in=Replica.HOLDING_STATES, package__isnull=False)
        .values_list("job__owner__groups__name")
        .annotate(cores=Sum("package__cpu"))
    )
    return {str(group): int(cores or 0) for group, cores in rows}


def waiting_by_group() -> dict[str, int]:
    """Jobs each group has waiting for room: not yet placed (a placed job is queued until its
    agents say its replicas run, but it holds its room already)."""
    from django.db.models import Count

    from jobs.models import Job, Replica

    rows = (
        Job.objects.filter(
            state__in=(Job.State.PENDING, Job.State.QUEUED, Job.State.RESTARTING),
            replicas__state=Replica.State.PENDING,
        )
        .values_list("owner__groups__name")
        .annotate(n=Count("id", distinct=True))
    )
    return {str(group): int(n) for group, n in rows}


def waiting_reasons(group: str) -> list[tuple[int, int, str]]:
    """(job id, cores, reason) of the group's waiting jobs, in submission order."""
    from jobs.models import Job

    return [
        (int(pk), int(cpu), str(reason))
        for pk, cpu, reason in Job.objects.filter(
            owner__groups__name=group, state__in=(Job.State.QUEUED, Job.State.RESTARTING)
        )
        .order_by("id")
        .values_list("id", "cpu_total", "reason")
    ]


def reclaimed_at(group: str) -> list[float]:
    """When the group's attempts were ended to return borrowed capacity (time.time())."""
    from jobs.models import JobAttempt

    return sorted(
        finished.timestamp()
        for finished in JobAttempt.objects.filter(
            job__owner__groups__name=group,
            reason__startswith="preempted to return borrowed capacity",
            finished__isnull=False,
        ).values_list("finished", flat=True)
        if finished is not None
    )


class Submitters:
    """Each group's users submit without pause: whenever a group has fewer than `backlog` jobs
    waiting, its next user (in turn) submits one, unless the group's quota refuses it. Jobs are
    one to four replicas of REPLICA_CORES cores and run `durations` simulated seconds."""

    def __init__(self, console: Console, groups: dict[str, list[str]], backlog: dict[str, int],
                 durations: tuple[float, float], seed: int) -> None:  # fmt: skip
        self.console = console
        self.groups = groups
        self.backlog = backlog
        self.durations = durations
        self.rng = random.Random(seed)  # noqa: S311 (a reproducible bench, no secret)
        self.clients = {u: console.client(u) for users in groups.values() for u in users}
        self.turn = dict.fromkeys(groups, 0)
        self.submitted: dict[str, list[int]] = {g: [] for g in groups}
        self.owned: dict[str, list[int]] = {u: [] for u in self.clients}
        self.refused = Counter[str]()
        self.first_submission: dict[str, float] = {}
        self.answered: dict[str, list[float]] = {g: [] for g in groups}  # when each was admitted

    def top_up(self, groups: list[str]) -> None:
        waiting = waiting_by_group()
        clock = self.console.clock
        backoff = round(RESTART_BACKOFF_SECONDS / clock.factor)
        for group in groups:
            for _ in range(max(0, self.backlog[group] - waiting.get(group, 0))):
                users = self.groups[group]
                user = users[self.turn[group] % len(users)]
                self.turn[group] += 1
                seconds = clock.real(self.rng.uniform(*self.durations))
                body = request(f"{group}-{len(self.submitted[group])}",
                               self.rng.choice((1, 1, 2, 4)), seconds, backoff)  # fmt: skip
                self.first_submission.setdefault(group, time.time())
                response = self.clients[user].post("/api/v1/jobs", json=body)
                if response.status_code != 201:
                    if "Over quota" not in response.text:
                        raise RuntimeError(f"a submission was refused: {response.text[:300]}")
                    self.refused[group] += 1
                    break  # the group holds and waits for all its limit allows
                self.submitted[group].append(int(response.json()["id"]))
                self.answered[group].append(time.time())
                self.owned[user].append(self.submitted[group][-1])

    def close(self) -> None:
        for client in self.clients.values():
            client.close()


def _cancel_everything(submitters: Submitters) -> None:
    """Each job cancelled by its owner, and waited for until its replicas are stopped."""
    from jobs.models import Replica

    for user, ids in submitters.owned.items():
        for job_id in ids:
            submitters.clients[user].post(f"/api/v1/jobs/{job_id}/cancel")
    ids = [j for ids in submitters.owned.values() for j in ids]
    _wait("every job's replicas stopped", lambda: not Replica.objects.filter(
        job_id__in=ids, state__in=Replica.HOLDING_STATES).exists())  # fmt: skip


def _fleet_core_seconds(events: list[Any], group_of: dict[int, str], since: float,
                        until: float) -> dict[str, float]:  # fmt: skip
    """Core-seconds each group's replicas ran on the fleet within [since, until] (from the
    fleet's own start, exit and stop events: what really ran, not what the database says)."""
    totals: dict[str, float] = {}
    held: dict[str, int] = {}
    last = since
    for event in sorted(events, key=lambda e: e.at):
        group = group_of.get(event.job_id)
        if group is None or event.kind not in ("start", "exit", "stop"):
            continue
        at = min(max(event.at, since), until)
        for g, cores in held.items():
            totals[g] = totals.get(g, 0.0) + cores * (at - last)
        last = at
        held[group] = held.get(group, 0) + (event.cpus if event.kind == "start" else -event.cpus)
    for g, cores in held.items():
        totals[g] = totals.get(g, 0.0) + cores * (until - last)
    return totals


# --- the parts ---


def shares(clock: Clock, nodes: int, node_cpus: int, seed: int) -> dict[str, Any]:
    import redis

    from bench.fleet import FleetConfig, FleetThread
    from workers import contract

    cluster = nodes * node_cpus
    groups = {"team-a": ["alice", "anna"], "team-b": ["bob", "bea"]}
    started = time.perf_counter()
    with console(clock, nodes) as c:
        c.add_users(groups, nominal=cluster // 2, borrow=cluster - cluster // 2)
        config = FleetConfig(cpus=node_cpus, memory_gb=10**4, heartbeat_seconds=clock.heartbeat,
                             stop_seconds=clock.grace / 2)  # fmt: skip
        with FleetThread(c.urls, config) as fleet:
            _wait("every simulated node ready", _ready(c.urls))
            submitters = Submitters(c, groups, dict.fromkeys(groups, 8), (60, 240), seed)
            samples: list[tuple[float, dict[str, int]]] = []
            t0 = time.time()
            window = clock.real(WINDOW_SECONDS)
            queue = redis.Redis.from_url(c.stack.redis_url)
            backlog = 0  # the most messages waiting for the console worker
            middle: list[tuple[int, int, str]] = []
            while (now := time.time()) < t0 + window:
                submitters.top_up(list(groups))
                samples.append((now, held_by_group()))
                backlog = max(backlog, int(queue.llen(contract.CONSOLE_QUEUE)))
                if not middle and now > t0 + window / 2:
                    middle = waiting_reasons("team-a") + waiting_reasons("team-b")
                time.sleep(0.25)
            t1 = time.time()
            events = fleet.call(lambda: list(fleet.fleet.events))
            group_of = {j: g for g, ids in submitters.submitted.items() for j in ids}
            _cancel_everything(submitters)
            submitters.close()
    ran = _fleet_core_seconds(events, group_of, t0, t1)
    mean = {g: sum(s.get(g, 0) for _, s in samples) / max(1, len(samples)) for g in groups}
    late = [s for at, s in samples if at >= t0 + window / 2]
    mean_late = {g: sum(s.get(g, 0) for s in late) / max(1, len(late)) for g in groups}
    return {
        "factor": clock.factor, "clock": clock.describe(), "nodes": nodes, "cores": cluster,
        "samples": len(samples), "mean_held": mean, "mean_held_second_half": mean_late,
        "fleet_core_seconds": ran,
        "submitted": {g: len(v) for g, v in submitters.submitted.items()},
        "refused": dict(submitters.refused), "window_real_seconds": t1 - t0,
        "console_queue_max": backlog, "waiting_at_half": middle[:8],
        "real_seconds": time.perf_counter() - started,
    }  # fmt: skip


def lender(clock: Clock, nodes: int, node_cpus: int, seed: int) -> dict[str, Any]:
    from bench.fleet import FleetConfig, FleetThread

    cluster = nodes * node_cpus
    nominal = cluster // 2
    groups = {"team-a": ["alice", "anna"], "team-b": ["bob", "bea"]}
    started = time.perf_counter()
    with console(clock, nodes) as c:
        c.add_users(groups, nominal=nominal, borrow=cluster - nominal)
        # Victims use their whole grace to save a checkpoint: the worst case.
        config = FleetConfig(cpus=node_cpus, memory_gb=10**4, heartbeat_seconds=clock.heartbeat,
                             stop_seconds=clock.grace)  # fmt: skip
        with FleetThread(c.urls, config) as fleet:
            _wait("every simulated node ready", _ready(c.urls))
            # Jobs that outlast the measurement: only reclaim gives b its share back. b comes
            # back with more waiting than its share (16 jobs of 7 cores on average), as a team
            # does after a night away: a backlog smaller than its share would come back in
            # waves, each a grace apart.
            backlog = {"team-a": 4, "team-b": 16}
            submitters = Submitters(c, groups, backlog, (3600, 7200), seed)

            def a_fills() -> bool:
                submitters.top_up(["team-a"])
                return held_by_group().get("team-a", 0) >= cluster

            _wait("group a holding the whole cluster", a_fills)
            a_before = held_by_group().get("team-a", 0)
            arrived = time.time()
            curve: list[tuple[float, int]] = []
            reached: dict[str, float] = {}
            mid_grace: list[tuple[int, int, str]] = []
            # Nine tenths of it, and all of it (b's jobs of 4 to 16 cores may not add up to it
            # exactly: one that would take b beyond its share reclaims nothing).
            thresholds = {"90 %": -(-9 * nominal // 10), "all": nominal}
            while time.time() < arrived + clock.real(WINDOW_SECONDS) and "all" not in reached:
                submitters.top_up(["team-a", "team-b"])
                now = time.time()
                b = held_by_group().get("team-b", 0)
                curve.append((now - arrived, b))
                for name, cores in thresholds.items():
                    if b >= cores and name not in reached:
                        reached[name] = now - arrived
                if not mid_grace and now - arrived >= clock.grace / 2:
                    # What b's jobs are told while the first victims save their checkpoints:
                    # each should be reclaiming already, not waiting for a second round.
                    mid_grace = waiting_reasons("team-b")
                time.sleep(0.1)
            events = fleet.call(lambda: list(fleet.fleet.events))
            group_of = {j: g for g, ids in submitters.submitted.items() for j in ids}
            stops = [e for e in events if e.kind == "stop" and group_of.get(e.job_id) == "team-a"]
            final = held_by_group()
            b_waiting = waiting_reasons("team-b")
            evicted = reclaimed_at("team-a")
            _cancel_everything(submitters)
            submitters.close()
    first_stop = min((e.at for e in stops), default=float("nan")) - arrived
    return {
        "factor": clock.factor, "clock": clock.describe(), "nodes": nodes, "cores": cluster,
        "nominal": nominal, "a_held_before": a_before, "grace_real": clock.grace,
        "reached_real": reached, "thresholds": thresholds, "final_held": final,
        "victim_replicas_stopped": len(stops), "first_stop_real": first_stop,
        "b_held_last": curve[-1][1] if curve else 0,
        "curve": _changes(curve),
        "b_waiting": b_waiting,
        "b_waiting_mid_grace": mid_grace,
        # What took the time: b's submissions (the web, under load), the evictions (the console
        # worker's passes) and the victims' stops (the grace).
        "b_admitted_real": [t - arrived for t in submitters.answered["team-b"][:16]],
        "evicted_real": [t - arrived for t in evicted],
        "real_seconds": time.perf_counter() - started,
    }  # fmt: skip


def _changes(curve: list[tuple[float, int]]) -> list[tuple[float, int]]:
    """The (seconds, cores) points where the cores change, and the last one."""
    out = [(round(at, 2), cores) for k, (at, cores) in enumerate(curve)
           if k == 0 or cores != curve[k - 1][1]]  # fmt: skip
    return out + curve[-1:] if curve and out[-1] != curve[-1] else out


CLASSES = {"low": 0.5, "normal": 0.3, "high": 0.2}


def preemption(clock: Clock, nodes: int, node_cpus: int, seed: int, jobs: int) -> dict[str, Any]:
    """1,000 jobs of random classes, sizes and durations, each user submitting while fewer
    than BACKLOG jobs wait; then the checks, from the database and the fleet's events."""
    from bench.fleet import FleetConfig, FleetThread

    rng = random.Random(seed)  # noqa: S311 (a reproducible bench, no secret)
    users = ["pam", "pete", "pia"]
    started = time.perf_counter()
    backoff = round(RESTART_BACKOFF_SECONDS / clock.factor)
    with console(clock, nodes) as c:
        from jobs.models import Job  # once the console's database is set

        c.add_users({"": users}, nominal=0, borrow=0)
        config = FleetConfig(cpus=node_cpus, memory_gb=10**4, heartbeat_seconds=clock.heartbeat,
                             stop_seconds=clock.grace / 2)  # fmt: skip
        clients = {u: c.client(u) for u in users}
        submitted: dict[int, str] = {}
        with FleetThread(c.urls, config) as fleet:
            _wait("every simulated node ready", _ready(c.urls))
            backlog = 2 * nodes
            while len(submitted) < jobs:
                waiting = Job.objects.filter(
                    state__in=(Job.State.PENDING, Job.State.QUEUED, Job.State.RESTARTING)
                ).count()
                for _ in range(min(jobs - len(submitted), max(0, backlog - waiting))):
                    pclass = rng.choices(list(CLASSES), list(CLASSES.values()))[0]
                    # Half a minute to 10 minutes simulated; low jobs up to 25, so that some
                    # run past the minimum run time (10 minutes) after a preemption and may be
                    # preempted again.
                    seconds = clock.real(rng.uniform(60, 1500) if pclass == "low"
                                         else rng.uniform(30, 600))  # fmt: skip
                    body = request(f"p-{len(submitted)}", rng.choice((1, 1, 1, 2, 3)), seconds,
                                   backoff, pclass)  # fmt: skip
                    response = clients[rng.choice(users)].post("/api/v1/jobs", json=body)
                    if response.status_code != 201:
                        raise RuntimeError(f"a submission was refused: {response.text[:300]}")
                    submitted[int(response.json()["id"])] = pclass
                time.sleep(0.5)
            submitting_ended = time.perf_counter()
            _wait("every job ended", lambda: Job.objects.filter(
                pk__in=list(submitted), state__in=Job.ACTIVE_STATES).count() == 0,
                seconds=SETTLE_SECONDS + clock.real(900) * jobs / nodes)  # fmt: skip
            events = fleet.call(lambda: list(fleet.fleet.events))
        for client in clients.values():
            client.close()
        checks = check_preemptions(list(submitted), events, clock, node_cpus)
    checks.update({
        "factor": clock.factor, "clock": clock.describe(), "nodes": nodes,
        "cores": nodes * node_cpus,
        "jobs": len(submitted), "classes": dict(Counter(submitted.values())),
        "submitting_real_seconds": submitting_ended - started,
        "real_seconds": time.perf_counter() - started,
    })  # fmt: skip
    return checks


def _attempt_story(runs: list[Any], number: int, events: list[Any], job_id: int) -> str:
    """What the database says of the attempt, beside when the fleet saw its replicas exit:
    enough to tell a preemption that raced a job's own end."""
    row = next((a for a in runs if a.number == number), None)
    if row is None:
        return "no attempt row"
    ends = [e.at for e in events if e.job_id == job_id and e.attempt == number
            and e.kind in ("exit", "stop")]  # fmt: skip
    began = (row.started or row.placed).timestamp() if (row.started or row.placed) else None
    finished = row.finished.timestamp() if row.finished else None
    parts = [f"reason {row.reason or '(none)'}"]
    if began is not None and finished is not None:
        parts.append(f"ended by the console {finished - began:.2f} s real after it started")
    if ends and finished is not None:
        parts.append(f"the fleet's last exit {max(ends) - finished:+.2f} s from that")
    return ", ".join(parts)


def check_preemptions(ids: list[int], events: list[Any], clock: Clock,
                      node_cpus: int) -> dict[str, Any]:  # fmt: skip
    """Every job's attempts, from the database, against the rules (README, *Priority classes
    and preemption*); each finding names the job and what happened."""
    from jobs.models import Job, JobAttempt

    jobs = {j.pk: j for j in Job.objects.filter(pk__in=ids).select_related("priority_class")}
    attempts: dict[int, list[JobAttempt]] = {}
    for a in JobAttempt.objects.filter(job_id__in=ids).order_by("job_id", "number"):
        attempts.setdefault(a.job_id, []).append(a)
    findings: list[str] = []  # a preemption rule broken
    elsewise: list[str] = []  # not a preemption rule: a job that ended otherwise, and why
    states = Counter(j.state for j in jobs.values())
    preempted_counts = Counter(len(j.preempted_by) for j in jobs.values())
    shortest_again = float("inf")  # the shortest run of an attempt preempted after a preemption
    shortest_first = float("inf")
    victims_by_class = Counter[str]()
    for job_id, job in jobs.items():
        if job.state != Job.State.SUCCEEDED:
            elsewise.append(f"job {job_id} ended {job.state}: {job.reason}")
        runs = attempts.get(job_id, [])
        if len(runs) != job.attempt + 1:
            findings.append(f"job {job_id}: {len(runs)} attempt rows for attempt {job.attempt}")
        preempted = [a for a in runs if a.reason.startswith("preempted")]
        others = [a for a in runs[:-1] if not a.reason.startswith("preempted")]
        for a in others:
            elsewise.append(f"job {job_id} attempt {a.number} ended otherwise: {a.reason}")
        if len(preempted) != len(job.preempted_by):
            findings.append(f"job {job_id}: {len(preempted)} preempted attempts, "
                            f"preempted_by {job.preempted_by}")  # fmt: skip
        for k, a in enumerate(preempted):
            began = a.started or a.placed
            if began is None or a.finished is None:
                findings.append(f"job {job_id} attempt {a.number} preempted: no start or end")
                continue
            ran = (a.finished - began).total_seconds()
            if k == 0:
                shortest_first = min(shortest_first, ran)
            else:
                shortest_again = min(shortest_again, ran)
                if ran < clock.min_run:
                    findings.append(f"job {job_id} attempt {a.number} preempted after "
                                    f"{clock.simulated(ran):.0f} s (simulated) of running, "
                                    f"below the minimum run: {a.reason}")  # fmt: skip
        victims_by_class[job.priority_name] += len(job.preempted_by)
        for by in job.preempted_by:
            other = jobs.get(int(by))
            if other is None:
                findings.append(f"job {job_id} preempted by job {by}, not of this run")
                continue
            if job_id in [int(x) for x in other.preempted_by]:
                findings.append(f"jobs {job_id} and {by} preempted each other")
            if not other.priority > job.priority:
                findings.append(f"job {job_id} ({job.priority}) preempted by job {by} "
                                f"({other.priority}): not strictly lower")  # fmt: skip
            if job.priority_class is not None and not job.priority_class.may_be_preempted:
                findings.append(f"job {job_id} of class {job.priority_class.name} preempted")
    # On the fleet: each replica of each attempt started once and ended once (an exit for
    # the last attempt, a stop for a preempted one), and no node over-committed.
    seen: dict[tuple[int, int, str, int], Counter[str]] = {}
    for e in events:
        seen.setdefault((e.job_id, e.attempt, e.role, e.index), Counter())[e.kind] += 1
    for (job_id, attempt, role, index), kinds in seen.items():
        if job_id not in jobs:
            continue
        want = (
            {"start": 1, "exit": 1} if attempt == jobs[job_id].attempt else {"start": 1, "stop": 1}
        )
        if {k: v for k, v in kinds.items() if k != "duplicate-start"} != want:
            # A job that failed (its node taken for lost) was not ended by a preemption.
            into = findings if jobs[job_id].state == Job.State.SUCCEEDED else elsewise
            story = _attempt_story(attempts.get(job_id, []), attempt, events, job_id)
            into.append(f"job {job_id} attempt {attempt} {role}-{index} on the fleet: "
                        f"{dict(kinds)}; {story}")  # fmt: skip
    over = [e for e in events if e.in_use_cpus > node_cpus]
    if over:
        findings.append(f"{len(over)} events with a node over-committed, e.g. {over[0]}")
    return {
        "states": dict(states),
        "preempted_per_job": {str(k): v for k, v in sorted(preempted_counts.items())},
        "preemptions": sum(len(j.preempted_by) for j in jobs.values()),
        "victims_by_class": dict(victims_by_class),
        "shortest_first_run_real": shortest_first if shortest_first != float("inf") else None,
        "shortest_run_again_real": shortest_again if shortest_again != float("inf") else None,
        "min_run_real": clock.min_run,
        "duplicate_starts": sum(k["duplicate-start"] for k in seen.values()),
        "findings": findings,
        "other": elsewise,
    }


# --- printing ---


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def print_shares(r: dict[str, Any]) -> None:
    f = r["factor"]
    print(f"fair share on the fleet: {r['nodes']} nodes, {r['cores']} cores, two groups of equal"
          f" weight (nominal {r['cores'] // 2} cores, may borrow {r['cores'] - r['cores'] // 2}),"
          f" {r['window_real_seconds'] * f / 60:.1f} simulated minutes"
          f" ({r['window_real_seconds']:.0f} s real, time × {f:g})")  # fmt: skip
    for label, held in (("whole window", r["mean_held"]),
                        ("second half", r["mean_held_second_half"]),
                        ("ran on the fleet", r["fleet_core_seconds"])):  # fmt: skip
        total = sum(held.values()) or 1.0
        a, b = held.get("team-a", 0.0) / total, held.get("team-b", 0.0) / total
        unit = "core-s" if label == "ran on the fleet" else "cores held on average"
        met = "met" if abs(a - 0.5) <= 0.05 else "NOT met"
        print(f"  {label}: team-a {_pct(a)}, team-b {_pct(b)} ({held.get('team-a', 0):.0f} / "
              f"{held.get('team-b', 0):.0f} {unit}); target 50 % ± 5 %: {met}")  # fmt: skip
    for job_id, cores, reason in r["waiting_at_half"]:
        print(f"  half-way, job {job_id} ({cores} cores) waits: {reason}")
    used = sum(r["mean_held"].values()) / r["cores"]
    print(
        f"  cluster in use {_pct(used)} on average; jobs submitted {r['submitted']}, "
        f"refused by quota {r['refused']}; most messages waiting for the console worker "
        f"{r['console_queue_max']}; took {r['real_seconds']:.0f} s real"
    )


def print_lender(r: dict[str, Any]) -> None:
    f = r["factor"]
    grace = r["grace_real"] * f
    print(f"the lender's share back: team-a held {r['a_held_before']} of {r['cores']} cores "
          f"(half of it borrowed), then team-b (nominal {r['nominal']}) submitted; "
          f"victims take their whole grace (time × {f:g})")  # fmt: skip
    for name, cores in r["thresholds"].items():
        at = r["reached_real"].get(name)
        if at is None:
            print(f"  team-b holding ≥ {cores} cores: not within 10 simulated minutes "
                  f"(it held {r['b_held_last']})")  # fmt: skip
            continue
        sim = at * f
        print(
            f"  team-b holding ≥ {cores} cores after {sim:.0f} s simulated ({at:.1f} s real)"
            f" = {sim / grace:.2f} grace periods of {grace:.0f} s, {sim - grace:+.0f} s beyond "
            f"one; target one grace (met: within 1.5, the victims using all of theirs): "
            f"{'met' if sim <= grace * 1.5 else 'NOT met'}"
        )
    admitted, evicted = r["b_admitted_real"], r["evicted_real"]
    if admitted:
        print(f"  team-b's first {len(admitted)} jobs admitted {admitted[0] * f:.0f} to "
              f"{admitted[-1] * f:.0f} s simulated after its first submission")  # fmt: skip
    if evicted:
        print(f"  {len(evicted)} jobs of team-a evicted {evicted[0] * f:.0f} to "
              f"{evicted[-1] * f:.0f} s simulated after it")  # fmt: skip
    for job_id, cores, reason in r.get("b_waiting_mid_grace", [])[:20]:
        print(f"  half-way through the first grace, team-b's job {job_id} ({cores} cores) "
              f"waits: {reason}")  # fmt: skip
    for job_id, cores, reason in r["b_waiting"][:6]:
        print(f"  at the end team-b's job {job_id} ({cores} cores) waits: {reason}")
    steps = ", ".join(f"{at * f:.0f} s: {cores}" for at, cores in r["curve"][:40])
    print(f"  team-b's cores over simulated time: {steps}")
    print(f"  first victim stopped {r['first_stop_real'] * f:.0f} s simulated after b's first "
          f"submission; {r['victim_replicas_stopped']} replicas of team-a stopped; "
          f"took {r['real_seconds']:.0f} s real")  # fmt: skip


def print_preemption(r: dict[str, Any]) -> None:
    f = r["factor"]
    print(f"preemption on the fleet: {r['jobs']} jobs {r['classes']} on {r['nodes']} nodes "
          f"({r['cores']} cores), time × {f:g}, minimum run {r['min_run_real'] * f:.0f} s "
          f"simulated")  # fmt: skip
    print(
        f"  ended: {r['states']}; preemptions {r['preemptions']}, victims by class "
        f"{r['victims_by_class']}; jobs by times preempted {r['preempted_per_job']}"
    )
    again = r["shortest_run_again_real"]
    first = r["shortest_first_run_real"]
    print("  shortest run of a preempted attempt: "
          f"first {first * f if first is not None else float('nan'):.0f} s, after an earlier "
          f"preemption {again * f if again is not None else float('nan'):.0f} s (minimum "
          f"{r['min_run_real'] * f:.0f} s); repeated start messages answered "
          f"{r['duplicate_starts']}")  # fmt: skip
    findings = r["findings"]
    print(
        f"  rules broken: {len(findings)}"
        + (
            ""
            if findings
            else " (no loop, none preempted "
            "before the minimum run, none by a job it preempted, every job ended once)"
        )
    )
    for line in findings[:30]:
        print(f"    {line}")
    if r["other"]:
        print(
            f"  jobs that did not succeed for another reason than a preemption: {len(r['other'])}"
        )
        for line in r["other"][:10]:
            print(f"    {line}")
    print(f"  took {r['real_seconds']:.0f} s real ({r['submitting_real_seconds']:.0f} s of "
          f"submitting)")  # fmt: skip


PRINTERS = {"shares": print_shares, "lender": print_lender, "preemption": print_preemption}


def factor_for(part: str, asked: float) -> float:
    """The preemption run compresses more: 1,000 jobs at × 5 would take hours. At × 60 the
    grace stays at its floor, 1 s real (60 s simulated, not 30)."""
    return asked or (60.0 if part == "preemption" else 5.0)


def run_part(args: argparse.Namespace) -> dict[str, Any]:
    clock = Clock(factor_for(args.part, args.factor))
    if args.part == "shares":
        return shares(clock, args.nodes or 20, 8, args.seed)
    if args.part == "lender":
        return lender(clock, args.nodes or 20, 8, args.seed)
    # Small enough that room, not the console worker, bounds how many run: jobs that may
    # preempt find it full (on 12 nodes and a loaded machine, hardly any preemption happened).
    return preemption(clock, args.nodes or 4, 16, args.seed, args.jobs)


def in_fresh_process(part: str, args: argparse.Namespace) -> dict[str, Any]:
    """One part in a process of its own (Django binds one database per process); its stderr
    passes through."""
    argv = [sys.executable, "-m", "bench.fairfleet", "--part", part, "--json",
            "--seed", str(args.seed), "--jobs", str(args.jobs)]  # fmt: skip
    if args.factor:
        argv += ["--factor", str(args.factor)]
    if args.nodes:
        argv += ["--nodes", str(args.nodes)]
    done = subprocess.run(argv, cwd=ROOT, stdout=subprocess.PIPE, text=True, check=False)
    if done.returncode != 0 or not done.stdout.strip():
        raise RuntimeError(f"part {part} did not run (exit {done.returncode})")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request otherwise
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("parts", nargs="*", default=[], help=f"of {', '.join(PARTS)}")
    parser.add_argument("--part", choices=PARTS, help="run one part in this process")
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--factor", type=float, default=0.0, help="time compression (default 5; 60 for preemption)"
    )
    parser.add_argument("--nodes", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=25)
    parser.add_argument(
        "--no-policy", action="store_true", help="skip the policy simulation (bench/fairness.py)"
    )
    args = parser.parse_args(argv)
    if unknown := [p for p in args.parts if p not in PARTS]:
        parser.error(f"no part {', '.join(unknown)}: the parts are {', '.join(PARTS)}")
    if args.part:
        result = run_part(args)
        if args.json:
            print(json.dumps(result))
        else:
            PRINTERS[args.part](result)
        return 0
    failed = 0
    for part in args.parts or PARTS:
        print(f"[{part}] {Clock(factor_for(part, args.factor)).describe()}", flush=True)
        try:
            PRINTERS[part](in_fresh_process(part, args))
        except RuntimeError as exc:
            failed += 1
            print(f"  not measured: {exc}")
        sys.stdout.flush()
    if not args.no_policy and {"shares", "lender"} & set(args.parts or PARTS):
        print("second line, the policy modules alone (bench/fairness.py, no console, simulated "
              "time):", flush=True)  # fmt: skip
        # On as many nodes as the fleet (its nodes have 8 cores too), with jobs of 2-core
        # instances and victims that stop within the grace.
        policy = [sys.executable, "-m", "bench.fairness", "--nodes", str(args.nodes or 20)]
        subprocess.run(policy, cwd=ROOT, check=False)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
