"""`make bench-scale`: Trainyard at a thousand nodes and ten thousand jobs (issue 24).

Every figure is printed beside the same figure at 10 nodes (or its small baseline) measured in
the same run, with the target and whether it is met. Nothing asserts: a miss is a figure.

- heartbeat ingest: the simulated fleet (bench/fleet.py) against a real console (web, console
  worker, log keeper, Redis), heartbeats every 5 s: the console worker's CPU as a share of one
  core (it also runs the reconciliation loop, as in production), and the lag from a heartbeat's
  sending to its node row;
- one scheduling pass with 10,000 waiting jobs on 1,000 full nodes (a mixed queue: priority
  classes, two groups with shares and borrowing, gangs, time limits);
- admission p50/p99 with 8 and 64 concurrent submitters, and admissions/s sustained
  (bench/admission.py);
- time from a node freeing to the next job placed on it, on a full one-core fleet of 10 and
  of 1,000 nodes (the fleet stamps the exit report's sending and the start's arrival);
- line latency p50/p99 of 10 and of 500 websocket viewers of one job while 10,000 lines/s
  are appended to its log (with how many Redis readers of that job the web process had);
- job list page and list API p99 with 100,000 finished jobs in history;
- one reconciliation pass at 1,000 nodes / 10,000 replicas (bench/reconcile.py);
on SQLite and on PostgreSQL when reachable. Each group prints the seconds it took.

    python -m bench.scale [--quick]       (--quick: smaller sizes, for a look)
    python -m bench.scale --groups live,list --only postgresql   (some groups, one database)
    python -m bench.scale PART --database-url URL --json   (one part, in a process of its own:
                                                           Django binds one database per process)
"""

import argparse
import asyncio
import json
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import redis

from bench.databases import measured_in_fresh_process

ROOT = Path(__file__).resolve().parent.parent
HEARTBEAT_SECONDS = 5.0
INGEST_WINDOW_SECONDS = 15.0  # three heartbeat intervals
# How long the ingest figure waits for every node to be heard from once before its window
# opens anyway (a console that lags behind its fleet never hears from all of them in time).
WARM_SECONDS = 30.0
# Settings of the console's that the ingest figure takes from the bench's own environment.
PASSED_ON = ("TRAINYARD_DB_CONN_MAX_AGE", "TRAINYARD_HEARTBEAT_BATCH_SECONDS")


def _django(database_url: str, redis_url: str = "") -> None:
    os.environ["DJANGO_SETTINGS_MODULE"] = "console.settings"
    os.environ["DATABASE_URL"] = database_url
    if redis_url:
        os.environ["REDIS_URL"] = redis_url
    import django

    django.setup()


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


# --- heartbeat ingest, with the fleet against a real console ---


def _waiting(client: redis.Redis) -> int:
    """Messages waiting for the console worker: on its Celery queue, and heartbeats on the list
    it drains (jobs/services/heartbeat_drain.py)."""
    from workers import contract

    pipe = client.pipeline(transaction=False)
    pipe.llen(contract.CONSOLE_QUEUE)
    pipe.llen(contract.HEARTBEATS_KEY)
    return sum(int(n) for n in pipe.execute())


