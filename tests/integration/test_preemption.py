"""Priority classes and preemption on the real stack (issue 25): a cluster full of one user's
`low` jobs, another user's `high` job evicts exactly one of them (the one that started last),
which goes back to the queue and resumes from its checkpoint once there is room again, ending
as the never-preempted runs do; a `normal` job waits without preempting anything, and does not
take the room freed for the `high` one.
"""

import time
from typing import Any

import pytest

from tests.conftest import TERMINAL, RunningStack, StackClient, pytorch_request, wait_until
from tests.integration.test_restarts import EPOCH, final_accuracy

# Stops a hung test only, measuring nothing: the victim runs twice, the second time after
# other jobs end, and on a shared 2-core machine that can take longer than the suite's default
# guard (600 s).
GUARD = 1500.0
pytestmark = [pytest.mark.integration, pytest.mark.timeout(GUARD)]

# Long enough that every low job still runs when the high one arrives (it comes once each has
# trained an epoch); the seed is the examples' default, so the four runs train alike and the
# one preempted can be compared with the others.
LOW_ARGS = ["--epochs", "6"]
QUOTA = {"cpu": 8, "gpus": 0, "memory_gb": 32, "running_jobs": 4}


def low_request(n: int) -> dict[str, Any]:
    return {
        **pytorch_request(f"low {n}", "digits-ddp", 1, package="cpu-2", args=LOW_ARGS),
        "priority": "low",
    }


def finished(client: StackClient, job_id: int) -> dict[str, Any]:
    return client.wait(
        job_id, lambda j: j["state"] in TERMINAL and j["log_complete"], hang_guard=GUARD
    )


def started_an_epoch(client: StackClient, job_id: int) -> bool:
    return any(EPOCH.match(x["text"]) for x in client.logs(job_id))


def test_a_high_job_preempts_the_low_job_that_started_last_which_resumes_and_finishes(
    stack: RunningStack,
) -> None:
    alice = stack.create_user("preempt-alice", "pw-preempt-alice", QUOTA)
    bob = stack.create_user("preempt-bob", "pw-preempt-bob", QUOTA)
    carol = stack.create_user("preempt-carol", "pw-preempt-carol", QUOTA)
    lows = [alice.submit(low_request(n))["id"] for n in range(4)]
    # The cluster (2 nodes of 4 cores) is full of alice's low jobs, each of them training.
    for job_id in lows:
        alice.wait(job_id, lambda j: j["state"] == "running")
    for job_id in lows:
        wait_until(f"job {job_id} trains", lambda: started_an_epoch(alice, job_id))  # noqa: B023
    starts = {j: alice.job(j)["attempts"][0]["started"] for j in lows}
    last_started = max(lows, key=lambda j: (starts[j], j))

    # A normal job may not preempt: it waits, and every low job goes on.
    normal = carol.submit(
        {
            **pytorch_request("normal", "digits-ddp", 1, package="cpu-2", args=["--epochs", "1"]),
            "priority": "normal",
        }
    )
    carol.wait(normal["id"], lambda j: j["reason"].startswith("waiting"))
    assert all(alice.job(j)["state"] == "running" for j in lows)

    submitted = time.monotonic()
    high = bob.submit(
        {
            **pytorch_request("high", "digits-ddp", 1, package="cpu-2", args=["--epochs", "3"]),
            "priority": "high",
        }
    )
    assert high["priority"] == "high" and high["priority_value"] > 0
    bob.wait(high["id"], lambda j: j["state"] == "running")
    to_running = time.monotonic() - submitted
    print(f"\nhigh job {high['id']}: submitted to running in {to_running:.1f} s")

    # Exactly one job was preempted: the one that started last.
    preempted = [j for j in lows if alice.job(j)["preempted_by"]]
    assert preempted == [last_started], {j: alice.job(j)["state"] for j in lows}
    victim = alice.job(last_started)
    assert victim["preempted_by"] == [high["id"]]
    # The room freed for the high job was not given to the normal one waiting ahead of the low.
    assert carol.job(normal["id"])["state"] == "queued"

    resumed = finished(alice, last_started)
    assert resumed["state"] == "succeeded", resumed["reason"]
    first, _second = resumed["attempts"]
    assert first["reason"] == f"preempted by job {high['id']} (high) of preempt-bob"
    assert not first["counted"] and resumed["restarts_used"] == 0
    lines = alice.logs(last_started)
    assert any("SIGTERM" in x["text"] for x in lines if x["attempt"] == 0)
    assert any("resumed from" in x["text"] for x in lines if x["attempt"] == 1)
    others = [finished(alice, j) for j in lows if j != last_started]
    assert all(o["state"] == "succeeded" and not o["preempted_by"] for o in others)
    never_preempted = final_accuracy(alice.logs(others[0]["id"]))
    assert abs(final_accuracy(lines) - never_preempted) <= 0.02
    assert finished(bob, high["id"])["state"] == "succeeded"
    assert finished(carol, normal["id"])["state"] == "succeeded"
    # The normal job preempted nothing: only the high one did.
    assert all(alice.job(j)["preempted_by"] in ([], [high["id"]]) for j in lows)
