"""An elastic digits job on a real stack (issue 47): two nodes of 4 cores, room for 2 of its
instances when it is submitted. It starts at 2, grows to 4 when the job beside it ends,
shrinks to 3 (not counted as a restart: its policy is never) when node-2's agent and trainer
are killed, grows to 4 again when node-2 is back, resuming from its checkpoint each time, and
ends about as accurate as a run of a fixed size. The lifecycle's decisions are tested one by
one in tests/unit/test_elastic.py."""

import os
import signal
from typing import Any

import pytest

from tests.conftest import (
    TERMINAL,
    RunningStack,
    StackClient,
    pytorch_request,
    signal_file,
    trainer_pids,
    wait_until,
)
from tests.integration.test_faults import hold_request
from tests.integration.test_restarts import EPOCH, final_accuracy

# Stops a hung test only, measuring nothing: four attempts and a fixed-size run to compare
# with, on a shared 2-core machine.
GUARD = 1200.0
pytestmark = [pytest.mark.integration, pytest.mark.timeout(GUARD)]

# Paced, so that it still trains when each change comes (each waits for an epoch of the
# attempt before); the seed is the example's default, as the fixed-size run's.
ARGS = ["--epochs", "20", "--min-epoch-seconds", "1.5"]


def elastic_request() -> dict[str, Any]:
    request = pytorch_request("elastic digits", "digits-ddp", 2, args=ARGS)
    request["roles"]["worker"]["instances"] = {"min": 1, "max": 3}
    return request


def size_of(client: StackClient, job_id: int) -> tuple[int, str, int | None]:
    """(attempt number, state, its placed size) of the job now."""
    job = client.job(job_id)
    current = job["attempts"][-1]
    return current["number"], job["state"], current["instances"]


def trains_in(client: StackClient, job_id: int, attempt: int) -> bool:
    """Whether the attempt (0-based) has printed an epoch line."""
    return any(EPOCH.match(x["text"]) and x["attempt"] == attempt for x in client.logs(job_id))


def running_at(client: StackClient, job_id: int, attempt: int, size: int) -> None:
    """Until the attempt runs with `size` instances and has trained an epoch."""

    def there() -> bool:
        number, state, instances = size_of(client, job_id)
        if number > attempt + 1 or state in TERMINAL:
            raise AssertionError(f"it went past attempt {attempt + 1}: {client.job(job_id)}")
        return number == attempt + 1 and state == "running" and instances == size

    wait_until(f"attempt {attempt + 1} running at {size}", there, guard=GUARD)
    wait_until(f"attempt {attempt + 1} trains", lambda: trains_in(client, job_id, attempt))


def test_an_elastic_job_starts_with_what_fits_grows_and_shrinks_on_a_lost_node(
    fault_stack: RunningStack,
) -> None:
    stack = fault_stack
    admin = stack.admin
    three = stack.add_package("elastic", cpu=3, memory_gb=2)
    # A job of two 3-core instances, one per node, leaves a core free on each.
    beside = signal_file("elastic-beside")
    filler = admin.submit(
        {**hold_request("beside the elastic job", 2, beside), "roles": {
            "master": {"package": three, "instances": 1},
            "worker": {"package": three, "instances": 1},
        }}
    )  # fmt: skip
    admin.wait(filler["id"], lambda j: j["state"] == "running")

    job_id = admin.submit(elastic_request())["id"]
    running_at(admin, job_id, 0, 2)
    assert {r["tag"]: r["node"] for r in admin.job(job_id)["replicas"]} == {
        "master": "node-1", "worker-1": "node-2",
    }  # fmt: skip

    beside.touch()  # the job beside ends: room frees on both nodes
    admin.wait_finished(filler["id"])
    running_at(admin, job_id, 1, 4)
    placed = {r["tag"]: r["node"] for r in admin.job(job_id)["replicas"]}
    # It kept its instances where they ran; the new ones went where room was.
    assert placed["master"] == "node-1" and placed["worker-1"] == "node-2", placed
    assert sorted(placed.values()).count("node-1") == 3, placed

    # A small job takes node-1's last core: after node-2 is lost, 3 instances fit, not 4.
    small_release = signal_file("elastic-small")
    small = admin.submit(hold_request("one core of node-1", 1, small_release))
    admin.wait(small["id"], lambda j: j["state"] == "running")

    on_node_2 = trainer_pids(job_id)["worker-1"]

    def until_it_trains_at_3() -> None:
        os.kill(on_node_2, signal.SIGKILL)  # the agent is dead already: its trainer too
        running_at(admin, job_id, 2, 3)

    stack.stack.restart("node-2", until_it_trains_at_3, how=signal.SIGKILL)
    # node-2 is back, and the small job ends: it grows to 4 again.
    small_release.touch()
    running_at(admin, job_id, 3, 4)

    final = admin.wait_finished(job_id)
    assert final["state"] == "succeeded", final["reason"]
    assert (final["restarts_used"], final["resizes"]) == (0, 3)
    attempts = final["attempts"]
    assert [a["instances"] for a in attempts] == [2, 4, 3, 4], attempts
    assert attempts[1]["resize"] == "grew to 4: room freed on node-1", attempts[1]
    assert attempts[2]["resize"].startswith("shrank to 3: node-2 lost: no heartbeat"), attempts
    assert attempts[3]["resize"].startswith("grew to 4: room freed on node-"), attempts
    assert not any(a["counted"] for a in attempts[:-1]), attempts
    lines = admin.logs(job_id)
    # Each attempt after the first resumed from the checkpoint the one before saved.
    resumed = [x["attempt"] for x in lines if x["text"].startswith("resumed from checkpoint")]
    assert sorted(set(resumed)) == [1, 2, 3], resumed

    fixed = admin.submit(pytorch_request("fixed size", "digits-ddp", 3, args=ARGS))
    fixed_final = admin.wait_finished(fixed["id"])
    assert fixed_final["state"] == "succeeded", fixed_final["reason"]
    elastic_accuracy = final_accuracy(lines)
    fixed_accuracy = final_accuracy(admin.logs(fixed["id"]))
    print(f"eval accuracy: elastic {elastic_accuracy:.4f}, fixed at 3 {fixed_accuracy:.4f}")
    assert abs(elastic_accuracy - fixed_accuracy) <= 0.02, (elastic_accuracy, fixed_accuracy)
    stack.retire_packages("elastic")