def ingest(
    database_url: str, sizes: list[int], freeing: Sequence[int] = (), viewers: Sequence[int] = ()
) -> dict[str, Any]:
    """Heartbeat ingest at each fleet size; then, on the same console and the same provisioned
    nodes (one start, one provisioning for both groups), the `live` figures."""
    import psutil

    from bench.fleet import FleetConfig, FleetThread, provision
    from stack.redis_server import free_port
    from stack.run import Stack

    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as folder:
        stack = Stack(
            var_dir=Path(folder) / "var",
            port=free_port(),
            nodes=0,
            extra_env={"DATABASE_URL": database_url,
                       "TRAINYARD_HEARTBEAT_SECONDS": str(HEARTBEAT_SECONDS),
                       # To measure the console worker without kept connections: set it to 0.
                       # Before batching: TRAINYARD_HEARTBEAT_BATCH_SECONDS=0.
                       **{k: v for k, v in os.environ.items() if k in PASSED_ON}},
            announce=lambda line: None,
        )  # fmt: skip
        stack.prepare()
        stack.start()
        try:
            _django(database_url, stack.redis_url)
            from jobs.models import Node

            names = [f"sim-{i:04}" for i in range(max([*sizes, *freeing], default=0))]
            started = time.perf_counter()
            urls = provision(stack.manage, names)
            results["provision_seconds"] = time.perf_counter() - started
            worker = psutil.Process(stack.pid("console-worker"))
            import redis

            queue = redis.Redis.from_url(stack.redis_url)
            if freeing or viewers:
                # First: a failure of the ingest figures (a fleet of 2,000 on a loaded
                # machine) must not cost these.
                results.update(_live_on(stack, urls, freeing, viewers))
                from jobs.services import nodes

                nodes.return_to_service(names)
            for size in sizes:
                subset = {name: urls[name] for name in names[:size]}
                config = FleetConfig(heartbeat_seconds=HEARTBEAT_SECONDS)
                with FleetThread(subset, config) as fleet:
                    # Warm: every node has been heard from once.
                    since = time.time()
                    deadline = time.monotonic() + WARM_SECONDS
                    while time.monotonic() < deadline:
                        heard = Node.objects.filter(
                            name__in=list(subset), heartbeat_sent__gte=since
                        ).count()
                        if heard >= size:
                            break
                        time.sleep(0.5)
                    cpu_before = sum(worker.cpu_times()[:2])
                    window_started = time.perf_counter()
                    sent_before = fleet.call(lambda: sum(a.heartbeats for a in fleet.fleet.agents))
                    pushed_before = fleet.call(lambda: sum(a.pushed for a in fleet.fleet.agents))
                    queued_before = _waiting(queue)
                    lags: dict[tuple[str, float], float] = {}
                    backlog = 0  # the most messages waiting on the console's queue
                    while time.perf_counter() - window_started < INGEST_WINDOW_SECONDS:
                        backlog = max(backlog, _waiting(queue))
                        for name, sent, written in Node.objects.filter(
                            name__in=list(subset)
                        ).values_list("name", "heartbeat_sent", "last_heartbeat"):
                            if written is not None and sent:
                                lags[(name, sent)] = written.timestamp() - sent
                        time.sleep(0.5)
                    wall = time.perf_counter() - window_started
                    cpu = sum(worker.cpu_times()[:2]) - cpu_before
                    sent = fleet.call(lambda: sum(a.heartbeats for a in fleet.fleet.agents))
                    pushed = fleet.call(lambda: sum(a.pushed for a in fleet.fleet.agents))
                    # Taken off the console's queue and heartbeat list in the window: what the
                    # worker's CPU paid for (a console that falls behind takes fewer than were
                    # sent).
                    taken = (sent - sent_before) - (_waiting(queue) - queued_before)
                    silent_since = time.time() - 3 * HEARTBEAT_SECONDS
                    stale = Node.objects.filter(
                        name__in=list(subset), heartbeat_sent__lt=silent_since
                    ).count()
                results[str(size)] = {
                    "core_share": cpu / wall,
                    "lag_p50": _quantile(list(lags.values()), 0.5),
                    "lag_p99": _quantile(list(lags.values()), 0.99),
                    "heartbeats_seen": len(lags),
                    "stale_nodes": stale,
                    # Whether the fleet itself kept up: heartbeats it sent a second, of N / 5.
                    "sent_per_second": (sent - sent_before) / wall,
                    "wanted_per_second": size / HEARTBEAT_SECONDS,
                    # Of those, onto the console's heartbeat list (the rest: Celery tasks).
                    "pushed_per_second": (pushed - pushed_before) / wall,
                    "console_queue_max": backlog,
                    "cpu_per_heartbeat": cpu / max(taken, 1),
                    "taken_per_second": taken / wall,
                }
                # The nodes of this size go silent; let the console settle before the next.
                time.sleep(2)
        finally:
            stack.stop()
    return results


# --- the live console: a node freeing, and 500 viewers of one job ---

FILLER_SECONDS = 3600  # jobs that hold the cluster full for the whole measurement
CHURN_NODES = 5  # nodes whose jobs end and are replaced while the figure is taken
CHURN_ROUNDS = 4  # replacements per churn node: CHURN_NODES * CHURN_ROUNDS measurements
CHURN_SECONDS = 2.0  # how long each churn job "runs"
SETTLE_SECONDS = 180.0  # a bound on waiting for the console (nodes ready, jobs placed)


