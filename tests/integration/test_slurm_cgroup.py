"""Limits on Slurm jobs, as a site's task/cgroup sets them, on the real three-node Slurm of
stack/slurm.py: where the machine has cgroup v1 hierarchies, its cluster runs Slurm's cgroup/v1
plugin (task/cgroup with ConstrainCores and ConstrainRAMSpace, jobacct_gather/cgroup), so a
Trainyard job's instances get the cores and the memory its package asked Slurm for (--cpus-per-task,
--mem-per-cpu), and no more. The jobs are the console's own (jobs.services.slurm.slurm_batch), with
the fixtures and helpers of test_slurm.py. Skips, saying why, where the cluster runs without
task/cgroup (cgroup v2 only, no cgroups); under CI=true it fails instead.
"""

import time
from pathlib import Path
from typing import Any, cast

import psutil
import pytest
from django.contrib.auth.models import User

from jobs.models import Job
from jobs.services.slurm import slurm_batch, slurm_client, slurm_states
from stack import slurm
from tests.conftest import required_here
from tests.integration import test_slurm as slurm_tests
from workers.cgroups import read_memberships, read_mounts

pytestmark = pytest.mark.django_db

# test_slurm.py's fixtures (a cluster for this module, a shared folder per test) and helpers.
slurm_cluster = slurm_tests.slurm_cluster
target = slurm_tests.target
make_job = slurm_tests.make_job
outcomes = slurm_tests.outcomes
output_of = slurm_tests.output_of
processes_of = slurm_tests.processes_of
wait_until_gone = slurm_tests.wait_until_gone


@pytest.fixture
def limits(slurm_cluster: slurm.SlurmCluster) -> slurm.SlurmCluster:
    if not slurm_cluster.cgroups:
        reason = f"the Slurm test cluster runs without task/cgroup: {slurm_cluster.cgroups_off}"
        required_here("the Slurm limits tests", reason)
    return slurm_cluster


def trainer_of(folder: Path, timeout: float = 120) -> psutil.Process:
    """The running trainer of an attempt's only instance (the process with its scratch folder
    that the step wrapper started, not the wrapper)."""
    deadline = time.monotonic() + timeout
    while True:
        for pid in processes_of(folder):
            try:
                process = psutil.Process(pid)
                if "workers.slurmstep" not in " ".join(process.cmdline()):
                    return process
            except psutil.NoSuchProcess:
                continue
        assert time.monotonic() < deadline, "the trainer never started"
        time.sleep(0.1)


def v1_group(pid: int, controller: str) -> Path:
    """The folder of the cgroup v1 group of `controller` that the process is in."""
    memberships = read_memberships(Path(f"/proc/{pid}/cgroup").read_text())
    mount = next(
        m
        for m in read_mounts(Path("/proc/self/mountinfo").read_text())
        if m.fstype == "cgroup" and controller in m.options
    )
    return mount.point / memberships[controller].lstrip("/")


def own_group(cluster: slurm.SlurmCluster, controller: str) -> Path:
    """The cluster's own group of `controller`, where its slurmd make theirs."""
    return dict(zip(slurm.CGROUP_CONTROLLERS, cluster.cgroups, strict=True))[controller]


def test_an_instance_past_its_memory_is_oom_killed_and_slurm_says_out_of_memory(
    limits: slurm.SlurmCluster, target: slurm_client.SlurmTarget, catalog: None, alice: User
) -> None:
    # cpu-1 asks Slurm for 2 GB (--mem-per-cpu=2048M); the trainer takes 3 GB.
    job = make_job(
        alice, "pytorch:2.13-cpu", {"path": "hog.py"}, ["--gb", "3"], {"master": ("cpu-1", 1)}
    )
    slurm_id = slurm_batch.submit(job, target)
    wait_until_gone(limits, slurm_id)
    lines = output_of(target, job, slurm_id)
    assert "[master] holding 1536 MB" in lines, lines
    assert not any("holding 2048 MB" in line or "survived" in line for line in lines), lines
    # The kernel's OOM killer, in the step's memory group, killed the trainer, and the step
    # wrapper, reading its groups, says so as an agent does...
    ended = outcomes(target, job, ["master"])["master"]
    assert ended["state"] == "failed", ended
    reason, usage = str(ended["reason"]), cast(dict[str, Any], ended["usage"])
    assert reason.startswith("out of memory: used "), ended
    assert reason.endswith(" of 2 GB (package cpu-1): killed by signal SIGKILL"), ended
    assert usage["oom_kills"] >= 1, ended
    # ... and Slurm says so: the step (srun's, under the batch script) ended OUT_OF_MEMORY.
    assert "srun: error: n1: task 0: Out Of Memory" in lines, lines
    assert any(
        line.startswith(f"slurmstepd-{ended['node']}: error: Detected 1 oom-kill event(s) in ")
        and f"StepId={slurm_id}.0." in line
        for line in lines
    ), lines
    # The job's own state is FAILED: the batch script (srun's exec) exited non-zero. Only the
    # step is OUT_OF_MEMORY, which sacct would show where there is accounting.
    status = slurm_states.query(target, [slurm_id])[slurm_id]
    assert (status.slurm_state, status.slurm_reason) == ("FAILED", "NonZeroExitCode"), status
    assert status.state == Job.State.FAILED


def test_an_instance_runs_on_the_cores_it_asked_slurm_for_and_no_more(
    limits: slurm.SlurmCluster, target: slurm_client.SlurmTarget, catalog: None, alice: User
) -> None:
    # cpu-1 asks Slurm for one core (--cpus-per-task=1); the trainer keeps two processes busy
    # (this machine has at least two: Slurm checks its nodes' CPUs against it).
    job = make_job(
        alice,
        "pytorch:2.13-cpu",
        {"path": "busy.py"},
        ["--procs", "2", "--seconds", "4"],
        {"master": ("cpu-1", 1)},
    )
    slurm_id = slurm_batch.submit(job, target)
    trainer = trainer_of(slurm_batch.attempt_folder(target, job))
    cores = trainer.cpu_affinity()
    assert len(cores) == 1, cores
    cpuset = v1_group(trainer.pid, "cpuset")
    assert cpuset.is_relative_to(own_group(limits, "cpuset")), cpuset
    assert (cpuset / "cpuset.cpus").read_text().strip() == str(cores[0])
    # And the memory it asked for (cpu-1: --mem-per-cpu=2048M), in the step's group or the
    # job's above it.
    memory = v1_group(trainer.pid, "memory")
    assert memory.is_relative_to(own_group(limits, "memory")), memory
    limited = [
        int((group / "memory.limit_in_bytes").read_text())
        for group in (memory, *memory.parents)
        if (group / "memory.limit_in_bytes").exists()
    ]
    assert min(limited) == 2048 << 20, limited

    wait_until_gone(limits, slurm_id)
    done = [line for line in output_of(target, job, slurm_id) if "busy done:" in line]
    assert len(done) == 1, output_of(target, job, slurm_id)
    used = float(done[0].rsplit("cores=", 1)[1])
    assert used < 1.15, done  # two busy processes, one core between them
    status = slurm_states.query(target, [slurm_id])[slurm_id]
    assert status.slurm_state == "COMPLETED", status
    # The step's use, from its groups, as the console keeps it for the job page.
    usage = cast(dict[str, Any], outcomes(target, job, ["master"])["master"]["usage"])
    assert 0 < usage["cpu_seconds"] and 0 < usage["memory_peak_bytes"] <= 2048 << 20, usage
