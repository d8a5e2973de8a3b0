"""Trainyard jobs as Slurm jobs, on a real three-node Slurm (stack/slurm.py): munged,
slurmctld and three slurmd, each slurmd in a network namespace of its own where root allows.

The jobs are built by the console's own code (jobs.services.slurm_batch: components, plan,
Python batch script, sbatch) and every instance runs under workers.slurmstep, the step wrapper,
exactly as a cluster would run them. The tests skip, saying why, where Slurm cannot run
(not installed, or not root); under CI=true they fail instead.
"""

import json
import os
import sys
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import psutil
import pytest
from django.contrib.auth.models import User

from jobs.models import FrameworkImage, Job, JobRole, Package
from jobs.services import slurm_batch, slurm_states
from stack import slurm
from workers.slurmstep import outcome_file

pytestmark = pytest.mark.django_db

FIXTURE_CODE = Path(__file__).resolve().parent.parent / "fixtures" / "code"


@pytest.fixture(scope="module")
def slurm_cluster() -> Iterator[slurm.SlurmCluster]:
    reason = slurm.unavailable_reason()
    if reason:
        # CI has root and installs Slurm (`make test`): there, a skip would hide a broken set-up.
        if os.environ.get("CI"):
            pytest.fail(f"no real Slurm here: {reason}")
        pytest.skip(f"no real Slurm here: {reason}")
    cluster = slurm.SlurmCluster.start()
    yield cluster
    cluster.stop()


@pytest.fixture
def target(
    slurm_cluster: slurm.SlurmCluster, tmp_path_factory: pytest.TempPathFactory
) -> slurm_batch.SlurmTarget:
    shared = slurm_cluster.root / "shared" / tmp_path_factory.mktemp("job").name
    shared.mkdir(parents=True)
    return slurm_batch.SlurmTarget(
        partition=slurm_cluster.partition,
        shared_root=shared,
        python=sys.executable,
        code_root=FIXTURE_CODE,
        client_env={"SLURM_CONF": str(slurm_cluster.conf)},
    )


def make_job(
    owner: User,
    image: str,
    program: dict[str, str],
    args: list[str],
    roles: dict[str, tuple[str, int]],
    kvstore: str = "",
) -> Job:
    job = Job.objects.create(
        owner=owner,
        name="slurm",
        image=FrameworkImage.objects.get(name=image),
        program=program,
        args=args,
        kvstore=kvstore,
        cpu_total=1,
        gpus_total=0,
        memory_gb_total=1,
        price_per_hour=Decimal(0),
    )
    for role, (package, instances) in roles.items():
        JobRole.objects.create(
            job=job, role=role, package=Package.objects.get(name=package), instances=instances
        )
    return job


