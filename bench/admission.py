"""Racing submissions against one quota: never over-admit, never error, and how fast.

N processes, each with its own database connection, wait at a barrier and then submit jobs
through the real services (check, lock, admit, write) as fast as they can, against a quota
that admits exactly `admit` of them. Placement is not on the request path: a real console
worker runs beside them and places each admitted job as the request asks it to, competing for
the same write lock. Used by the race test (which asserts on the counts) and by `make bench`
(which prints the rates).

    python -m bench.admission [--database-url URL]
"""

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RACE_GROUP = "race-team"


@dataclass
class RaceResult:
    database: str
    scope: str
    attempts: int
    admitted: int
    rejected: int
    errors: list[str]
    active_in_db: int
    seconds: float
    latencies: list[float] = field(repr=False)
    admit: int = 0

    @property
    def over_admitted(self) -> int:
        return max(0, self.active_in_db - self.admit)

    def p(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0

    def summary(self) -> str:
        return (
            f"{self.database:<10} {self.scope:<5} quota admits {self.admit}: "
            f"{self.attempts} submissions, {self.admitted} admitted, {self.rejected} rejected, "
            f"{len(self.errors)} errors, over-admitted {self.over_admitted}; "
            f"{self.attempts / self.seconds:.0f} decisions/s, "
            f"{self.admitted / self.seconds:.0f} admissions/s, "
            f"p50 {self.p(0.5) * 1000:.1f} ms, p99 {self.p(0.99) * 1000:.1f} ms"
        )


def _django(database_url: str, redis_url: str) -> None:
    os.environ["DJANGO_SETTINGS_MODULE"] = "console.settings"
    os.environ["DATABASE_URL"] = database_url
    os.environ["REDIS_URL"] = redis_url
    import django

    django.setup()


def _prepare(database_url: str, redis_url: str, processes: int, admit: int, scope: str) -> None:
    env = dict(
        os.environ,
        DATABASE_URL=database_url,
        REDIS_URL=redis_url,
        DJANGO_SETTINGS_MODULE="console.settings",
    )
    for command in (["migrate", "--noinput"], ["load_catalog"]):
        subprocess.run(
            [sys.executable, str(ROOT / "manage.py"), *command],
            env=env,
            check=True,
            capture_output=True,
        )
    _django(database_url, redis_url)
    from django.contrib.auth.models import Group, User

    from jobs.models import Quota

    roomy = {"cpu": 10_000, "gpus": 0, "memory_gb": 100_000, "running_jobs": 10_000}
    tight = {"cpu": admit, "gpus": 0, "memory_gb": 100_000, "running_jobs": 10_000}
    team = Group.objects.create(name=RACE_GROUP)
    for i in range(processes):
        user = User.objects.create_user(f"racer{i}")
        if scope == "user":
            # Everyone submits as racer0, bound by racer0's own quota.
            if i == 0:
                Quota.objects.create(user=user, **tight)
        else:
            Quota.objects.create(user=user, **roomy)
            user.groups.add(team)
    if scope == "group":
        Quota.objects.create(group=team, **tight)
    import redis
    from django.utils import timezone

    from jobs.models import Node

    redis.Redis.from_url(redis_url).flushdb()  # no schedule request left from an earlier race
    for name in ("race-node-1", "race-node-2"):
        Node.objects.create(
            name=name, address="127.0.0.1", cpu=16, memory_gb=64, last_heartbeat=timezone.now()
        )


def _console_worker(database_url: str, redis_url: str) -> subprocess.Popen[bytes]:
    """The real console worker, which places what was admitted as the requests ask it to,
    competing for the same write lock."""
    env = dict(
        os.environ,
        DATABASE_URL=database_url,
        REDIS_URL=redis_url,
        DJANGO_SETTINGS_MODULE="console.settings",
    )
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "console", "worker", "-Q", "console",
         "--pool", "threads", "--concurrency", "4", "--without-mingle", "--without-gossip",
         "--loglevel", "WARNING"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def _racer(
    database_url: str,
    redis_url: str,
    username: str,
    count: int,
    barrier: Barrier,
    results: Any,
) -> None:
    _django(database_url, redis_url)
    from django.contrib.auth.models import User
    from django.db import connection

    from jobs.services.submission import ValidationFailed, check_job_request, submit_job

    user = User.objects.get(username=username)
    request = {
        "name": "race",
        "image": "pytorch:2.13-cpu",
        "program": {"script": "digits-ddp", "args": []},
        "roles": {"master": {"package": "cpu-1", "instances": 1}},
    }
    outcomes: list[tuple[str, float, str]] = []
    # A racer stands for a web process, which settles its garbage collector once started.
    from console import gcpolicy

    gcpolicy.settle()
    barrier.wait()
    for _ in range(count):
        started = time.perf_counter()
        try:
            submit_job(user, check_job_request(request))
            outcome, detail = "admitted", ""
        except ValidationFailed as exc:
            outcome, detail = "rejected", str(exc.errors)
        except Exception as exc:  # counted and reported: the race must produce none
            outcome, detail = "error", f"{type(exc).__name__}: {exc}"
        outcomes.append((outcome, time.perf_counter() - started, detail))
    connection.close()
    results.put(outcomes)


def run_race(
    database_url: str,
    redis_url: str,
    label: str,
    scope: str = "user",
    processes: int = 8,
    per_process: int = 20,
    admit: int = 50,
) -> RaceResult:
    """Race on a fresh, empty database at `database_url` (it is migrated here)."""
    _prepare(database_url, redis_url, processes, admit, scope)
    from django.db import connections

    # Forked from this process, which has Django set up already: 64 spawned processes each
    # importing Django took minutes of CPU on 2 cores (make bench-scale, issue 24). None
    # inherits a database connection: each opens its own.
    connections.close_all()
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(processes + 1)
    results = context.Queue()
    scheduler = _console_worker(database_url, redis_url)
    names = [("racer0" if scope == "user" else f"racer{i}") for i in range(processes)]
    workers = [
        context.Process(
            target=_racer, args=(database_url, redis_url, name, per_process, barrier, results)
        )
        for name in names
    ]
    for w in workers:
        w.start()
    barrier.wait(timeout=600)  # a hang guard: 64 processes on 2 loaded cores are slow to start
    started = time.perf_counter()
    outcomes = [o for _ in workers for o in results.get(timeout=600)]
    seconds = time.perf_counter() - started
    for w in workers:
        w.join(60)
    scheduler.terminate()
    scheduler.wait(60)

    from jobs.models import Job

    active = Job.objects.filter(state__in=Job.ACTIVE_STATES).count()
    return RaceResult(
        database=label,
        scope=scope,
        attempts=len(outcomes),
        admitted=sum(1 for o in outcomes if o[0] == "admitted"),
        rejected=sum(1 for o in outcomes if o[0] == "rejected"),
        errors=[o[2] for o in outcomes if o[0] == "error"],
        active_in_db=active,
        seconds=seconds,
        latencies=[o[1] for o in outcomes],
        admit=admit,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--database-url", required=True, help="a fresh, empty database")
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--label", default="database")
    parser.add_argument("--scope", choices=("user", "group"), default="user")
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--per-process", type=int, default=20)
    parser.add_argument("--admit", type=int, default=50)
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    result = run_race(
        args.database_url,
        args.redis_url,
        args.label,
        args.scope,
        args.processes,
        args.per_process,
        args.admit,
    )
    if args.json:
        print(
            json.dumps(
                {
                    **asdict(result),
                    "over_admitted": result.over_admitted,
                    "p50": result.p(0.5),
                    "p99": result.p(0.99),
                }
            )
        )
    else:
        print(result.summary(), flush=True)
    return 0 if result.over_admitted == 0 and not result.errors else 1


def race_in_subprocess(
    database_url: str,
    redis_url: str,
    label: str,
    scope: str,
    processes: int = 8,
    per_process: int = 20,
    admit: int = 50,
) -> RaceResult:
    """Run the race in fresh processes (Django binds one database per process)."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.admission",
            "--database-url",
            database_url,
            "--redis-url",
            redis_url,
            "--label",
            label,
            "--scope",
            scope,
            "--json",
            "--processes",
            str(processes),
            "--per-process",
            str(per_process),
            "--admit",
            str(admit),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    if not done.stdout.strip():
        raise RuntimeError(f"the race did not run:\n{done.stderr[-3000:]}")
    data = json.loads(done.stdout.strip().splitlines()[-1])
    for derived in ("over_admitted", "p50", "p99"):
        data.pop(derived)
    return RaceResult(**data)


if __name__ == "__main__":
    sys.exit(main())
