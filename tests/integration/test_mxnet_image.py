"""The parameter server's own framework, as submitted: real Apache MXNet 1.9.1 with 2 servers and 2
workers under Trainyard's agents, through an image that names the interpreter its trainers run
with (the environment `make mxnet-env` builds: MXNet cannot live beside the agent's NumPy 2)."""

import re
from typing import Any

import pytest

from stack.runtimes import RECIPES, ensure
from tests.conftest import RunningStack, StackClient

pytestmark = pytest.mark.integration

IMAGE = "mxnet:1.9.1"


def register_image(stack: RunningStack, name: str, python: str) -> None:
    stack.stack.manage(
        "shell", "-c",
        "from jobs.models import FrameworkImage; FrameworkImage.objects.update_or_create("
        f"name={name!r}, defaults={{'framework': 'kvstore', 'python': {python!r}, "
        "'description': 'Apache MXNet 1.9.1 (its own parameter server, ps-lite)'})",
    )  # fmt: skip


@pytest.fixture(scope="module")
def mxnet_user(stack: RunningStack) -> StackClient:
    # Built once per machine and recipe (about 50 MB from the package registry the first time).
    register_image(stack, IMAGE, str(ensure(RECIPES["mxnet"])))
    return stack.create_user(
        "mxnetter", "mxnetter-password",
        quota={"cpu": 8, "gpus": 0, "memory_gb": 32, "running_jobs": 2},
    )  # fmt: skip


def mxnet_request(name: str, mode: str, image: str = IMAGE) -> dict[str, Any]:
    return {
        "name": name,
        "image": image,
        "program": {"script": "mxnet_linear.py", "args": ["--steps", "40"]},
        "roles": {
            "server": {"package": "cpu-1", "instances": 2},
            "worker": {"package": "cpu-1", "instances": 2},
        },
        "kvstore": mode,
    }


@pytest.mark.parametrize("mode", ["dist_sync", "dist_async"])
def test_real_mxnet_trains_with_two_servers_and_two_workers(
    mxnet_user: StackClient, mode: str
) -> None:
    job = mxnet_user.wait_finished(mxnet_user.submit(mxnet_request(f"mxnet {mode}", mode))["id"])
    assert job["state"] == "succeeded", job["reason"]
    assert sorted(r["tag"] for r in job["replicas"]) == [
        "scheduler", "server-0", "server-1", "worker-0", "worker-1",
    ]  # fmt: skip
    lines = [x for x in mxnet_user.logs(job["id"]) if x["role"] == "worker"]
    # MXNet itself says how many workers and servers it met, and in which mode. It numbers
    # the workers in the order they reach its scheduler, not by Trainyard's index.
    ranks = {}
    for line in lines:
        if match := re.fullmatch(
            rf"mxnet 1\.9\.1 worker (\d)/2 kvstore={mode} servers=2", line["text"]
        ):
            ranks[line["index"]] = int(match.group(1))
    assert sorted(ranks) == [0, 1] and sorted(ranks.values()) == [0, 1], lines
    # Both workers learn y = 2x + 1 from weights of 0. In dist_sync every worker ends on the
    # same weights. In dist_async nothing bounds how many of the other worker's pushes a
    # worker's last pull misses: on a loaded machine it ended 0.001 and 0.015 short. What
    # async shows is that each worker learned, so within 5 % of the line there.
    tolerance = 0.0005 if mode == "dist_sync" else 0.1
    for index, rank in ranks.items():
        done = [x["text"] for x in lines if x["index"] == index and " done " in x["text"]]
        assert len(done) == 1, done
        match = re.fullmatch(rf"worker {rank} done weight=([-\d.]+) bias=([-\d.]+)", done[0])
        assert match, done
        assert abs(float(match.group(1)) - 2.0) <= tolerance, done
        assert abs(float(match.group(2)) - 1.0) <= tolerance, done


def test_an_image_whose_python_a_node_lacks_fails_with_the_reason(
    stack: RunningStack, mxnet_user: StackClient
) -> None:
    register_image(stack, "mxnet:elsewhere", "/opt/nowhere/bin/python")
    job = mxnet_user.submit(mxnet_request("no env", "dist_sync", image="mxnet:elsewhere"))
    job = mxnet_user.wait_finished(job["id"])
    assert job["state"] == "failed"
    assert re.match(
        r"\S+ on (node-\d): the job's image runs its trainers with /opt/nowhere/bin/python, "
        r"which \1 does not have \(see docs/deploy\.md: images that name their Python\)",
        job["reason"],
    ), job["reason"]
