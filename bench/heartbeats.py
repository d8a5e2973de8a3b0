"""What the console worker spends on one heartbeat, from its task function to its node row:
N nodes' heartbeats through jobs.tasks.node_heartbeat on 4 threads (as the console worker's
pool runs them), arriving at 200 a second (1,000 nodes every 5 s), written one transaction each
(TRAINYARD_HEARTBEAT_BATCH_SECONDS=0) beside batched (the default window), on the same
database in the same process. CPU is the process's (every thread's) CPU time; Celery's own cost
of receiving a message is not in it (bench/scale.py's ingest group measures the whole console
worker).

    python -m bench.heartbeats --database-url URL --redis-url URL [--nodes N] [--json]
"""

import argparse
import json
import os
import queue
import sys
import threading
import time
from typing import Any

from bench.databases import measured_in_fresh_process

NODES = 200
ROUNDS = 3  # each node sends this many heartbeats per mode
THREADS = 4  # the console worker's --concurrency
RATE = 200.0  # heartbeats a second: 1,000 nodes every 5 s


def _django(database_url: str, redis_url: str) -> None:
    os.environ["DJANGO_SETTINGS_MODULE"] = "console.settings"
    os.environ["DATABASE_URL"] = database_url
    os.environ["REDIS_URL"] = redis_url
    import django

    django.setup()


def _keys(nodes: int) -> dict[str, str]:
    from jobs.models import AgentCredential
    from workers import credentials

    keys = {}
    for i in range(nodes):
        secret = credentials.new_secret()
        keys[f"hb-{i:04}"] = credentials.signing_key(secret)
    AgentCredential.objects.bulk_create(
        AgentCredential(node_name=name, password_sha256="0" * 64, signing_key=key)
        for name, key in keys.items()
    )
    return keys


def _payload(name: str, key: str) -> dict[str, Any]:
    from workers import contract, credentials

    running = [{"job_id": k, "attempt": 0, "role": "worker", "index": k, "state": "running"}
               for k in range(4)]  # fmt: skip
    payload = {
        "node": name, "address": "10.0.0.9", "cpus": 8, "memory_gb": 32, "gpus": 0,
        "incarnation": "bench", "finished": [], "sent": time.time(), "running": running,
        "isolation": "sandbox", contract.PROTOCOL_FIELD: contract.PROTOCOL_VERSION,
    }  # fmt: skip
    return credentials.sign(payload, key, contract.TASK_NODE_HEARTBEAT)


def _run(keys: dict[str, str], window: float) -> dict[str, float]:
    """ROUNDS heartbeats of every node through the task function on THREADS threads."""
    from django.conf import settings
    from django.db import connection

    from jobs import tasks
    from jobs.models import Node
    from jobs.services import heartbeat_limits

    settings.TRAINYARD_HEARTBEAT_BATCH_SECONDS = window
    settings.TRAINYARD_HEARTBEAT_MIN_SPACING_SECONDS = 0
    heartbeat_limits.forget()
    beats = [_payload(name, key) for _ in range(ROUNDS) for name, key in keys.items()]
    work: queue.Queue[dict[str, Any] | None] = queue.Queue()

    def drain() -> None:
        try:
            while (beat := work.get()) is not None:
                tasks.node_heartbeat(beat)
        finally:
            connection.close()

    threads = [threading.Thread(target=drain) for _ in range(THREADS)]
    cpu, started = time.process_time(), time.perf_counter()
    for thread in threads:
        thread.start()
    for k, beat in enumerate(beats):
        due = started + k / RATE
        time.sleep(max(0.0, due - time.perf_counter()))
        work.put(beat)
    for _ in threads:
        work.put(None)
    for thread in threads:
        thread.join()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - started
    last_round = beats[-len(keys)]["sent"]
    written = Node.objects.filter(name__in=list(keys), heartbeat_sent__gte=last_round).count()
    assert written == len(keys), f"{written} of {len(keys)} nodes written"
    return {"cpu_ms": cpu / len(beats) * 1000, "core_share": cpu / wall,
            "behind_s": wall - len(beats) / RATE}  # fmt: skip


def measure(nodes: int = NODES) -> dict[str, Any]:
    from django.core.management import call_command

    call_command("migrate", "--noinput", verbosity=0)
    keys = _keys(nodes)
    _run(keys, 0)  # every node exists before either is measured
    # Each mode twice, alternating, and the cheaper of its two runs: the machine's load (a
    # shared one) weighs on both alike.
    runs: dict[str, list[dict[str, float]]] = {"one_each": [], "batched": []}
    for _ in range(2):
        runs["one_each"].append(_run(keys, 0))
        runs["batched"].append(_run(keys, 0.1))
    return {"nodes": nodes, **{mode: min(r, key=lambda m: m["cpu_ms"]) for mode, r in runs.items()},
            "runs": runs}  # fmt: skip


def summary(label: str, m: dict[str, Any]) -> str:
    one, batched = m["one_each"], m["batched"]
    return (
        f"{label:<10} heartbeats of {m['nodes']} nodes x {ROUNDS} through the task on "
        f"{THREADS} threads, {RATE:.0f}/s: one transaction each {one['cpu_ms']:.2f} ms CPU per "
        f"heartbeat ({one['core_share'] * 100:.0f} % of a core, done {one['behind_s']:.1f} s "
        f"after the last arrived); batched {batched['cpu_ms']:.2f} ms "
        f"({batched['core_share'] * 100:.0f} %, {batched['behind_s']:.1f} s) -> CPU "
        f"x{batched['cpu_ms'] / one['cpu_ms']:.2f}"
    )


def measure_in_subprocess(database_url: str, redis_url: str, nodes: int = NODES) -> dict[str, Any]:
    """In a fresh process: Django binds one database per process."""
    return measured_in_fresh_process(
        "bench.heartbeats", "--database-url", database_url, "--redis-url", redis_url,
        "--nodes", str(nodes),
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--database-url", required=True, help="a fresh, empty database")
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--nodes", type=int, default=NODES)
    args = parser.parse_args(argv)
    _django(args.database_url, args.redis_url)
    result = measure(args.nodes)
    print(json.dumps(result) if args.json else summary("database", result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
