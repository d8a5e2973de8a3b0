"""What the trainers' sandbox costs (workers/sandbox.py): the same programs started by the same
supervisor with and without bubblewrap, alternating, in one run.

- Time to the first line: from `Supervisor.start()` to the trainer's first line in Redis, for a
  program that prints at once (the sandbox's own cost, undiluted) and for train.py, which
  imports torch and builds its model first (what a user waits for).
- Training throughput: train.py's steps/s, timed inside its loop.

Target: within 5 % of the bare run on each. No asserts: figures and ratios.
"""

import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

from stack.redis_server import private_server
from workers import cgroups, contract, sandbox
from workers.logship import LogShipper
from workers.spec import ReplicaSpec
from workers.supervisor import Supervisor

PROGRAMS = Path(__file__).resolve().parent / "programs"
TRIALS = 7
TRAIN_RUNS = 3
TRAIN_STEPS = 1500
TARGET = 0.05


class Node:
    """One supervisor, sandboxed or not, and what its trainers print."""

    def __init__(
        self,
        client: redis.Redis,
        work: Path,
        trainer_sandbox: sandbox.Sandbox,
        instance_limits: cgroups.Cgroups | None = None,
        package: dict[str, Any] | None = None,
    ) -> None:
        self.client = client
        self.reports: list[tuple[str, dict[str, Any]]] = []
        self.shipper = LogShipper(client, work / "spool")
        self.supervisor = Supervisor(
            "bench", client, self.shipper, self._report, work, PROGRAMS,
            trainer_sandbox=trainer_sandbox, instance_limits=instance_limits,
        )  # fmt: skip
        # What the trainers' specs say of their package (workers/limits.py holds them to it).
        self.package = package or {}

    def _report(
        self, task_name: str, payload: dict[str, Any], deadline: float | None = None
    ) -> None:
        self.reports.append((task_name, payload))

    def result(self, job_id: int) -> Path:
        """Where a trainer may write: its job's checkpoint folder, in the sandbox too."""
        return self.supervisor.checkpoint_root / f"job-{job_id}" / "rate.json"

    def run(self, job_id: int, script: str, args: list[str], wait: bool = True) -> float:
        """Seconds from start() to the first line in Redis; waits for the replica to end
        (unless not `wait`: then join() does). "RESULT" in `args` stands for result(job_id)."""
        args = [str(self.result(job_id)) if a == "RESULT" else a for a in args]
        spec = ReplicaSpec(
            job_id=job_id, role="master", index=0, node="bench", framework="pytorch",
            program={"path": script}, args=args, master_addr="127.0.0.1", hosts_rendezvous=True,
            world_size=1, node_rank=0, rank_offset=0, local_world_size=1,
            **{"cpus": 1, "gpus": 0, **self.package}, owner=1,
        )  # fmt: skip
        began = time.perf_counter()
        self.supervisor.start(spec)
        key = contract.log_stream_key(job_id)
        while not self.client.xlen(key):
            time.sleep(0.001)
        first = time.perf_counter() - began
        if wait:
            self.join(job_id, script)
        return first

    def join(self, job_id: int, script: str) -> None:
        """Wait for the replica of `job_id` to end; raises if it failed."""
        while not any(
            n == contract.TASK_REPLICA_EXITED and p["job_id"] == job_id for n, p in self.reports
        ):
            time.sleep(0.01)
        exited = next(p for n, p in self.reports if p["job_id"] == job_id and "state" in p)
        if exited["state"] != "succeeded":
            raise RuntimeError(f"{script} failed: {exited['reason']}")

    def close(self) -> None:
        self.supervisor.shutdown()
        self.shipper.close()


def _ratio(sandboxed: float, bare: float) -> str:
    change = sandboxed / bare - 1
    verdict = "within target" if abs(change) <= TARGET else "OVER target"
    return f"{sandboxed / bare:.3f}x ({change:+.1%}; target within {TARGET:.0%}: {verdict})"


def sandbox_cost() -> bool:
    found = sandbox.probe()
    if not found.isolation.isolated:
        print(f"sandbox: SKIPPED (no sandbox on this host: {found.reason})")
        return True
    print(f"sandbox: {found.reason}")
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        with private_server(tmp / "redis") as (url, _):
            client = redis.Redis.from_url(url)
            nodes = {
                "bare": Node(client, tmp / "bare", sandbox.Sandbox(sandbox.Isolation.NONE)),
                "sandboxed": Node(client, tmp / "sandboxed", found),
            }
            try:
                _measure(nodes)
            finally:
                for node in nodes.values():
                    node.close()
    return True


def _measure(nodes: dict[str, Node]) -> None:
    job_ids = iter(range(1, 10_000))
    for label, script, args in (
        ("first line, a print at once", "hello.py", []),
        ("first line, train.py (imports torch)", "train.py", ["20", "RESULT"]),
    ):
        times: dict[str, list[float]] = {name: [] for name in nodes}
        for _ in range(TRIALS):  # alternating, so a noisy moment hits both
            for name, node in nodes.items():
                times[name].append(node.run(next(job_ids), script, args))
        bare, boxed = (statistics.median(times[n]) for n in ("bare", "sandboxed"))
        print(
            f"{label:<40} bare {bare * 1000:7.1f} ms, sandboxed {boxed * 1000:7.1f} ms "
            f"(medians of {TRIALS}) -> {_ratio(boxed, bare)}"
        )
    rates: dict[str, list[float]] = {name: [] for name in nodes}
    for _ in range(TRAIN_RUNS):
        for name, node in nodes.items():
            job_id = next(job_ids)
            node.run(job_id, "train.py", [str(TRAIN_STEPS), "RESULT"])
            rates[name].append(json.loads(node.result(job_id).read_text())["steps_per_second"])
    bare, boxed = (statistics.median(rates[n]) for n in ("bare", "sandboxed"))
    print(
        f"{'training throughput, train.py':<40} bare {bare:7.1f} steps/s, sandboxed "
        f"{boxed:7.1f} steps/s (medians of {TRAIN_RUNS}) -> {_ratio(boxed, bare)}"
    )