def _wait(what: str, condition: Callable[[], bool], seconds: float = SETTLE_SECONDS) -> None:
    """Until `condition()`; a bench bound (not a test's wall-clock limit): past it, the figure
    is not measured and the line says why."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"waited {seconds:.0f} s for {what}")
        time.sleep(0.2)


def _live_on(
    stack: Any, urls: dict[str, str], sizes: Sequence[int], viewer_counts: Sequence[int]
) -> dict[str, Any]:
    """On a started console with provisioned nodes: the time from a node freeing to the next
    job placed on it at each fleet size, then websocket viewers of one job."""
    from jobs.services import nodes

    results: dict[str, Any] = {}
    token = _bench_user(stack)
    for size in sizes:
        subset = dict(list(urls.items())[:size])
        # Nodes of an earlier fleet that went silent look ready until they are stale: work
        # sent to them would wait for their loss. Only this fleet's nodes take work.
        nodes.drain([name for name in urls if name not in subset])
        nodes.return_to_service(list(subset))
        results[f"freeing_{size}"] = _or_why(node_freeing, stack, token, subset)
    for count in viewer_counts:
        results[f"viewers_{count}"] = _or_why(_watched, stack, token, count)
    return results


def _watched(stack: Any, token: str, count: int) -> dict[str, Any]:
    return asyncio.run(watched_by(stack, token, count))


def _or_why(measure: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
    """The figure, or why it was not measured: one that fails does not take the others (in
    the same part process) with it."""
    try:
        return measure(*args)
    except Exception as exc:
        log_lines = str(exc).strip().splitlines() or [repr(exc)]
        return {"error": log_lines[-1]}


def _bench_user(stack: Any) -> str:
    """A user with room for a whole fleet, and its API token."""
    from django.contrib.auth.models import User

    from jobs.models import Quota

    user = User.objects.create_user("bench-scale")
    Quota.objects.create(user=user, cpu=10**6, gpus=0, memory_gb=10**8, running_jobs=10**5)
    return str(stack.manage("token", "bench-scale").strip())


def node_freeing(stack: Any, token: str, urls: dict[str, str]) -> dict[str, Any]:
    """Fill every node of a one-core fleet with long jobs but CHURN_NODES, which run short
    jobs with more of them waiting: each time one ends, the next is placed on the node it
    freed. The figure: from the exit report's sending to the next start message arriving at
    that node (the fleet stamps both)."""
    import httpx

    from bench.fleet import SECONDS_ARG, FleetConfig, FleetThread
    from jobs.models import Node, Replica

    size = len(urls)
    churn = min(CHURN_NODES, size)
    config = FleetConfig(cpus=1, memory_gb=64, heartbeat_seconds=HEARTBEAT_SECONDS,
                         job_seconds=FILLER_SECONDS)  # fmt: skip
    http = httpx.Client(base_url=stack.url, headers={"Authorization": f"Token {token}"},
                        timeout=120)  # fmt: skip

    def submit(name: str, instances: int, seconds: float) -> int:
        roles: dict[str, Any] = {"master": {"package": "cpu-1", "instances": 1}}
        if instances > 1:
            roles["worker"] = {"package": "cpu-1", "instances": instances - 1}
        request = {
            "name": name,
            "image": "pytorch:2.13-cpu",
            "roles": roles,
            "program": {"script": "digits-ddp", "args": [SECONDS_ARG, str(seconds)]},
        }
        response = http.post("/api/v1/jobs", json=request)
        if response.status_code != 201:
            raise RuntimeError(f"a submission was refused: {response.text[:300]}")
        return int(response.json()["id"])

    def states(ids: list[int]) -> list[str]:
        from jobs.models import Job

        return list(Job.objects.filter(pk__in=ids).values_list("state", flat=True))

    with FleetThread(urls, config) as fleet:
        _wait(f"{size} simulated nodes ready", lambda: sum(
            n.status == Node.State.READY for n in Node.objects.filter(name__in=list(urls))
        ) >= size)  # fmt: skip
        fillers: list[int] = []
        left = size - churn
        while left > 0:
            fillers.append(submit(f"filler-{len(fillers)}", min(64, left), FILLER_SECONDS))
            left -= min(64, left)
        _wait("the fillers running", lambda: states(fillers).count("running") == len(fillers))
        churning = [submit(f"churn-{k}", 1, CHURN_SECONDS)
                    for k in range(churn * (CHURN_ROUNDS + 1))]  # fmt: skip
        ended = ("succeeded", "failed", "cancelled")
        _wait("the churn jobs ended", lambda: all(s in ended for s in states(churning)),
              SETTLE_SECONDS + churn * CHURN_ROUNDS * CHURN_SECONDS)  # fmt: skip
        events = fleet.call(lambda: list(fleet.fleet.events))
        for job_id in fillers:
            http.post(f"/api/v1/jobs/{job_id}/cancel")
        # Stopped by this fleet's agents, so that no later figure pays for their loss.
        _wait("the fillers stopped", lambda: not Replica.objects.filter(
            job_id__in=fillers, state__in=Replica.HOLDING_STATES).exists())  # fmt: skip
    http.close()
    of_churn = set(churning)
    freed: dict[str, float] = {}  # node -> when its last churn job's exit report was sent
    waits = []
    for event in sorted(events, key=lambda e: e.at):
        if event.job_id not in of_churn:
            continue
        if event.kind == "exit":
            freed[event.node] = event.at
        elif event.kind == "start" and event.node in freed:
            waits.append(event.at - freed.pop(event.node))
    return {"nodes": size, "measured": len(waits), "p50": _quantile(waits, 0.5),
            "p99": _quantile(waits, 0.99)}  # fmt: skip


VIEWER_LINES_PER_SECOND = 10_000
VIEWER_BATCH_LINES = 1000  # a batch as a node agent ships it holds up to 1,000 lines
VIEWER_SECONDS = 10.0
_TS = re.compile(rb'"ts": ([0-9.]+)')
_NEXT = re.compile(rb'"next": (\d+)\}$')


async def watched_by(stack: Any, token: str, count: int) -> dict[str, Any]:
    """`count` websocket viewers of one running job (asyncio `websockets` clients, each its
    own connection, authenticated with a token as the CLI is) while VIEWER_LINES_PER_SECOND
    lines are appended to its log as agents append them. A line's latency: from its batch's
    appending (the batch's own timestamp) to its arrival at a viewer."""
    import psutil
    import websockets

    from workers import contract
    from workers.logsink import LogBatch, LogSink

    job_id = await asyncio.to_thread(_running_job)
    url = stack.url.replace("http", "ws") + f"/ws/jobs/{job_id}/?tail=0"
    headers = {"Authorization": f"Token {token}"}
    latencies: list[float] = []
    reached = [0] * count
    connected = 0
    all_connected = asyncio.Event()
    opening = asyncio.Semaphore(20)

    async def viewer(k: int) -> None:
        nonlocal connected
        async with opening:
            ws = await websockets.connect(url, additional_headers=headers, max_size=None,
                                          compression=None, ping_interval=None,
                                          open_timeout=SETTLE_SECONDS)  # fmt: skip
            await ws.recv()  # the state frame
        connected += 1
        if connected == count:
            all_connected.set()
        async with ws:
            while True:
                data = await ws.recv(decode=False)
                now = time.time()
                if data.startswith(b'{"type": "log"'):
                    latencies.extend(now - float(ts) for ts in _TS.findall(data))
                    found = _NEXT.search(data)
                    if found:
                        reached[k] = int(found.group(1))

    tasks = [asyncio.create_task(viewer(k)) for k in range(count)]
    await asyncio.wait_for(all_connected.wait(), SETTLE_SECONDS)
    sink = LogSink(redis.Redis.from_url(stack.redis_url))
    web = psutil.Process(stack.pid("web"))
    followers = 0
    name = f"log-follower-job-{job_id}"
    control = redis.Redis.from_url(stack.redis_url, decode_responses=True)
    interval = VIEWER_BATCH_LINES / VIEWER_LINES_PER_SECOND
    batches = int(VIEWER_SECONDS / interval)
    cpu_before = sum(web.cpu_times()[:2])
    started = time.perf_counter()
    last = 0
    for k in range(batches):
        await asyncio.sleep(max(0.0, started + k * interval - time.perf_counter()))
        lines = [f"step {k * VIEWER_BATCH_LINES + i:09d} loss=0.{i % 997:03d} lr=1e-3"
                 for i in range(VIEWER_BATCH_LINES)]  # fmt: skip
        batch = LogBatch(job_id, "master", 0, "sim-0000", contract.STREAM_STDOUT, time.time(),
                         lines, "bench-viewers", k + 1)  # fmt: skip
        last = (await asyncio.to_thread(sink.append, [batch]))[0]
        if k % 10 == 0:
            clients = await asyncio.to_thread(control.client_list)
            followers = max(followers, sum(c["name"] == name for c in clients))
    written_seconds = time.perf_counter() - started
    deadline = time.monotonic() + SETTLE_SECONDS
    while min(reached) < last and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    web_cpu = sum(web.cpu_times()[:2]) - cpu_before
    behind = sum(1 for r in reached if r < last)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    control.close()
    return {"viewers": count, "lines": batches * VIEWER_BATCH_LINES,
            "lines_per_second": batches * VIEWER_BATCH_LINES / written_seconds,
            "p50": _quantile(latencies, 0.5), "p99": _quantile(latencies, 0.99),
            "behind": behind, "redis_followers": followers,
            "web_core_share": web_cpu / (time.perf_counter() - started)}  # fmt: skip


def _running_job() -> int:
    from django.contrib.auth.models import User

    from jobs.models import FrameworkImage, Job

    job = Job.objects.create(
        owner=User.objects.get(username="bench-scale"), name="watched",
        image=FrameworkImage.objects.get(name="pytorch:2.13-cpu"),
        program={"example": "digits-ddp"}, state=Job.State.RUNNING, cpu_total=1, gpus_total=0,
        memory_gb_total=2, price_per_hour=0,
    )  # fmt: skip
    return int(job.pk)


# --- one scheduling pass with many waiting jobs ---


def schedule_pass(nodes: int, waiting: int) -> dict[str, Any]:
    """`nodes` one-core nodes, each full with a running job, and `waiting` queued jobs: every
    pass looks at every waiting job and places none. The queue is mixed as a shared cluster's
    is (issue 25): 40 users in two groups with nominal shares and borrowing limits (the fair
    share order and the ledger), the three priority classes (a tenth `high`, which looks for
    victims every pass and finds none: the running jobs are `normal`, which may not be
    preempted), gangs of one and two instances, and time limits on the running jobs and on
    most waiting ones (the head's reserved start, and backfill judged against it)."""
    import random
    from datetime import timedelta

    from django.contrib.auth.models import Group, User
    from django.core.management import call_command
    from django.utils import timezone

    from jobs.models import (
        FrameworkImage,
        Job,
        JobAttempt,
        Node,
        Package,
        PriorityClass,
        Quota,
        Replica,
    )
    from jobs.services.scheduler import scheduling

    call_command("migrate", "--noinput", verbosity=0)
    call_command("load_catalog", verbosity=0)
    rng = random.Random(24)  # noqa: S311 (a reproducible mix, not a secret)
    users = [User.objects.create_user(f"bench-{i:02}") for i in range(40)]
    for g, name in enumerate(("team-a", "team-b")):
        group = Group.objects.create(name=name)
        group.user_set.add(*users[g::2])
        Quota.objects.create(
            group=group, cpu=max(1, nodes // 2), gpus=0, memory_gb=10**6, running_jobs=10**5,
            borrow_cpu=max(1, nodes // 2),
        )  # fmt: skip
    classes = {c.name: c for c in PriorityClass.objects.all()}
    image = FrameworkImage.objects.get(name="pytorch:2.13-cpu")
    package = Package.objects.get(name="cpu-1")
    now = timezone.now()
    rows = Node.objects.bulk_create(
        Node(name=f"n{i:04}", address="127.0.0.1", cpu=1, memory_gb=64, last_heartbeat=now,
             isolation="bubblewrap")
        for i in range(nodes)
    )  # fmt: skip

    def job(i: int, state: str, pclass: str, limit: int | None) -> Job:
        return Job(owner=users[i % len(users)], name=f"j{i}", image=image,
                   program={"example": "digits-ddp"}, state=state, cpu_total=1, gpus_total=0,
                   memory_gb_total=2, price_per_hour=0, priority_class=classes[pclass],
                   priority=classes[pclass].value, time_limit=limit)  # fmt: skip

    running = Job.objects.bulk_create(
        (job(i, Job.State.RUNNING, "normal", rng.choice((3600, 7200, 14400)))
         for i in range(nodes)),
        batch_size=2000,
    )  # fmt: skip
    JobAttempt.objects.bulk_create(
        (JobAttempt(job=j, number=0, placed=now - timedelta(seconds=rng.randrange(3600)),
                    started=now) for j in running),
        batch_size=2000,
    )  # fmt: skip
    Replica.objects.bulk_create(
        (Replica(job=j, role="master", index=0, package=package, node=rows[k],
                 state=Replica.State.RUNNING, started=now, start_sent=now, starts_sent=1)
         for k, j in enumerate(running)),
        batch_size=2000,
    )  # fmt: skip
    kinds = [rng.choices(("high", "normal", "low"), (1, 6, 3))[0] for _ in range(waiting)]
    queued = Job.objects.bulk_create(
        (job(i, Job.State.QUEUED, kinds[i], rng.choice((None, 1800, 3600, 7200)))
         for i in range(waiting)),
        batch_size=2000,
    )  # fmt: skip
    gangs = [1 + (rng.random() < 0.3) for _ in queued]
    Replica.objects.bulk_create(
        (Replica(job=j, role="master" if k == 0 else "worker", index=0 if k == 0 else k - 1,
                 package=package)
         for j, size in zip(queued, gangs, strict=True) for k in range(size)),
        batch_size=2000,
    )  # fmt: skip
    JobAttempt.objects.bulk_create((JobAttempt(job=j, number=0) for j in queued), batch_size=2000)
    from console import gcpolicy

    gcpolicy.settle()  # as the console worker does once it is ready
    _statistics_gathered()
    passes = []
    cpu = []  # the pass's own CPU time: on a loaded machine the wall time is mostly waiting
    for _ in range(4):
        # Heard from lately, as live agents' heartbeats keep them: a slow first pass must not
        # make the next one find every node lost.
        Node.objects.update(last_heartbeat=timezone.now())
        started, cpu_started = time.perf_counter(), time.process_time()
        placed = scheduling.schedule()
        passes.append(time.perf_counter() - started)
        cpu.append(time.process_time() - cpu_started)
        assert not placed, placed
    assert not Job.objects.filter(state=Job.State.RESTARTING).exists()  # nothing preempted
    return {"nodes": nodes, "waiting": waiting, "first": passes[0],
            "steady": statistics.median(passes[1:]),
            "steady_cpu": statistics.median(cpu[1:])}  # fmt: skip


# --- list pages with a long history ---


def _statistics_gathered() -> None:
    """The planner's statistics, as a console that has run a while has them for rows just
    made in bulk: SQLite's from the console worker's statistics pass (hourly, and at its
    start: jobs.services.planner_stats), PostgreSQL's from its autovacuum (which would get to
    a table this size within a minute or so)."""
    from django.db import connection

    from jobs.services import planner_stats

    if not planner_stats.refresh():
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")


def list_pages(history: int, requests: int = 100) -> dict[str, Any]:
    """`history` finished jobs of one user (two replicas each); the list page and the list
    API as that user, `requests` times each, after a first request of each timed apart: a web
    process pays its one-time costs then (templates compiled, URL patterns and the API's
    schema built: 0.5 s for the page), and with 30 requests the p99 was that first one."""
    from django.contrib.auth.models import User
    from django.core.management import call_command
    from django.test import Client
    from django.utils import timezone

    from jobs.models import FrameworkImage, Job, Node, Package, Replica

    call_command("migrate", "--noinput", verbosity=0)
    call_command("load_catalog", verbosity=0)
    owner = User.objects.create_user("bench")
    image = FrameworkImage.objects.get(name="pytorch:2.13-cpu")
    package = Package.objects.get(name="cpu-1")
    node = Node.objects.create(name="n0", address="127.0.0.1", cpu=8, memory_gb=64)
    now = timezone.now()
    for start in range(0, history, 10_000):
        made = Job.objects.bulk_create(
            Job(owner=owner, name=f"j{i}", image=image, program={"example": "digits-ddp"},
                state=Job.State.SUCCEEDED, cpu_total=2, gpus_total=0, memory_gb_total=4,
                price_per_hour=0, started=now, finished=now)
            for i in range(start, min(history, start + 10_000))
        )  # fmt: skip
        Replica.objects.bulk_create(
            Replica(job=job, role=role, index=index, package=package, node=node,
                    state=Replica.State.SUCCEEDED, started=now, finished=now, exit_code=0)
            for job in made
            for role, index in (("master", 0), ("worker", 1))
        )  # fmt: skip
    _statistics_gathered()
    # As a web process does once started (console/lifespan.py).
    from console import gcpolicy

    gcpolicy.settle()
    client = Client(HTTP_HOST="127.0.0.1")
    client.force_login(owner)
    timings: dict[str, list[float]] = {"page": [], "api": []}
    first: dict[str, float] = {}
    for n in range(requests + 1):
        for kind, path in (("page", "/"), ("api", "/api/v1/jobs")):
            started = time.perf_counter()
            response = client.get(path)
            took = time.perf_counter() - started
            if n:
                timings[kind].append(took)
            else:
                first[kind] = took
            assert response.status_code == 200, (path, response.status_code)
    return {
        "history": history,
        **{f"{kind}_first": t for kind, t in first.items()},
        **{f"{kind}_p50": _quantile(t, 0.5) for kind, t in timings.items()},
        **{f"{kind}_p99": _quantile(t, 0.99) for kind, t in timings.items()},
    }


# --- running the parts, each in a process of its own ---


def _part(part: str, database_url: str, redis_url: str, *args: str) -> dict[str, Any]:
    return measured_in_fresh_process(
        "bench.scale", part, "--database-url", database_url, "--redis-url", redis_url, *args
    )


def _line(figure: str, small: str, large: str, target: str, met: bool | None) -> str:
    verdict = "n/a" if met is None else ("MET" if met else "MISSED")
    return f"  {figure:<46} {small:>16} {large:>22}   target {target:<22} {verdict}"


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


GROUPS = ("ingest", "live", "schedule", "admission", "list", "reconcile")


def report(
    label: str,
    fresh: Callable[[], Any],
    redis_url: str,
    quick: bool,
    only: tuple[str, ...] = GROUPS,
) -> None:
    """Every group of figures, each on its own: one that fails says why and the rest go on."""
    print(f"== {label} ==", flush=True)
    console = _ConsoleRun(fresh, redis_url, quick, only)
    for name in only:
        started = time.perf_counter()
        try:
            if name in CONSOLE_GROUPS:
                CONSOLE_GROUPS[name](console.results(), quick)
            else:
                GROUP_LINES[name](label, fresh, redis_url, quick)
        except Exception as exc:
            reason = [line for line in str(exc).strip().splitlines() if line.strip()]
            # The first line says which part; the last, what stopped it.
            said = (
                f"{reason[0]} ... {reason[-1]}" if len(reason) > 1 else (reason or [repr(exc)])[0]
            )
            print(f"  {name}: NOT MEASURED ({said})")
        # Where the bench's own time goes (issue 24 asks for under 15 minutes in all).
        print(f"  ({name}: {time.perf_counter() - started:.0f} s)", flush=True)


def _sizes(quick: bool) -> tuple[int, int, int, list[int]]:
    if quick:
        return 200, 2000, 10_000, [10, 200]
    return 1000, 10_000, 100_000, [10, 1000, 2000]


def _viewer_counts(quick: bool) -> list[int]:
    return [10, 100 if quick else 500]


class _ConsoleRun:
    """The one console of the ingest and live groups (a part process of its own, one stack
    start and one provisioning of the fleet for both), run when the first of them asks."""

    def __init__(
        self, fresh: Callable[[], Any], redis_url: str, quick: bool, groups: tuple[str, ...]
    ) -> None:
        self.fresh, self.redis_url, self.quick, self.groups = fresh, redis_url, quick, groups
        self._result: dict[str, Any] | None = None
        self._error: Exception | None = None

    def results(self) -> dict[str, Any]:
        if self._error is not None:
            raise self._error
        if self._result is None:
            sizes = _sizes(self.quick)[3]
            live = "live" in self.groups
            args = [
                "--sizes", ",".join(map(str, sizes)) if "ingest" in self.groups else "",
                "--freeing", ",".join(map(str, sizes[:2])) if live else "",
                "--viewers", ",".join(map(str, _viewer_counts(self.quick))) if live else "",
            ]  # fmt: skip
            try:
                with self.fresh() as url:
                    self._result = _part("ingest", url, self.redis_url, *args)
            except Exception as exc:
                self._error = exc
                raise
        return self._result


def _ingest_lines(ingest_result: dict[str, Any], quick: bool) -> None:
    sizes = _sizes(quick)[3]
    base = ingest_result["10"]
    for size in sizes[1:]:
        at = ingest_result[str(size)]
        share_target = 0.10 if size <= 1000 else None
        print(_line(
            f"heartbeat ingest, {size} nodes / 5 s: core share",
            f"{base['core_share'] * 100:.1f} % (10)", f"{at['core_share'] * 100:.1f} %",
            "<= 10 % at 1,000" if share_target else "(figure only)",
            at["core_share"] <= share_target if share_target else None,
        ), flush=True)  # fmt: skip
        print(_line(
            f"heartbeat -> node row lag p50/p99, {size} nodes",
            f"{_ms(base['lag_p50'])}/{_ms(base['lag_p99'])}",
            f"{_ms(at['lag_p50'])}/{_ms(at['lag_p99'])} ({at['stale_nodes']} stale)",
            "(figure only)", None,
        ), flush=True)  # fmt: skip
        if "sent_per_second" in at:
            print(
                f"  {'':<46} fleet sent {at['sent_per_second']:.0f} of "
                f"{at['wanted_per_second']:.0f} heartbeats/s"
                f" ({at.get('pushed_per_second', 0):.0f}/s onto the heartbeat list); console"
                f" queue and list at most {at['console_queue_max']} messages",
                flush=True,
            )
        if "cpu_per_heartbeat" in at:
            print(
                f"  {'':<46} console worker CPU per heartbeat taken off its queue or list "
                f"{at['cpu_per_heartbeat'] * 1000:.2f} ms ({base['cpu_per_heartbeat'] * 1000:.2f} "
                f"ms at 10), {at['taken_per_second']:.0f} taken/s",
                flush=True,
            )


def _schedule_lines(label: str, fresh: Callable[[], Any], redis_url: str, quick: bool) -> None:
    big_nodes, big_waiting, _, _ = _sizes(quick)
    with fresh() as url:
        small = _part("schedule", url, redis_url, "--nodes", "10", "--waiting", "10")
    with fresh() as url:
        big = _part("schedule", url, redis_url, "--nodes", str(big_nodes),
                    "--waiting", str(big_waiting))  # fmt: skip
    print(_line(
        f"scheduling pass, {big_waiting} waiting (mixed) / {big_nodes} full nodes",
        f"{_ms(small['steady'])} (10/10)",
        f"{_ms(big['steady'])} (first {_ms(big['first'])})", "<= 100 ms",
        big["steady"] <= 0.100,
    ), flush=True)  # fmt: skip
    print(f"  {'':<46} its CPU time: {_ms(small['steady_cpu'])} (10/10), "
          f"{_ms(big['steady_cpu'])} at scale (load average {os.getloadavg()[0]:.1f})",
          flush=True)  # fmt: skip


def _admission_lines(label: str, fresh: Callable[[], Any], redis_url: str, quick: bool) -> None:
    from bench.admission import race_in_subprocess

    with fresh() as url:
        alone = race_in_subprocess(url, redis_url, label, "user", 1, 40, 10_000)
    for processes, per, target_applies in ((8, 20, label == "sqlite"), (64, 5, label != "sqlite")):
        with fresh() as url:
            race = race_in_subprocess(url, redis_url, label, "user", processes, per, 10_000)
        print(_line(
            f"admission p50/p99, {processes} submitters",
            f"{_ms(alone.p(0.5))}/{_ms(alone.p(0.99))} (1)",
            f"{_ms(race.p(0.5))}/{_ms(race.p(0.99))}",
            "p99 <= 200 ms" if target_applies else "(figure only)",
            race.p(0.99) <= 0.200 if target_applies else None,
        ), flush=True)  # fmt: skip
        rate = race.admitted / race.seconds
        print(_line(
            f"admissions/s sustained, {processes} submitters",
            f"{alone.admitted / alone.seconds:.0f}/s (1)", f"{rate:.0f}/s",
            ">= 50/s on PostgreSQL" if label != "sqlite" else "(figure only)",
            rate >= 50 if label != "sqlite" else None,
        ), flush=True)  # fmt: skip


def _list_lines(label: str, fresh: Callable[[], Any], redis_url: str, quick: bool) -> None:
    _, _, big_history, _ = _sizes(quick)
    with fresh() as url:
        small = _part("lists", url, redis_url, "--history", "1000")
    with fresh() as url:
        big = _part("lists", url, redis_url, "--history", str(big_history))
    for kind, name in (("page", "job list page"), ("api", "job list API")):
        print(_line(
            f"{name} p99, {big_history} finished jobs",
            f"{_ms(small[kind + '_p99'])} (1,000)", _ms(big[kind + "_p99"]), "<= 200 ms",
            big[kind + "_p99"] <= 0.200,
        ), flush=True)  # fmt: skip
        print(f"  {'':<46} p50 {_ms(small[kind + '_p50'])} (1,000), {_ms(big[kind + '_p50'])}; "
              f"a new process's first request {_ms(big[kind + '_first'])}", flush=True)  # fmt: skip


def _reconcile_lines(label: str, fresh: Callable[[], Any], redis_url: str, quick: bool) -> None:
    from bench.reconcile import measure_in_subprocess

    big_nodes, _, _, _ = _sizes(quick)
    with fresh() as url:
        small = measure_in_subprocess(url, redis_url, nodes=10, replicas=100)
    with fresh() as url:
        big = measure_in_subprocess(url, redis_url, nodes=big_nodes, replicas=big_nodes * 10)
    print(_line(
        f"reconciliation pass, {big_nodes} nodes / {big_nodes * 10} replicas",
        f"{_ms(small['pass_seconds'])} (10/100)", _ms(big["pass_seconds"]), "<= 1 s",
        big["pass_seconds"] <= 1.0,
    ), flush=True)  # fmt: skip


def _live_lines(result: dict[str, Any], quick: bool) -> None:
    sizes = _sizes(quick)[3][:2]  # 10 and 1,000 nodes (200 with --quick)
    counts = _viewer_counts(quick)
    base = result[f"freeing_{sizes[0]}"]
    for size in sizes[1:]:
        at = result[f"freeing_{size}"]
        if "error" in base or "error" in at:
            print(f"  node freed -> next job placed: NOT MEASURED "
                  f"({base.get('error') or at.get('error')})", flush=True)  # fmt: skip
            continue
        print(_line(
            f"node freed -> next job placed p50/p99, {size} nodes",
            f"{_ms(base['p50'])}/{_ms(base['p99'])} ({sizes[0]})",
            f"{_ms(at['p50'])}/{_ms(at['p99'])} (n={at['measured']})", "(figure only)", None,
        ), flush=True)  # fmt: skip
    small, big = result[f"viewers_{counts[0]}"], result[f"viewers_{counts[1]}"]
    if "error" in small or "error" in big:
        print(f"  line latency, {counts[1]} viewers: NOT MEASURED "
              f"({small.get('error') or big.get('error')})", flush=True)  # fmt: skip
        return
    print(_line(
        f"line latency p50/p99, {counts[1]} viewers of one job",
        f"{_ms(small['p50'])}/{_ms(small['p99'])} ({counts[0]})",
        f"{_ms(big['p50'])}/{_ms(big['p99'])}", "p99 <= 250 ms", big["p99"] <= 0.250,
    ), flush=True)  # fmt: skip
    print(
        f"  {'':<46} {big['lines_per_second']:.0f} lines/s written; Redis readers of the job "
        f"{big['redis_followers']}; web process {big['web_core_share'] * 100:.0f} % of a core; "
        f"{big['behind']} viewers short of the last line",
        flush=True,
    )


# Groups measured on the one console both share (_ConsoleRun), and the others.
CONSOLE_GROUPS = {"ingest": _ingest_lines, "live": _live_lines}
GROUP_LINES = {
    "schedule": _schedule_lines,
    "admission": _admission_lines,
    "list": _list_lines,
    "reconcile": _reconcile_lines,
}


def _numbers(text: str) -> list[int]:
    return [int(n) for n in text.split(",") if n]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("part", nargs="?", choices=("ingest", "schedule", "lists"))
    parser.add_argument("--database-url")
    parser.add_argument("--redis-url", default="")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--sizes", default="10,1000,2000")
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--waiting", type=int, default=10_000)
    parser.add_argument("--history", type=int, default=100_000)
    parser.add_argument("--freeing", default="", help="ingest: fleet sizes for node freeing")
    parser.add_argument("--viewers", default="", help="ingest: counts of websocket viewers")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", choices=("sqlite", "postgresql"))
    parser.add_argument("--groups", default=",".join(GROUPS), help="of: " + ", ".join(GROUPS))
    args = parser.parse_args(argv)
    if args.part is not None:
        if args.part == "ingest":
            result = ingest(
                args.database_url, _numbers(args.sizes), _numbers(args.freeing),
                _numbers(args.viewers),
            )  # fmt: skip
        else:
            _django(args.database_url, args.redis_url)
            if args.part == "schedule":
                result = schedule_pass(args.nodes, args.waiting)
            else:
                result = list_pages(args.history)
        print(json.dumps(result), flush=True)
        return 0

    from bench.databases import (
        fresh_postgres,
        fresh_sqlite,
        migrated_postgres,
        migrated_sqlite,
        postgres_unreachable_reason,
    )
    from stack.redis_server import private_server

    groups = tuple(args.groups.split(","))
    unknown = set(groups) - set(GROUPS) - set(CONSOLE_GROUPS)
    if unknown:
        parser.error(f"no such group: {', '.join(sorted(unknown))} (of: {', '.join(GROUPS)})")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        with private_server(tmp / "redis") as (redis_url, _):
            print(_line("figure", "small", "at scale", "", None).replace("n/a", ""), flush=True)
            if args.only in (None, "sqlite"):
                # Every group's databases start as copies of one migrated database.
                template = migrated_sqlite(tmp, redis_url)
                report("sqlite", lambda: fresh_sqlite(tmp, template), redis_url, args.quick,
                       groups)  # fmt: skip
            if args.only in (None, "postgresql"):
                reason = postgres_unreachable_reason()
                if reason is None:
                    with migrated_postgres(redis_url) as name:
                        report("postgresql", lambda: fresh_postgres(name), redis_url,
                               args.quick, groups)  # fmt: skip
                else:
                    print(f"== postgresql: SKIPPED ({reason}) ==")
    print(f"bench-scale took {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
