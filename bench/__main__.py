"""`make bench`: every figure beside a baseline measured in the same run, as a ratio.

Admission: 8 processes racing 20 submissions each against a quota that admits 50, next to one
process submitting 50 alone (no contention), on SQLite and on PostgreSQL when reachable.

Reconciliation: one pass over 200 nodes and 2,000 replicas, next to one schedule() call on the
same database, on SQLite and on PostgreSQL when reachable (bench/reconcile.py).

Heartbeats: 200 nodes' heartbeats at 200 a second through the console's task function, written
one transaction each beside batched: CPU per heartbeat, on SQLite and on PostgreSQL when
reachable (bench/heartbeats.py).

Parameter server: the digits example on 2 workers in kvstore modes dist_sync and dist_async,
next to DDP with 2 ranks, same per-worker batch and seed (bench/ps.py).

Recovery: a kill -9 of one instance of a restartable DDP job: time until every instance runs
and steps again, and the epochs done twice, next to the same job without a fault
(bench/recovery.py).

Logs: lines/s, latency and CPU from trainer through node agent and Redis to a websocket client,
next to a bare pipe reader, and a training loop's speed with logging on vs /dev/null
(bench/logs.py).

Start and end: submit -> first training line and last line -> `succeeded` at a websocket client
for a two-instance DDP job, next to bare `torchrun --nproc_per_node 2` of the same script, with a
timeline per stage and the idle stack's RSS and CPU (bench/startup.py).

Sandbox: time to a trainer's first line and its training throughput under bubblewrap, next to
the same programs started bare by the same supervisor (bench/sandbox.py).

Limits: time to a trainer's first line and its throughput with a cgroup per instance vs none,
and a neighbour's throughput beside a 1-core job running 4 busy processes, limits on and off
(bench/limits.py).

Containers: submit -> first training line for the same two-instance DDP job with its trainers
in podman containers (the trainer image built here) and on the host's Python, side by side
(bench/container_startup.py).

Experiments: a 12-trial search of the digits example with successive halving, next to the same
12 configurations all run to the end: epochs, core-hours, wall time and the best eval accuracy
of each (bench/experiments.py).
"""

import sys
import tempfile
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

from bench.admission import RaceResult, race_in_subprocess
from bench.container_startup import container_startup
from bench.databases import fresh_postgres, fresh_sqlite, postgres_unreachable_reason
from bench.experiments import experiments
from bench.heartbeats import measure_in_subprocess as heartbeats_in_subprocess
from bench.heartbeats import summary as heartbeats_summary
from bench.limits import limits_cost
from bench.logs import log_path
from bench.ps import ps_vs_ddp
from bench.reconcile import measure_in_subprocess
from bench.reconcile import summary as reconcile_summary
from bench.recovery import recovery
from bench.sandbox import sandbox_cost
from bench.startup import startup
from stack.redis_server import private_server


def admission(redis_url: str, tmp: Path) -> bool:
    ok = True
    for label, fresh in _databases(tmp):
        with fresh() as url:
            alone = race_in_subprocess(url, redis_url, label, "user", 1, 50, 50)
        for scope in ("user", "group"):
            with fresh() as url:
                race = race_in_subprocess(url, redis_url, label, scope)
            print(race.summary())
            print(_ratios(alone, race))
            ok = ok and race.over_admitted == 0 and not race.errors
    return ok


def reconciliation(redis_url: str, tmp: Path) -> None:
    for label, fresh in _databases(tmp):
        with fresh() as url:
            print(reconcile_summary(label, measure_in_subprocess(url, redis_url)), flush=True)


def heartbeats(redis_url: str, tmp: Path) -> None:
    for label, fresh in _databases(tmp):
        with fresh() as url:
            print(heartbeats_summary(label, heartbeats_in_subprocess(url, redis_url)), flush=True)


def _databases(tmp: Path) -> list[tuple[str, Callable[[], AbstractContextManager[str]]]]:
    databases: list[tuple[str, Callable[[], AbstractContextManager[str]]]] = [
        ("sqlite", lambda: fresh_sqlite(tmp))
    ]
    reason = postgres_unreachable_reason()
    if reason is None:
        databases.append(("postgresql", fresh_postgres))
    else:
        print(f"on postgresql: SKIPPED ({reason})")
    return databases


def _ratios(alone: RaceResult, race: RaceResult) -> str:
    return (
        f"{'':<16} baseline 1 process alone: {alone.attempts / alone.seconds:.0f} decisions/s, "
        f"p99 {alone.p(0.99) * 1000:.1f} ms -> racing/alone: throughput "
        f"{(race.attempts / race.seconds) / (alone.attempts / alone.seconds):.2f}x, "
        f"p99 latency {race.p(0.99) / alone.p(0.99):.1f}x"
    )


def main() -> int:
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        with private_server(tmp / "redis") as (url, _):
            print("== admission: 8 processes x 20 submissions, quota admits 50 ==")
            ok = admission(url, tmp)
            print("== reconciliation: 200 nodes, 2,000 replicas ==")
            reconciliation(url, tmp)
            print("== heartbeats: one transaction each vs batched, 200/s ==")
            heartbeats(url, tmp)
    print("== parameter server vs DDP: 2 workers, same batch and seed ==")
    ok = ps_vs_ddp() and ok
    print("== recovery: kill -9 of one instance, restart and resume ==")
    ok = recovery() and ok
    print("== start and end: a DDP job on the console vs bare torchrun ==")
    ok = startup() and ok
    print("== logs: trainer -> agent -> Redis -> websocket ==")
    ok = log_path() and ok
    print("== sandbox: trainers under bubblewrap vs bare, same supervisor ==")
    ok = sandbox_cost() and ok
    print("== limits: a cgroup per instance vs none, same supervisor ==")
    ok = limits_cost() and ok
    print("== containers: a DDP job's first line in podman vs on the host's Python ==")
    ok = container_startup() and ok
    print("== experiments: a search stopped early vs every trial run to the end ==")
    ok = experiments() and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
