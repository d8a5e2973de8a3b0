"""One working folder per job (workers/workfolder.py), on the real stack: a multi-node script
that saves `snapshot.pt` relative to where it starts (tests/fixtures/code/multinode/, written
the way pytorch/examples' ddp-tutorial-series/multinode.py is) is killed mid-run, and after
the restart every instance, on whichever node it lands, resumes from the same epoch."""

import re
import signal
from typing import Any

import psutil
import pytest

from tests.conftest import FIXTURE_CODE_ROOT, RunningStack, StackClient, wait_until
from tests.integration.test_restarts import restart_policy, trainer_pid

pytestmark = pytest.mark.integration

MULTINODE = FIXTURE_CODE_ROOT / "multinode"
STALLED = re.compile(r"^rank=(\d+) stalls after epoch (\d+)$")
RESUMED = re.compile(r"^rank=(\d+) resumed from snapshot\.pt at epoch (\d+)$")
EPOCH = re.compile(r"^rank=(\d+) epoch=(\d+) ")
# More cores than half a test node's 4: two instances can only run on two nodes.
WHOLE_NODE_PACKAGE = "cpu-3-one-per-node"
QUOTA = {"cpu": 8, "gpus": 0, "memory_gb": 16, "running_jobs": 2}
EPOCHS, STALL_AFTER = 6, 2


def whole_node_package(stack: RunningStack) -> str:
    stack.stack.manage(
        "shell",
        "-c",
        "from decimal import Decimal; from jobs.models import Package\n"
        f"Package.objects.get_or_create(name={WHOLE_NODE_PACKAGE!r}, "
        "defaults={'cpu': 3, 'memory_gb': 2, 'price_per_hour': Decimal('0.15')})",
    )
    return WHOLE_NODE_PACKAGE


def kill_a_worker_mid_run(
    user: StackClient, stack: RunningStack, package: str, **restart: Any
) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, str]]:
    """Submit the multinode script on two instances, let both stall after epoch STALL_AFTER
    (first attempt only), kill -9 worker-1's trainer; the job as it ended, and its log."""
    sha = user.upload(MULTINODE, "multinode")
    job = user.submit(
        {
            "name": "multinode relative snapshot",
            "image": "pytorch:2.13-cpu",
            "program": {
                "snapshot": sha,
                "script": "multinode.py",
                "args": [str(EPOCHS), "1", "--stall-after", str(STALL_AFTER)],
            },
            "roles": {
                "master": {"package": package, "instances": 1},
                "worker": {"package": package, "instances": 1},
            },
            "restart": restart_policy(2, **restart),
        }
    )
    wait_until(
        "both ranks to stall mid-run",
        lambda: (
            {
                m.group(1)
                for x in user.logs(job["id"])
                if x["attempt"] == 0 and (m := STALLED.match(x["text"]))
            }
            == {"0", "1"}
        ),
    )
    first_nodes = {r["role"]: r["node"] for r in user.job(job["id"])["replicas"]}
    pid = wait_until("worker-1's pid", lambda: trainer_pid(stack, job["id"], "worker", 1, 0))
    psutil.Process(pid).send_signal(signal.SIGKILL)
    finished = user.wait_finished(job["id"])
    return finished, user.logs(job["id"]), first_nodes


def resumed_epochs(lines: list[dict[str, Any]], attempt: int) -> dict[str, int]:
    """The epoch each rank resumed at in an attempt, by rank."""
    return {
        m.group(1): int(m.group(2))
        for x in lines
        if x["attempt"] == attempt and (m := RESUMED.match(x["text"]))
    }


def assert_both_resumed_and_finished(finished: dict[str, Any], lines: list[dict[str, Any]]) -> None:
    assert finished["state"] == "succeeded", finished["reason"]
    # Each attempt in full (the dicts' repr is cut short in a failure's message).
    attempts = [(a["number"], a["nodes"], a["reason"]) for a in finished["attempts"]]
    assert finished["restarts_used"] == 1, attempts
    assert "SIGKILL" in finished["attempts"][0]["reason"], attempts
    # Rank 0 saved after epoch STALL_AFTER; every rank, wherever it runs now, starts after it.
    assert resumed_epochs(lines, 1) == {"0": STALL_AFTER + 1, "1": STALL_AFTER + 1}, [
        x["text"] for x in lines if x["attempt"] == 1
    ]
    for rank in ("0", "1"):
        redone = [
            int(m.group(2))
            for x in lines
            if x["attempt"] == 1 and (m := EPOCH.match(x["text"])) and m.group(1) == rank
        ]
        assert redone == list(range(STALL_AFTER + 1, EPOCHS)), (rank, redone)


def test_a_relative_snapshot_resumes_every_instance_on_two_nodes(stack: RunningStack) -> None:
    user = stack.create_user("wf-multinode", "wf-pw", quota=QUOTA)
    finished, lines, first_nodes = kill_a_worker_mid_run(user, stack, whole_node_package(stack))
    assert len(set(first_nodes.values())) == 2, first_nodes
    assert len(set(finished["attempts"][1]["nodes"])) == 2, finished["attempts"]
    assert_both_resumed_and_finished(finished, lines)


def test_a_job_moved_off_its_failed_node_resumes_there(stack: RunningStack) -> None:
    """With exclude_failed_node the next attempt runs where none of the first ran on the
    failed node; it still finds the snapshot (before, it started again from epoch 0)."""
    user = stack.create_user("wf-exclude", "wf-pw", quota=QUOTA)
    finished, lines, first_nodes = kill_a_worker_mid_run(
        user, stack, "cpu-2", exclude_failed_node=True
    )
    assert first_nodes["worker"] not in finished["attempts"][1]["nodes"], (
        first_nodes,
        [(a["number"], a["nodes"], a["reason"]) for a in finished["attempts"]],
    )
    assert_both_resumed_and_finished(finished, lines)
