"""Parameter-server jobs through the whole stack: 1 scheduler + 2 servers + 2 workers."""

import os
import re
import signal
import time
from typing import Any

import pytest

from tests.conftest import TERMINAL, RunningStack, process_alive, trainer_pids

pytestmark = pytest.mark.integration

EPOCH_LOSS = re.compile(r"^epoch=(\d+)/\d+ loss=([0-9.]+)")
JOINED = re.compile(r"role=(\w+) index=(\d+) .*pid=(\d+)")


def ps_request(mode: str, epochs: int = 4) -> dict[str, Any]:
    return {
        "name": f"ps {mode}",
        "image": "kvstore-ps:2.13",
        "program": {"script": "digits-ps", "args": ["--epochs", str(epochs)]},
        "roles": {
            "server": {"package": "cpu-1", "instances": 2},
            "worker": {"package": "cpu-1", "instances": 2},
        },
        "kvstore": mode,
    }


def tag(line: dict[str, Any]) -> str:
    return (
        line["role"]
        if line["role"] in ("master", "scheduler")
        else (f"{line['role']}-{line['index']}")
    )


def losses(lines: list[dict[str, Any]], who: str) -> dict[int, float]:
    found = {}
    for line in lines:
        match = EPOCH_LOSS.match(line["text"])
        if tag(line) == who and match:
            found[int(match.group(1))] = float(match.group(2))
    return found


@pytest.fixture(scope="module")
def ps_runs(stack: RunningStack) -> dict[str, dict[str, Any]]:
    """One job per kvstore mode, and DDP with the same 2 workers, batch and seed."""
    admin = stack.admin
    jobs = {
        mode: admin.submit(ps_request(mode))
        for mode in ("dist_sync", "dist_device_sync", "dist_async")
    }
    ddp = {
        "name": "ddp x2",
        "image": "pytorch:2.13-cpu",
        "program": {"script": "digits-ddp", "args": ["--epochs", "4"]},
        "roles": {
            "master": {"package": "cpu-1", "instances": 1},
            "worker": {"package": "cpu-1", "instances": 1},
        },
    }
    jobs["ddp"] = admin.submit(ddp)
    return {
        name: {"job": admin.wait_finished(job["id"]), "lines": admin.logs(job["id"])}
        for name, job in jobs.items()
    }


@pytest.mark.parametrize("mode", ["dist_sync", "dist_device_sync", "dist_async"])
def test_every_kvstore_mode_succeeds_with_every_role_tagged(
    ps_runs: dict[str, Any], mode: str
) -> None:
    run = ps_runs[mode]
    assert run["job"]["state"] == "succeeded", run["job"]["reason"]
    assert sorted(r["tag"] for r in run["job"]["replicas"]) == [
        "scheduler",
        "server-0",
        "server-1",
        "worker-0",
        "worker-1",
    ]
    tags = {tag(line) for line in run["lines"]}
    assert tags == {"scheduler", "server-0", "server-1", "worker-0", "worker-1"}
    servers = [x["text"] for x in run["lines"] if x["role"] == "server"]
    assert any(
        re.search(r"epoch=\d+/\d+ pushes=\d+ .*bytes_in=\d+ bytes_out=\d+", t) for t in servers
    ), servers[:5]
    final = [x["text"] for x in run["lines"] if x["text"].startswith("final eval_accuracy=")]
    assert len(final) == 1 and float(final[0].split("=")[1].split()[0]) >= 0.9


def test_dist_sync_follows_ddps_loss_curve(ps_runs: dict[str, Any]) -> None:
    ddp = losses(ps_runs["ddp"]["lines"], "master")
    sync = losses(ps_runs["dist_sync"]["lines"], "worker-0")
    assert sorted(ddp) == sorted(sync) == [1, 2, 3, 4]
    print(f"\nper-epoch loss, DDP vs dist_sync: {[(ddp[e], sync[e]) for e in sorted(ddp)]}")
    assert all(abs(ddp[e] - sync[e]) < 1e-3 for e in ddp)


def test_a_killed_server_fails_the_job_naming_it_and_leaves_nothing(
    stack: RunningStack,
) -> None:
    admin = stack.admin
    job = admin.submit(ps_request("dist_sync", epochs=200))
    joined: set[str] = set()
    deadline = time.monotonic() + 180
    while len(joined) < 4 or not any(
        x["role"] == "worker" and x["text"].startswith("epoch=") for x in admin.logs(job["id"])
    ):
        for line in admin.logs(job["id"], role="scheduler"):
            match = JOINED.search(line["text"])
            if match:
                joined.add(f"{match.group(1)}-{match.group(2)}")
        assert time.monotonic() < deadline, "the job never got going"
        time.sleep(0.2)
    pids = trainer_pids(job["id"])
    os.kill(pids["server-0"], signal.SIGKILL)
    killed = time.monotonic()
    finished = admin.wait(job["id"], lambda j: j["state"] in TERMINAL)
    failed_after = time.monotonic() - killed
    print(
        f"\nserver-0 killed -> job failed after {failed_after:.1f} s: "
        f"{finished['reason'].splitlines()[0]}"
    )
    assert finished["state"] == "failed"
    assert "server-0" in finished["reason"]
    admin.wait_finished(job["id"])
    assert not [p for p in pids.values() if process_alive(p)]
