"""What one reconciliation pass costs at size: 200 nodes and 2,000 running replicas, every node
heartbeating what it runs, beside the cost of one `schedule()` call on the same database.

    python -m bench.reconcile --database-url URL --redis-url URL [--json]

A pass that finds everything in order is the common case (it runs every few seconds); a pass
that finds one node lost and fails the jobs on it is measured too.
"""

import argparse
import json
import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from bench.databases import measured_in_fresh_process

ROOT = Path(__file__).resolve().parent.parent
NODES = 200
REPLICAS = 2000
ROUNDS = 5


def _django(database_url: str, redis_url: str) -> None:
    os.environ["DJANGO_SETTINGS_MODULE"] = "console.settings"
    os.environ["DATABASE_URL"] = database_url
    os.environ["REDIS_URL"] = redis_url
    import django

    django.setup()


def _fill(nodes: int, replicas: int) -> None:
    """`replicas` running replicas of 2-instance jobs, spread over `nodes` live nodes."""
    from django.contrib.auth.models import User
    from django.utils import timezone

    from jobs.models import FrameworkImage, Job, Node, Package, Replica

    owner = User.objects.create_user("bench")
    image = FrameworkImage.objects.get(name="pytorch:2.13-cpu")
    package = Package.objects.get(name="cpu-1")
    now = timezone.now()
    rows = Node.objects.bulk_create(
        Node(name=f"n{i:04}", address="127.0.0.1", cpu=64, memory_gb=256, last_heartbeat=now)
        for i in range(nodes)
    )
    jobs = Job.objects.bulk_create(
        Job(owner=owner, name=f"j{i}", image=image, program={"example": "digits-ddp"},
            state=Job.State.RUNNING, cpu_total=2, gpus_total=0, memory_gb_total=4,
            price_per_hour=0, started=now)
        for i in range(replicas // 2)
    )  # fmt: skip
    placed = Replica.objects.bulk_create(
        Replica(job=job, role=role, index=index, package=package,
                node=rows[(2 * k + index) % nodes], state=Replica.State.RUNNING,
                started=now, start_sent=now, starts_sent=1, incarnation="bench")
        for k, job in enumerate(jobs)
        for role, index in (("master", 0), ("worker", 1))
    )  # fmt: skip
    running: dict[int, list[dict[str, Any]]] = {}
    for r in placed:
        assert r.node is not None
        running.setdefault(r.node.pk, []).append(
            {"job_id": r.job_id, "role": r.role, "index": r.index, "state": "running"}
        )
    for node in rows:
        node.running = running.get(node.pk, [])
        node.incarnation = "bench"
    Node.objects.bulk_update(rows, ["running", "incarnation"])


def _one_job_that_cannot_fit() -> None:
    """So that schedule() does its whole work (lock, holdings, placement, the reason why)
    every time, instead of finding nothing waiting and returning at once."""
    from django.contrib.auth.models import User

    from jobs.models import FrameworkImage, Job, Package, Replica

    huge = Package.objects.create(name="bench-huge", cpu=1000, memory_gb=1)
    job = Job.objects.create(
        owner=User.objects.get(username="bench"), name="waits",
        image=FrameworkImage.objects.get(name="pytorch:2.13-cpu"),
        program={"example": "digits-ddp"}, state=Job.State.QUEUED, cpu_total=1000,
        gpus_total=0, memory_gb_total=1, price_per_hour=0,
    )  # fmt: skip
    Replica.objects.create(job=job, role="master", index=0, package=huge)


def measure(nodes: int = NODES, replicas: int = REPLICAS) -> dict[str, Any]:
    from django.core.management import call_command
    from django.utils import timezone

    from jobs.models import Node
    from jobs.services import reconcile
    from jobs.services.scheduler import scheduling

    call_command("migrate", "--noinput", verbosity=0)
    call_command("load_catalog", verbosity=0)
    _fill(nodes, replicas)
    listening = timezone.now() - timedelta(hours=1)
    steady = []
    for _ in range(ROUNDS):
        report = reconcile.run_pass(listening_since=listening)
        assert report.repaired == 0 and report.replicas == replicas, report.summary()
        steady.append(report.seconds)
    _one_job_that_cannot_fit()
    schedules = []
    for _ in range(ROUNDS):
        started = time.perf_counter()
        scheduling.schedule()
        schedules.append(time.perf_counter() - started)
    # One node goes silent: the pass that finds it fails the jobs that ran there.
    Node.objects.filter(name="n0000").update(last_heartbeat=timezone.now() - timedelta(hours=1))
    lost = reconcile.run_pass(listening_since=listening)
    assert lost.lost_nodes == ["n0000"], lost.summary()
    return {
        "nodes": nodes,
        "replicas": replicas,
        "pass_seconds": statistics.median(steady),
        "schedule_seconds": statistics.median(schedules),
        "lost_pass_seconds": lost.seconds,
        "lost_ended": lost.ended,
    }


def summary(label: str, m: dict[str, Any]) -> str:
    ratio = m["pass_seconds"] / m["schedule_seconds"]
    return (
        f"{label:<10} one pass over {m['nodes']} nodes and {m['replicas']} replicas: "
        f"{m['pass_seconds'] * 1000:.0f} ms (median of {ROUNDS}); one schedule() call with a "
        f"job waiting: "
        f"{m['schedule_seconds'] * 1000:.0f} ms -> pass/schedule {ratio:.1f}x; "
        f"a pass that finds a node lost and ends its {m['lost_ended']} replicas: "
        f"{m['lost_pass_seconds'] * 1000:.0f} ms"
    )


def measure_in_subprocess(
    database_url: str, redis_url: str, nodes: int = NODES, replicas: int = REPLICAS
) -> dict[str, Any]:
    """In a fresh process: Django binds one database per process."""
    return measured_in_fresh_process(
        "bench.reconcile",
        "--database-url", database_url, "--redis-url", redis_url,
        "--nodes", str(nodes), "--replicas", str(replicas),
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--database-url", required=True, help="a fresh, empty database")
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--nodes", type=int, default=NODES)
    parser.add_argument("--replicas", type=int, default=REPLICAS)
    args = parser.parse_args(argv)
    _django(args.database_url, args.redis_url)
    result = measure(args.nodes, args.replicas)
    print(json.dumps(result) if args.json else summary("database", result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
