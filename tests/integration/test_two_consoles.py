"""Two web processes and two console workers on one PostgreSQL database, under concurrent
submissions through both web processes and the loss of some nodes (the simulated fleet,
bench/fleet.py): no replica placed twice, no node over-committed, no job lost (issue 24,
item 4). Skipped, saying why, where no PostgreSQL answers."""

import random
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.databases import fresh_postgres
from bench.fleet import FleetConfig, FleetThread, provision
from stack.redis_server import free_port
from tests.conftest import (
    FAST_FAULTS,
    TERMINAL,
    RunningStack,
    StackClient,
    pytorch_request,
    require_postgres,
    running_stack,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.postgres]

ROOT = Path(__file__).resolve().parents[2]
NODES, DOOMED = 16, 4  # DOOMED of them go silent halfway through
NODE_CPUS = 2
PER_SUBMITTER, SUBMITTERS = 30, 4


@pytest.fixture(scope="module")
def two_consoles(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningStack, str]]:
    """The stack on PostgreSQL, plus a second web process and a second console worker;
    yields the stack and the second web process's URL."""
    require_postgres()
    with fresh_postgres() as url:
        folder = tmp_path_factory.mktemp("two-consoles")
        # Fast faults, but a live node on a loaded machine must not be taken for lost.
        timings = {**FAST_FAULTS, "TRAINYARD_NODE_STALE_SECONDS": "6",
                   "TRAINYARD_NODE_LOST_SECONDS": "20"}  # fmt: skip
        with running_stack(folder, nodes=0, extra_env={"DATABASE_URL": url, **timings}) as s:
            env = s.stack.env()
            port = free_port()
            extra = [
                subprocess.Popen(
                    [sys.executable, "-m", "stack.web", "--host", "127.0.0.1", "--port", str(port)],
                    cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                ),
                subprocess.Popen(
                    [sys.executable, "-m", "celery", "-A", "console", "worker", "-Q", "console",
                     "-n", f"console2@{port}", "--pool", "threads", "--concurrency", "4",
                     "--without-mingle", "--without-gossip", "--loglevel", "WARNING"],
                    cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                ),
            ]  # fmt: skip
            try:
                yield s, f"http://127.0.0.1:{port}"
            finally:
                for proc in extra:  # ours, by PID
                    proc.terminate()
                for proc in extra:
                    try:
                        proc.wait(30)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait()


def test_two_webs_and_two_workers_place_each_replica_once_and_lose_no_job(
    two_consoles: tuple[RunningStack, str],
) -> None:
    stack, second_web = two_consoles
    names = [f"pg-{i:02}" for i in range(NODES)]
    urls = provision(stack.stack.manage, names)
    steady = {n: urls[n] for n in names[DOOMED:]}
    doomed = {n: urls[n] for n in names[:DOOMED]}
    quota = {"cpu": 10_000, "gpus": 0, "memory_gb": 100_000, "running_jobs": 10_000}
    clients: list[StackClient] = []
    for k in range(SUBMITTERS):
        first = stack.create_user(f"racer{k}", f"racer-pass-{k}", quota=quota)
        # Half the submitters go through the second web process.
        clients.append(first if k % 2 == 0 else StackClient(second_web, first.token))
    config = FleetConfig(cpus=NODE_CPUS, memory_gb=64, heartbeat_seconds=1.0, job_seconds=1.0)
    with FleetThread(steady, config) as fleet, FleetThread(doomed, config) as lost:
        wait_until(
            "every node ready",
            lambda: sum(
                1 for n in stack.admin.http.get("/api/v1/nodes").json()["nodes"]
                if n["status"] == "ready"
            ) >= NODES,
        )  # fmt: skip
        admitted: list[tuple[StackClient, int]] = []
        errors: list[str] = []
        halfway = threading.Event()

        def submit(client: StackClient, seed: int) -> None:
            rng = random.Random(seed)
            for k in range(PER_SUBMITTER):
                if k == PER_SUBMITTER // 2:
                    halfway.set()
                response = client.http.post(
                    "/api/v1/jobs",
                    json=pytorch_request(f"r{seed}-{k}", "digits-ddp", rng.choice((1, 2, 3))),
                )
                if response.status_code != 201:
                    errors.append(response.text)
                else:
                    admitted.append((client, response.json()["id"]))

        threads = [threading.Thread(target=submit, args=(c, k)) for k, c in enumerate(clients)]
        for t in threads:
            t.start()
        halfway.wait(120)
        lost.stop()  # DOOMED nodes go silent while jobs run on them
        for t in threads:
            t.join(300)
        assert not errors, errors[:3]
        jobs = {
            job_id: client.wait(job_id, lambda j: j["state"] in TERMINAL)
            for client, job_id in admitted
        }
        events = fleet.call(lambda: list(fleet.fleet.events)) + list(lost.fleet.events)

    assert len(jobs) == SUBMITTERS * PER_SUBMITTER  # no job lost: every one ended
    starts = Counter((e.job_id, e.attempt, e.role, e.index) for e in events if e.kind == "start")
    twice = {k: n for k, n in starts.items() if n > 1}
    assert not twice, twice  # no replica placed (or started) twice
    assert not [e for e in events if e.in_use_cpus > NODE_CPUS]  # no node over-committed
    by_state = Counter(j["state"] for j in jobs.values())
    failed = {i: j["reason"] for i, j in jobs.items() if j["state"] == "failed"}
    # Only the lost nodes fail jobs here: each failed job's reason names one.
    assert all(any(n in why for n in doomed) for why in failed.values()), failed
    assert set(by_state) <= {"succeeded", "failed"} and by_state["succeeded"] > 0, by_state
