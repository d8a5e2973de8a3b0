"""A job gets what it asked for and no more (issue 42; docs/security.md, "Limits"), on the real
stack: both users' jobs on one node, each instance in a cgroup of its own.

- a cpu-1 job running 4 busy processes gets at most 1.05 cores, read from its cgroup's cpuacct;
- a job that takes more memory than its package fails with the out-of-memory reason, while
  its neighbour, the agent and the neighbour's keeper live on;
- a fork bomb stops at its process limit (the log says so, the neighbour still forks), and
  fails with that reason;
- a job that writes past its disk limit gets a warning line, then is stopped with its reason;
- the efficiency figures of a digits-ddp run agree, within 5 %, with the CPU time the kernel
  counted for the trainer process from start to exit (wait4's rusage, what `time` shows).

The neighbour's throughput beside a busy job is a figure of `make bench` (bench/limits.py): a
wall-clock comparison does not belong in a suite that shares two cores.
"""

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.conftest import RunningStack, StackClient, required_here, signal_file, wait_until
from tests.integration.test_cli import run_cli
from workers import cgroups
from workers.examples import digits_ddp
from workers.keeperlink import folder_name

pytestmark = pytest.mark.integration

QUOTA = {"cpu": 4, "gpus": 0, "memory_gb": 16, "running_jobs": 4}
NODE = "node-1"


@dataclass
class Neighbours:
    running: RunningStack
    tag: str
    bob: StackClient  # the tenant who takes too much
    alice: StackClient  # the neighbour, whose job runs on the same node throughout
    alice_job: int
    node_cgroups: cgroups.Cgroups  # the agent's, as it made them

    def package(self, **fields: Any) -> str:
        return self.running.add_package("limits", **fields)

    def group(self, job_id: int, tag: str = "master") -> cgroups.InstanceGroup:
        return self.node_cgroups.group(folder_name(job_id, 0, tag))


def texts(client: StackClient, job_id: int) -> list[str]:
    return [line["text"] for line in client.logs(job_id)]


def request(name: str, script: str, package: str, args: list[str]) -> dict[str, Any]:
    return {
        "name": name,
        "image": "pytorch:2.13-cpu",
        "program": {"script": script, "args": args},
        "roles": {"master": {"package": package, "instances": 1}},
    }


def keeper_pid(running: RunningStack, job_id: int) -> int:
    state = running.stack.var_dir / "agents" / NODE / "keepers" / folder_name(job_id, 0, "master")
    return int(json.loads((state / "state.json").read_text())["keeper"]["pid"])


@pytest.fixture(scope="module")
def neighbours(stack: RunningStack) -> Iterator[Neighbours]:
    admin = stack.admin
    nodes = admin.http.get("/api/v1/nodes").json()["nodes"]
    said = stack.stack.manage(
        "shell", "-c",
        f"from jobs.models import Node; n = Node.objects.get(name={NODE!r}); "
        "print(n.limits_enforced, n.limits_reason)",
    ).strip().splitlines()[-1]  # fmt: skip
    if not said.startswith("True"):
        required_here("the limits tests", f"{NODE} enforces no limits: {said.partition(' ')[2]}")
    tag = uuid.uuid4().hex[:8]
    bob = stack.create_user(f"bob-{tag}", "bob-pw", quota=QUOTA)
    alice = stack.create_user(f"alice-{tag}", "alice-pw", quota=QUOTA)
    # Every job of this module on one node: the others take no new work meanwhile (only the
    # ready ones: one another test retired stays so).
    drained = [n["name"] for n in nodes if n["status"] == "ready" and n["name"] != NODE]
    for name in drained:
        assert admin.http.post(f"/api/v1/nodes/{name}/drain").status_code == 200
    release = signal_file()
    job = alice.submit(
        request("neighbour", "hold.py", "cpu-1", ["--release", str(release), "--rate", "5"])
    )
    try:
        alice.wait(job["id"], lambda j: j["state"] == "running")
        workdir = stack.stack.var_dir / "agents" / NODE
        found = cgroups.probe(NODE, str(workdir.resolve()), try_it=False)
        yield Neighbours(stack, tag, bob, alice, job["id"], found)
    finally:
        release.touch()
        alice.wait_finished(job["id"])
        for name in drained:
            admin.http.post(f"/api/v1/nodes/{name}/ready")
        stack.retire_packages("limits")


