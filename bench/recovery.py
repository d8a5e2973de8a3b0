"""Recovery from a kill -9 of one instance, beside the same job run without a fault.

Starts the real stack (two nodes, reconciliation every second as in the fault tests) and runs
the digits DDP example with 2 instances and 12 epochs twice, one after the other:

1. the baseline: no fault, from submission to success;
2. the same job with `restart: on-failure`: once epoch 4 is out, worker-1's trainer gets
   SIGKILL. Measured: the time from the kill to every instance of the new attempt running, and
   to its first epoch done; the epochs done twice (the work lost since the last checkpoint);
   the whole job's time against the baseline's; and both final accuracies.

    python -m bench.recovery
"""

import re
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psutil

from stack.redis_server import free_port
from stack.run import Stack

EPOCHS = 12
KILL_AFTER_EPOCH = 4
FAST_RECONCILIATION = {
    "TRAINYARD_HEARTBEAT_SECONDS": "1",
    "TRAINYARD_RECONCILE_SECONDS": "1",
    "TRAINYARD_ACK_GRACE_SECONDS": "4",
}
EPOCH = re.compile(r"^epoch=(\d+)/\d+ ")
FINAL = re.compile(r"^final eval_accuracy=([0-9.]+)")
GUARD_SECONDS = 600.0  # stops a hung run; measures nothing
# Issue 50's goal for the kill -> every instance running again (torch elastic's own restart of
# the same job took 1.6-2.0 s on this machine).
RUNNING_AGAIN_GOAL_SECONDS = 1.0


class Console:
    def __init__(self, url: str, token: str) -> None:
        self.http = httpx.Client(base_url=url, headers={"Authorization": f"Token {token}"})

    def submit(self, request: dict[str, Any]) -> int:
        response = self.http.post("/api/v1/jobs", json=request)
        response.raise_for_status()
        return int(response.json()["id"])

    def job(self, job_id: int) -> dict[str, Any]:
        response = self.http.get(f"/api/v1/jobs/{job_id}")
        response.raise_for_status()
        return dict(response.json())

    def lines(self, job_id: int) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        after = 0
        while True:
            page = self.http.get(f"/api/v1/jobs/{job_id}/logs", params={"after": after}).json()
            found.extend(page["lines"])
            if page["complete"] or page["next"] == after:
                return found
            after = page["next"]


def wait_for(what: str, check: Callable[[], Any]) -> Any:
    deadline = time.monotonic() + GUARD_SECONDS
    while not (value := check()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"gave up waiting for {what}")
        time.sleep(0.05)
    return value


def epochs(lines: list[dict[str, Any]], attempt: int) -> list[int]:
    return [
        int(m.group(1))
        for x in lines
        if x["role"] == "master" and x.get("attempt", 0) == attempt
        and (m := EPOCH.match(x["text"]))
    ]  # fmt: skip


def accuracy(lines: list[dict[str, Any]]) -> float:
    return next(float(m.group(1)) for x in lines if (m := FINAL.match(x["text"])))


def request(name: str, restart: bool) -> dict[str, Any]:
    job: dict[str, Any] = {
        "name": name,
        "image": "pytorch:2.13-cpu",
        "program": {"script": "digits-ddp", "args": ["--epochs", str(EPOCHS)]},
        "roles": {
            "master": {"package": "cpu-1", "instances": 1},
            "worker": {"package": "cpu-1", "instances": 1},
        },
    }
    if restart:
        job["restart"] = {"policy": "on-failure", "max_restarts": 2, "backoff_seconds": 0}
    return job


def finished(console: Console, job_id: int) -> dict[str, Any]:
    return dict(
        wait_for(
            f"job {job_id} to end",
            lambda: (j := console.job(job_id))["log_complete"] and j,
        )
    )


def worker_pid(stack: Stack, job_id: int) -> int:
    for node in ("node-1", "node-2"):
        for proc in psutil.Process(stack.pid(node)).children(recursive=True):
            try:
                env, argv = proc.environ(), proc.cmdline()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            # The trainer itself (argv[1] its script), not the sandbox's processes around it.
            if (
                env.get("TRAINYARD_JOB_ID") == str(job_id)
                and env.get("TRAINYARD_ROLE") == "worker"
                and argv[1:2]
                and argv[1].endswith(".py")
            ):
                return proc.pid
    return 0


def measure(stack: Stack, console: Console) -> bool:
    began = time.monotonic()
    base_id = console.submit(request("recovery baseline", restart=False))
    base = finished(console, base_id)
    base_seconds = time.monotonic() - began
    if base["state"] != "succeeded":
        print(f"recovery: FAILED the baseline ended {base['state']}: {base['reason']}")
        return False

    began = time.monotonic()
    job_id = console.submit(request("recovery under a kill -9", restart=True))
    wait_for(
        f"epoch {KILL_AFTER_EPOCH}",
        lambda: any(e >= KILL_AFTER_EPOCH for e in epochs(console.lines(job_id), 0)),
    )
    pid = wait_for("worker-1's pid", lambda: worker_pid(stack, job_id))
    psutil.Process(pid).send_signal(signal.SIGKILL)
    killed = time.monotonic()
    wait_for(
        "the new attempt to run",
        lambda: (j := console.job(job_id))["attempt"] == 1 and j["state"] == "running",
    )
    running_again = time.monotonic() - killed
    wait_for("its first epoch", lambda: epochs(console.lines(job_id), 1))
    stepping_again = time.monotonic() - killed
    job = finished(console, job_id)
    faulted_seconds = time.monotonic() - began
    if job["state"] != "succeeded":
        print(f"recovery: FAILED the faulted job ended {job['state']}: {job['reason']}")
        return False
    lines = console.lines(job_id)
    before, after = epochs(lines, 0), epochs(lines, 1)
    redone = len(set(before) & set(after))
    verdict = "MET" if running_again <= RUNNING_AGAIN_GOAL_SECONDS else "MISSED"
    print(
        f"kill -9 of worker-1 after epoch {max(before)} of {EPOCHS}: every instance running "
        f"again after {running_again:.1f} s (goal <= {RUNNING_AGAIN_GOAL_SECONDS:.1f} s: "
        f"{verdict}), first epoch of the new attempt done after {stepping_again:.1f} s"
    )
    print(
        f"  progress lost: {redone} epoch(s) done twice (the new attempt began at epoch "
        f"{after[0]}); whole job {faulted_seconds:.1f} s vs {base_seconds:.1f} s without a "
        f"fault -> {faulted_seconds / base_seconds:.2f}x"
    )
    print(
        f"  final eval accuracy {accuracy(lines):.4f} vs {accuracy(console.lines(base_id)):.4f} "
        "without a fault"
    )
    return True


def recovery() -> bool:
    with tempfile.TemporaryDirectory(prefix="bench-recovery-") as folder:
        stack = Stack(
            var_dir=Path(folder) / "var", port=free_port(), nodes=2, extra_env=FAST_RECONCILIATION
        )
        try:
            stack.prepare()
            stack.start()
            console = Console(stack.url, stack.manage("token", "admin").strip())
            return measure(stack, console)
        except (RuntimeError, OSError, KeyError, httpx.HTTPError) as exc:
            print(f"recovery: FAILED {exc}")
            return False
        finally:
            stack.stop()


if __name__ == "__main__":
    sys.exit(0 if recovery() else 1)
