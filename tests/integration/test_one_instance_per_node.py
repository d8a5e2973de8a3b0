"""Multi-node behaviour with small packages (issue 49, item 11), on the stack's two agents: a
job that asks for one instance per node gets two nodes where best fit would pack its two small
instances on one, and Lightning's bug-report model, its Trainer at its defaults (num_nodes=1),
trains on them as one DDP group, because its instances get PL_TRAINER_NUM_NODES and
PL_TRAINER_DEVICES."""

from typing import Any

import pytest

from tests.conftest import RunningStack, StackClient, pytorch_request

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def user(stack: RunningStack) -> StackClient:
    return stack.create_user(
        "one-per-node", "one-per-node-password",
        quota={"cpu": 4, "gpus": 0, "memory_gb": 16, "running_jobs": 1},
    )  # fmt: skip


def test_lightnings_bug_report_model_trains_as_one_group_on_two_nodes(
    user: StackClient,
) -> None:
    request: dict[str, Any] = pytorch_request("boring", "lightning_bug_report.py", 2)
    request["one_instance_per_node"] = True
    job = user.wait_finished(user.submit(request)["id"])
    assert job["state"] == "succeeded", job["reason"]
    assert job["one_instance_per_node"] is True
    nodes = {r["node"] for r in job["replicas"]}
    assert len(nodes) == 2, job["replicas"]
    texts = [x["text"] for x in user.logs(job["id"])]
    reports = sorted(t.split(" weights=") for t in texts if t.startswith("boring "))
    assert [head for head, _ in reports] == [
        "boring global_rank=0 world_size=2",
        "boring global_rank=1 world_size=2",
    ], texts[-40:]
    # One group: DDP ends both ranks with the same weights (alone, each had its own).
    assert reports[0][1] == reports[1][1]
    assert sum("Initializing distributed: GLOBAL_RANK:" in t for t in texts) == 2