def neighbour_steps(n: Neighbours) -> int:
    """How many steps the neighbour has printed: it runs as long as this grows."""
    return sum(
        1 for t in texts(n.alice, n.alice_job) if t.startswith("master-0 ") and "pid" not in t
    )


def assert_the_neighbour_lives_on(n: Neighbours, agent_pid: int, keeper: int) -> None:
    job = n.alice.job(n.alice_job)
    assert job["state"] == "running", job
    assert psutil.pid_exists(agent_pid) and n.running.stack.pid(NODE) == agent_pid
    assert psutil.Process(keeper).is_running()
    before = neighbour_steps(n)
    wait_until("the neighbour's next steps", lambda: neighbour_steps(n) > before + 2)


def test_a_cpu_1_job_with_4_busy_processes_gets_one_core(neighbours: Neighbours) -> None:
    n = neighbours
    job = n.bob.submit(request("busy", "busy.py", "cpu-1", ["--procs", "4", "--seconds", "8"]))
    group = n.group(job["id"])
    usage = group.folders["cpuacct"] / "cpuacct.usage"
    wait_until("the busy processes", lambda: "busy: 4 processes for 8 s" in texts(n.bob, job["id"]))
    quota, period = (
        int((group.folders["cpu"] / f"cpu.cfs_{f}_us").read_text()) for f in ("quota", "period")
    )
    assert quota == period, f"cpu-1 is one core: quota {quota} µs per {period} µs"
    # Read by hand while it runs, until its group is gone with it: CPU-seconds over seconds.
    samples: list[tuple[float, int]] = []
    while True:
        try:
            value = int(usage.read_text())
        except (OSError, ValueError):
            break
        samples.append((time.monotonic(), value))
        if n.bob.job(job["id"])["state"] not in ("running", "queued", "starting"):
            break
        time.sleep(0.25)
    (t0, u0), (t1, u1) = samples[0], samples[-1]
    assert t1 - t0 > 2, samples
    cores = (u1 - u0) / 1e9 / (t1 - t0)
    assert cores <= 1.05, f"{cores:.3f} cores from cpuacct over {t1 - t0:.1f} s"
    # How much of its core it got depends on what else the machine runs (CI shares two cores
    # between two stacks): only that it ran is asserted here, the cap is the claim.
    assert u1 > u0, f"no CPU time counted in its group: {samples}"
    done = n.bob.wait_finished(job["id"])
    assert done["state"] == "succeeded", done["reason"]
    line = next(t for t in texts(n.bob, job["id"]) if t.startswith("busy done"))
    assert float(line.rsplit("cores=", 1)[1]) <= 1.05, line


def test_a_memory_hog_fails_out_of_memory_and_its_neighbour_lives_on(
    neighbours: Neighbours,
) -> None:
    n = neighbours
    agent = n.running.stack.pid(NODE)
    keeper = keeper_pid(n.running, n.alice_job)
    package = n.package(memory_gb=1)
    job = n.bob.wait_finished(n.bob.submit(request("hog", "hog.py", package, ["--gb", "3"]))["id"])
    assert job["state"] == "failed"
    assert job["reason"].startswith(
        f"master on {NODE}: out of memory: used 1.0 of 1 GB (package {package})"
    ), job["reason"]
    assert not any(t.startswith("survived") for t in texts(n.bob, job["id"]))
    assert_the_neighbour_lives_on(n, agent, keeper)