def wait_until_gone(cluster: slurm.SlurmCluster, slurm_id: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while cluster.command(["squeue", "-h", "-j", slurm_id], check=False).stdout.strip():
        assert time.monotonic() < deadline, cluster.command(["squeue", "-j", slurm_id]).stdout
        time.sleep(0.2)


def output_of(target: slurm_batch.SlurmTarget, job: Job, slurm_id: str) -> list[str]:
    return (
        (slurm_batch.attempt_folder(target, job) / f"slurm-{slurm_id}.out").read_text().splitlines()
    )


def outcomes(
    target: slurm_batch.SlurmTarget, job: Job, tags: list[str]
) -> dict[str, dict[str, object]]:
    folder = slurm_batch.attempt_folder(target, job)
    return {tag: json.loads(outcome_file(folder, tag).read_text()) for tag in tags}


def processes_of(folder: Path) -> list[int]:
    """The step wrappers (their --plan is in the folder) and trainers (their scratch folder
    is) of one attempt."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        try:
            mine = any(a.startswith(str(folder)) for a in process.info["cmdline"] or ())
            mine = mine or process.environ().get("TRAINYARD_SCRATCH_DIR", "").startswith(
                str(folder)
            )
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if mine:
            found.append(process.pid)
    return found


def test_a_ddp_job_runs_one_instance_on_each_of_three_slurm_nodes(
    slurm_cluster: slurm.SlurmCluster, target: slurm_batch.SlurmTarget, catalog: None, alice: User
) -> None:
    job = make_job(
        alice, "pytorch:2.13-cpu", {"example": "digits-ddp"}, ["--epochs", "3"],
        {"master": ("cpu-2", 1), "worker": ("cpu-2", 2)},
    )  # fmt: skip
    slurm_id = slurm_batch.submit(job, target)
    wait_until_gone(slurm_cluster, slurm_id)

    ended = outcomes(target, job, ["master", "worker-1", "worker-2"])
    assert {o["state"] for o in ended.values()} == {"succeeded"}, ended
    # Each instance on its own node, with its own address; the master's is MASTER_ADDR.
    assert sorted(str(o["node"]) for o in ended.values()) == ["n1", "n2", "n3"]
    addresses = {o["address"] for o in ended.values()}
    assert len(addresses) == len(slurm_cluster.nodes)
    assert addresses == {n.address for n in slurm_cluster.nodes}
    rendezvous = json.loads(
        (slurm_batch.attempt_folder(target, job) / "rendezvous.json").read_text()
    )
    assert rendezvous["address"] == ended["master"]["address"]

    lines = output_of(target, job, slurm_id)
    untagged = [
        line for line in lines if not line.startswith(("[master] ", "[worker-1] ", "[worker-2] "))
    ]
    assert not untagged
    # The three ranks trained together: every one printed its epochs, and rank 0 its accuracy.
    for tag in ("master", "worker-1", "worker-2"):
        assert any(line.startswith(f"[{tag}] ") and "epoch" in line for line in lines), tag


def test_a_parameter_server_job_is_a_heterogeneous_slurm_job(
    slurm_cluster: slurm.SlurmCluster, target: slurm_batch.SlurmTarget, catalog: None, alice: User
) -> None:
    job = make_job(
        alice, "kvstore-ps:2.13", {"example": "digits-ps"}, ["--epochs", "2"],
        {"scheduler": ("cpu-1", 1), "server": ("cpu-1", 2), "worker": ("cpu-1", 2)},
        kvstore="dist_sync",
    )  # fmt: skip
    assert [c.roles for c in slurm_batch.components(job)] == [
        ("scheduler",),
        ("server",),
        ("worker",),
    ]
    slurm_id = slurm_batch.submit(job, target)
    # One Slurm job of three components: 12+0, 12+1, 12+2.
    listed = slurm_cluster.command(
        ["squeue", "-h", "-o", "%i", "-j", slurm_id], check=False
    ).stdout.split()
    assert listed == [] or all(i.startswith(f"{slurm_id}+") for i in listed)
    wait_until_gone(slurm_cluster, slurm_id)

    tags = ["scheduler", "server-0", "server-1", "worker-0", "worker-1"]
    ended = outcomes(target, job, tags)
    assert {o["state"] for o in ended.values()} == {"succeeded"}, ended
    lines = output_of(target, job, slurm_id)
    assert all(line.startswith(tuple(f"[{t}] " for t in tags)) for line in lines)
    for tag in ("worker-0", "worker-1"):
        assert any(line.startswith(f"[{tag}] ") for line in lines), tag


def test_a_failing_script_names_its_instance_and_its_exception(
    slurm_cluster: slurm.SlurmCluster, target: slurm_batch.SlurmTarget, catalog: None, alice: User
) -> None:
    job = make_job(
        alice,
        "pytorch:2.13-cpu",
        {"path": "fail.py"},
        [],
        {"master": ("cpu-1", 1), "worker": ("cpu-1", 1)},
    )
    slurm_id = slurm_batch.submit(job, target)
    wait_until_gone(slurm_cluster, slurm_id)
    ended = outcomes(target, job, ["master"])
    assert ended["master"]["state"] == "failed"
    assert (
        ended["master"]["reason"]
        == "RuntimeError: simulated failure in step 3 (exited with code 3)"
    )
    lines = output_of(target, job, slurm_id)
    assert any(
        line.startswith("[master] Trainyard: master on ")
        and "RuntimeError: simulated failure" in line
        for line in lines
    )


def test_scancel_ends_the_slurm_job_and_every_process(
    slurm_cluster: slurm.SlurmCluster, target: slurm_batch.SlurmTarget, catalog: None, alice: User
) -> None:
    release = target.shared_root / "never-released"
    job = make_job(
        alice, "pytorch:2.13-cpu", {"path": "hold.py"}, ["--release", str(release)],
        {"master": ("cpu-2", 1), "worker": ("cpu-2", 2)},
    )  # fmt: skip
    slurm_id = slurm_batch.submit(job, target)
    folder = slurm_batch.attempt_folder(target, job)
    deadline = time.monotonic() + 120
    while not all((folder / tag).is_dir() for tag in ("master", "worker-1", "worker-2")):
        assert time.monotonic() < deadline, slurm_cluster.command(["squeue"]).stdout
        time.sleep(0.1)
    trainers = processes_of(folder)
    assert trainers, "the trainers should be running"

    slurm_cluster.command(["scancel", slurm_id])
    wait_until_gone(slurm_cluster, slurm_id)
    assert slurm_cluster.command(["squeue", "-h"]).stdout.strip() == ""
    deadline = time.monotonic() + 30
    while processes_of(folder):
        assert time.monotonic() < deadline, processes_of(folder)
        time.sleep(0.1)
    ended = outcomes(target, job, ["master"])
    assert ended["master"]["state"] == "stopped"


def test_a_job_larger_than_the_partition_is_refused_with_slurms_reason(
    slurm_cluster: slurm.SlurmCluster, target: slurm_batch.SlurmTarget, catalog: None, alice: User
) -> None:
    job = make_job(
        alice, "pytorch:2.13-cpu", {"example": "digits-ddp"}, [],
        {"master": ("cpu-2", 1), "worker": ("cpu-2", 3)},
    )  # fmt: skip
    with pytest.raises(
        slurm_batch.SlurmError,
        match=r"^Slurm's partition 'trainyard' can never hold this job: "
        r"Requested node configuration is not available$",
    ):
        slurm_batch.submit(job, target)
    assert slurm_cluster.command(["squeue", "-h"]).stdout.strip() == ""


def test_a_job_waiting_in_slurm_shows_slurms_reason(
    slurm_cluster: slurm.SlurmCluster, target: slurm_batch.SlurmTarget, catalog: None, alice: User
) -> None:
    release = target.shared_root / "release"
    holder = make_job(
        alice, "pytorch:2.13-cpu", {"path": "hold.py"}, ["--release", str(release)],
        {"master": ("cpu-2", 1), "worker": ("cpu-2", 2)},
    )  # fmt: skip
    holding = slurm_batch.submit(holder, target)
    waiter = make_job(
        alice,
        "pytorch:2.13-cpu",
        {"example": "digits-ddp"},
        ["--epochs", "1"],
        {"master": ("cpu-1", 1)},
    )
    waiting = slurm_batch.submit(waiter, target)
    deadline = time.monotonic() + 60
    while (
        status := slurm_states.query(target, [waiting]).get(waiting)
    ) is None or status.slurm_reason != "Resources":
        assert time.monotonic() < deadline, status
        time.sleep(0.2)
    assert status.state == Job.State.QUEUED
    assert status.words == "waiting for free nodes in Slurm"
    assert slurm_states.query(target, [holding])[holding].state == Job.State.RUNNING

    release.touch()
    wait_until_gone(slurm_cluster, waiting)
    ended = slurm_states.query(target, [holding, waiting])
    assert {s.slurm_state for s in ended.values()} == {"COMPLETED"}
    assert {s.state for s in ended.values()} == {Job.State.SUCCEEDED}
