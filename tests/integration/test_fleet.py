"""The simulated fleet (bench/fleet.py) against a real console of its own: 50 fake nodes, 200
submissions. Every admitted job is placed, run and ended exactly once, no node ever holds more
than it has, every admission decision matches the quota at the moment it was made (a job that
holds nearly all of the quota makes sure some are refused), and a cancelled job's replicas are
stopped by their (fake) agents."""

import random
import time
from collections import Counter
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest

from bench.fleet import SECONDS_ARG, FleetConfig, FleetThread, provision
from tests.conftest import TERMINAL, RunningStack, pytorch_request, running_stack, wait_until

pytestmark = pytest.mark.integration

NODES = 50
SUBMISSIONS = 200
NODE_CPUS = 2
# Below what the fleet holds (100 cores): the quota, not the fleet, says no.
QUOTA_CPU = 30
# A job that holds all of the quota but one core, from the middle of the submissions until it
# is cancelled: the submissions after it that ask for 2 or 3 cores must be refused, and the
# first that asks for 1 admitted, however fast or slow the host is. (How many of the first
# half are refused depends on how fast the console ends jobs: a slow host refused none.)
HOLDER_CPUS = QUOTA_CPU - 1
JOB_SECONDS = 2.0
FAIL_EVERY = 7  # jobs whose id is a multiple of this fail (exit 1)


@pytest.fixture(scope="module")
def fleet_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningStack]:
    """A console with no agents of its own: the fleet's nodes are all it has."""
    with running_stack(tmp_path_factory.mktemp("fleet"), nodes=0) as running:
        yield running


def _time(text: str | None) -> float:
    return datetime.fromisoformat(text).timestamp() if text else float("inf")


def _live_nodes(stack: RunningStack) -> int:
    nodes = stack.admin.http.get("/api/v1/nodes").json()["nodes"]
    return sum(1 for n in nodes if n["status"] == "ready")


def test_it_places_runs_and_ends_every_job_exactly_once(fleet_stack: RunningStack) -> None:
    urls = provision(fleet_stack.stack.manage, [f"sim-{i:03}" for i in range(NODES)])
    user = fleet_stack.create_user(
        "fleet-user", "fleet-pass-1",
        quota={"cpu": QUOTA_CPU, "gpus": 0, "memory_gb": 10_000, "running_jobs": 1000},
    )  # fmt: skip
    config = FleetConfig(cpus=NODE_CPUS, memory_gb=64, heartbeat_seconds=1.0,
                         job_seconds=JOB_SECONDS, fail_every=FAIL_EVERY,
                         log_lines_per_second=4)  # fmt: skip
    with FleetThread(urls, config) as fleet:
        wait_until("every simulated node ready", lambda: _live_nodes(fleet_stack) >= NODES)
        decisions: list[tuple[float, float, int, Any]] = []

        def decide(request: dict[str, Any], instances: int) -> Any:
            before = time.time()
            response = user.http.post("/api/v1/jobs", json=request)
            decisions.append((before, time.time(), instances, response))
            assert response.status_code in (201, 400), response.text
            return response

        rng = random.Random(24)
        sizes = [rng.choice((1, 1, 2, 3)) for _ in range(SUBMISSIONS)]  # cpu-1: one core each
        for k, instances in enumerate(sizes[: SUBMISSIONS // 2]):
            decide(pytorch_request(f"sim-{k}", "digits-ddp", instances), instances)
        first_half = [r.json()["id"] for *_, r in decisions if r.status_code == 201]
        for job_id in first_half:
            user.wait(job_id, lambda j: j["state"] in TERMINAL)
        # Nothing held now: the holder is admitted, and is then cancelled while running.
        holder_request = pytorch_request(
            "holder", "digits-ddp", HOLDER_CPUS, args=[SECONDS_ARG, "3600"]
        )
        holder = decide(holder_request, HOLDER_CPUS).json()
        user.wait(holder["id"], lambda j: j["state"] == "running")
        second_half = len(decisions)
        for k, instances in enumerate(sizes[SUBMISSIONS // 2 :], start=SUBMISSIONS // 2):
            decide(pytorch_request(f"sim-{k}", "digits-ddp", instances), instances)
        held_back = [(n, r.status_code) for _, _, n, r in decisions[second_half:]]
        assert {code for n, code in held_back if n > 1} == {400}, held_back
        assert 201 in {code for n, code in held_back if n == 1}, held_back
        admitted = [
            r.json()["id"]
            for *_, r in decisions
            if r.status_code == 201 and r.json()["id"] != holder["id"]
        ]
        jobs = {job_id: user.wait(job_id, lambda j: j["state"] in TERMINAL) for job_id in admitted}

        # A stop reaches the fake agent, which stops the replica and says so.
        assert user.http.post(f"/api/v1/jobs/{holder['id']}/cancel").status_code == 200
        # Cancelled at once; each replica is stopped once its agent says so.
        cancelled = user.wait(
            holder["id"],
            lambda j: (
                j["state"] in TERMINAL and all(r["state"] != "running" for r in j["replicas"])
            ),
        )
        events = fleet.call(lambda: list(fleet.fleet.events))
        beats = fleet.call(lambda: [(a.heartbeats, a.pushed) for a in fleet.fleet.agents])

    # The console worker drains heartbeats (jobs/services/heartbeat_drain.py): the fleet, as
    # agents do, pushed them onto its list rather than sending Celery tasks.
    sent, pushed = map(sum, zip(*beats, strict=True))
    assert pushed >= sent / 2, (sent, pushed)
    assert cancelled["state"] == "cancelled", cancelled
    assert {r["state"] for r in cancelled["replicas"]} == {"stopped"}, cancelled
    # Placed, run and ended exactly once, on the node the console says.
    for job_id, job in jobs.items():
        assert job["state"] == ("failed" if job_id % FAIL_EVERY == 0 else "succeeded"), job
        for replica in job["replicas"]:
            key = (job_id, 0, replica["role"], replica["index"])
            seen = [e for e in events if (e.job_id, e.attempt, e.role, e.index) == key]
            once = [{"start": 1, "exit": 1}]
            if job["state"] == "failed":
                # Or ended by the stop the console sends the others once one instance fails,
                # when it reaches the agent before the instance's own exit.
                once.append({"start": 1, "stop": 1})
            assert Counter(e.kind for e in seen) in once, (key, seen)
            assert {e.node for e in seen} == {replica["node"]}, (key, seen)
    assert {e.job_id for e in events} == {*admitted, holder["id"]}
    # No node over-committed at any moment: the fleet counts after every start and exit.
    over = [e for e in events if e.in_use_cpus > NODE_CPUS]
    assert not over, over[:5]
    # Every decision matches the quota. What the user held at any time follows from the jobs'
    # created and finished times. There is one submitter, so during a request only endings
    # change it: the decision saw at most what was held at `before`, at least what at `after`.
    spans = {i: (_time(j["created"]), _time(j["finished"]), j["totals"]["cpu"])
             for i, j in (*jobs.items(), (holder["id"], cancelled))}  # fmt: skip

    def held(at: float, but: int = 0) -> int:
        return sum(cpu for i, (start, end, cpu) in spans.items() if i != but and start < at < end)

    for before, after, need, response in decisions:
        if response.status_code == 201:
            assert held(after, but=response.json()["id"]) + need <= QUOTA_CPU, response.json()
        else:
            assert "Over quota on CPU" in response.text, response.text
            assert held(before) + need > QUOTA_CPU, (need, response.text)