def test_a_fork_bomb_stops_at_its_process_limit(neighbours: Neighbours) -> None:
    n = neighbours
    agent = n.running.stack.pid(NODE)
    keeper = keeper_pid(n.running, n.alice_job)
    package = n.package(max_processes=64)
    release = signal_file()
    job = n.bob.submit(request("bomb", "forks.py", package, ["--release", str(release)]))
    try:
        note = (
            f"[trainyard] process limit of 64 reached (package {package}): forks fail from now on"
        )
        wait_until("the limit's note", lambda: note in texts(n.bob, job["id"]))
        said = next(t for t in texts(n.bob, job["id"]) if t.startswith("fork failed after"))
        # The trainer, the sandbox's processes and its children: 64 tasks, no more.
        group = n.group(job["id"])
        assert int((group.folders["pids"] / "pids.current").read_text()) <= 64, said
        assert_the_neighbour_lives_on(n, agent, keeper)
    finally:
        release.touch()
    done = n.bob.wait_finished(job["id"])
    assert done["state"] == "failed"
    assert done["reason"].startswith(
        f"master on {NODE}: process limit of 64 reached (package {package}): "
    ), done["reason"]
    wait_until("its group gone, and every process in it", lambda: not group.exists())


def test_a_job_writing_past_its_disk_limit_is_warned_then_stopped(
    neighbours: Neighbours,
) -> None:
    n = neighbours
    package = n.package(disk_gb=0.05)  # 51 MB
    release = signal_file()
    job = n.bob.submit(
        request("filler", "fill_work.py", package, ["--pause-at", "48", "--release", str(release)])
    )
    try:
        wait_until(
            "the warning",
            lambda: any(
                t.startswith("[trainyard] disk: the job's folders on this node hold")
                for t in texts(n.bob, job["id"])
            ),
        )
    finally:
        release.touch()
    done = n.bob.wait_finished(job["id"])
    assert done["state"] == "failed"
    assert done["reason"].startswith(
        f"master on {NODE}: disk limit reached: the job's working folder, checkpoints and "
        "instance folders hold "
    ), done["reason"]
    assert done["reason"].endswith(f" MB of 51 MB (package {package})"), done["reason"]
    lines = texts(n.bob, job["id"])
    warned = next(i for i, t in enumerate(lines) if t.startswith("[trainyard] disk:"))
    stopped = next(i for i, t in enumerate(lines) if t.startswith("[trainyard] stopped: disk"))
    assert warned < stopped


def test_the_efficiency_figures_agree_with_the_kernels_count(
    neighbours: Neighbours, tmp_path: Path
) -> None:
    n = neighbours
    example = str(Path(digits_ddp.__file__).resolve())
    job = n.bob.wait_finished(
        n.bob.submit(
            request("measured", "measured_digits.py", "cpu-1", [example, "--epochs", "3"])
        )["id"]
    )
    assert job["state"] == "succeeded", job["reason"]
    line = next(t for t in texts(n.bob, job["id"]) if t.startswith("measured cpu="))
    by_hand = float(line.split("cpu=")[1].split()[0])
    usage = job["usage"]
    assert usage is not None, job
    (instance,) = usage["instances"]
    assert abs(instance["cpu_seconds"] - by_hand) <= 0.05 * by_hand, (instance, line)
    assert usage["cores_asked"] == 1
    assert 0 < usage["cpu_efficiency"] <= 1.05
    # The group's peak is what it was charged: the trainer's own memory and the page cache it
    # brought in (libraries another group read first are charged there, so it may lie below
    # the RSS, which counts them): torch's own hundreds of MB, within the package's 2 GB.
    assert 0.1 < instance["memory_peak_gb"] <= 2, (instance, line)
    assert usage["summary"].startswith("CPU efficiency "), usage
    # The same figures in `trainyard show` (the page's: tests/unit/test_job_usage.py).
    shown = run_cli("show", str(job["id"]), config_dir=tmp_path, TRAINYARD_URL=n.running.url,
                    TRAINYARD_TOKEN=n.bob.token)  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert usage["summary"] in " ".join(shown.stdout.split()), shown.stdout
