"""Trainyard jobs as Slurm jobs, on a real three-node Slurm (stack/slurm.py): munged,
slurmctld and three slurmd, each slurmd in a network namespace of its own where root allows.

The jobs are built by the console's own code (jobs.services.slurm.slurm_batch: components, plan,
Python batch script, sbatch) and every instance runs under workers.slurmstep, the step wrapper,
exactly as a cluster would run them. The tests skip, saying why, where Slurm cannot run
(not installed, or not root); under CI=true they fail instead.
"""

import contextlib
import dataclasses
import grp
import json
import pwd
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psutil
import pytest
from django.contrib.auth.models import User

from jobs.models import FrameworkImage, Job, JobAttempt, JobRole, Package, SlurmPool, UnixAccount
from jobs.services import submission
from jobs.services.slurm import (
    slurm_batch,
    slurm_client,
    slurm_identity,
    slurm_pass,
    slurm_states,
)
from jobs.services.totals import RoleRequest
from stack import slurm
from tests.conftest import (
    RunningStack,
    StackClient,
    escape_verdicts,
    page_for,
    pytorch_request,
    required_here,
    running_stack,
    set_quota,
    signal_file,
)
from tests.integration.test_directory_identity import sign_in_through_directory
from tests.unit import test_directory, test_named_folders
from tests.unit.test_named_folders import ADA, VISION, TeamTree
from workers.slurmstep import outcome_file

pytestmark = pytest.mark.django_db

FIXTURE_CODE = Path(__file__).resolve().parent.parent / "fixtures" / "code"
# The directory tests' slapd, and the team's folder tree (tests/unit/test_named_folders.py).
directory, team_tree = test_directory.directory, test_named_folders.team_tree


@pytest.fixture(scope="module")
def slurm_cluster() -> Iterator[slurm.SlurmCluster]:
    # CI has root and installs Slurm (`make test`).
    required_here("the Slurm tests", slurm.unavailable_reason())
    cluster = slurm.SlurmCluster.start()
    yield cluster
    cluster.stop()


@pytest.fixture
def target(
    slurm_cluster: slurm.SlurmCluster, tmp_path_factory: pytest.TempPathFactory
) -> slurm_client.SlurmTarget:
    shared = slurm_cluster.root / "shared" / tmp_path_factory.mktemp("job").name
    shared.mkdir(parents=True)
    return slurm_client.SlurmTarget(
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


def output_of(target: slurm_client.SlurmTarget, job: Job, slurm_id: str) -> list[str]:
    return (
        (slurm_batch.attempt_folder(target, job) / f"slurm-{slurm_id}.out").read_text().splitlines()
    )


def outcomes(
    target: slurm_client.SlurmTarget, job: Job, tags: list[str]
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


def test_nothing_of_the_checkout_runs_as_another_user(slurm_cluster: slurm.SlurmCluster) -> None:
    """munged runs as `munge`, which may not read the checkout (a clone under root's home,
    mode 0700): `make slurm` failed there, munged unable to open workers/deathsig.py. Its
    death signal comes from setpriv now, and nothing on its command line is the checkout's."""
    checkout = str(Path(__file__).resolve().parent.parent.parent)
    munged = psutil.Process(slurm_cluster.pids["munged"])
    assert munged.username() == "munge"
    assert not [arg for arg in munged.cmdline() if checkout in arg], munged.cmdline()


def test_a_ddp_job_runs_one_instance_on_each_of_three_slurm_nodes(
    slurm_cluster: slurm.SlurmCluster, target: slurm_client.SlurmTarget, catalog: None, alice: User
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
    # What carries the job's variables and lines is its owner's alone on the shared file
    # system: the plan (0600) and Slurm's output (made with sbatch's umask, 077).
    folder = slurm_batch.attempt_folder(target, job)
    for name in ("plan.json", f"slurm-{slurm_id}.out"):
        assert (folder / name).stat().st_mode & 0o077 == 0, (
            name,
            oct((folder / name).stat().st_mode),
        )

    lines = output_of(target, job, slurm_id)
    untagged = [
        line for line in lines if not line.startswith(("[master] ", "[worker-1] ", "[worker-2] "))
    ]
    assert not untagged
    # The three ranks trained together: every one printed its epochs, and rank 0 its accuracy.
    for tag in ("master", "worker-1", "worker-2"):
        assert any(line.startswith(f"[{tag}] ") and "epoch" in line for line in lines), tag


def test_a_parameter_server_job_is_a_heterogeneous_slurm_job(
    slurm_cluster: slurm.SlurmCluster, target: slurm_client.SlurmTarget, catalog: None, alice: User
) -> None:
    # Packages that differ: one component per role, each on nodes of its own (Slurm never
    # puts two components on one node): the scheduler, the server, the two workers.
    job = make_job(
        alice, "kvstore-ps:2.13", {"example": "digits-ps"}, ["--epochs", "2"],
        {"scheduler": ("cpu-1", 1), "server": ("cpu-2", 1), "worker": ("cpu-1", 2)},
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

    tags = ["scheduler", "server-0", "worker-0", "worker-1"]
    ended = outcomes(target, job, tags)
    assert {o["state"] for o in ended.values()} == {"succeeded"}, ended
    lines = output_of(target, job, slurm_id)
    assert all(line.startswith(tuple(f"[{t}] " for t in tags)) for line in lines)
    for tag in ("worker-0", "worker-1"):
        assert any(line.startswith(f"[{tag}] ") for line in lines), tag


def test_a_failing_script_names_its_instance_and_its_exception(
    slurm_cluster: slurm.SlurmCluster, target: slurm_client.SlurmTarget, catalog: None, alice: User
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
    slurm_cluster: slurm.SlurmCluster, target: slurm_client.SlurmTarget, catalog: None, alice: User
) -> None:
    release = signal_file("never-released")
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
    # The wrappers that wrote an outcome say "stopped". The batch node's (the master's) does
    # not always get to write one: the console then has Slurm's word for it (CANCELLED).
    written = [t for t in ("master", "worker-1", "worker-2") if outcome_file(folder, t).exists()]
    assert written, "no wrapper wrote an outcome"
    assert {o["state"] for o in outcomes(target, job, written).values()} == {"stopped"}


def test_a_job_larger_than_the_partition_is_refused_with_the_limit_it_is_over(
    slurm_cluster: slurm.SlurmCluster, target: slurm_client.SlurmTarget, catalog: None, alice: User
) -> None:
    job = make_job(
        alice, "pytorch:2.13-cpu", {"example": "digits-ddp"}, [],
        {"master": ("cpu-2", 1), "worker": ("cpu-2", 3)},
    )  # fmt: skip
    with pytest.raises(
        slurm_client.SlurmRefused,
        match=r"^it needs 8 CPU cores in all; Slurm's partition 'trainyard' has 6 on 3 nodes "
        r"\(Slurm would keep it waiting for ever\)$",
    ):
        slurm_batch.submit(job, target)
    assert slurm_cluster.command(["squeue", "-h"]).stdout.strip() == ""


def test_each_limit_of_the_partition_has_its_own_reason(
    target: slurm_client.SlurmTarget, catalog: None
) -> None:
    """Nodes, memory per node, CPUs in all: three jobs Slurm would keep waiting for ever, and
    sbatch --test-only refused all three alike ("Requested node configuration is not
    available"). The real partition: three nodes of 2 CPUs and 16,000 MB."""
    big_memory = Package.objects.create(name="cpu-1-12g", cpu=1, memory_gb=12)
    too_much = Package.objects.create(name="cpu-2-20g", cpu=2, memory_gb=20)
    cpu_1 = Package.objects.get(name="cpu-1")

    def refusal(package: Package, instances: int) -> str:
        return slurm_batch.why_never_runs(
            [RoleRequest("worker", package, instances)], False, target
        )

    assert refusal(big_memory, 4).startswith(
        "4 instances of the worker (cpu-1-12g) need at least 4 nodes, as a node holds at most "
        "1 of them; Slurm's partition 'trainyard' has 3"
    )
    assert refusal(too_much, 1).startswith(
        "one instance of the worker (cpu-2-20g) needs 20480 MB of memory on one node; the "
        "nodes of Slurm's partition 'trainyard' have 16000 MB at most"
    )
    assert refusal(cpu_1, 7).startswith(
        "it needs 7 CPU cores in all; Slurm's partition 'trainyard' has 6 on 3 nodes"
    )
    assert refusal(big_memory, 3) == "" and refusal(cpu_1, 6) == ""


def test_a_job_waiting_in_slurm_shows_slurms_reason(
    slurm_cluster: slurm.SlurmCluster, target: slurm_client.SlurmTarget, catalog: None, alice: User
) -> None:
    release = signal_file()
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


# --- the Slurm pass itself, on this test's database ------------------------------------------


@pytest.fixture
def pool(
    target: slurm_client.SlurmTarget, catalog: None, redis_url: str, settings: Any
) -> Iterator[SlurmPool]:
    """A Slurm pool on the real cluster, in this test's database (no console runs): the tests
    run the pass themselves. Whatever they left in Slurm is cancelled after."""
    settings.TRAINYARD_CODE_ROOT = FIXTURE_CODE
    pool = SlurmPool.objects.create(
        name="pass-test",
        partition=target.partition,
        shared_root=str(target.shared_root),
        python=sys.executable,
        code_root=str(FIXTURE_CODE),
        slurm_conf=target.client_env["SLURM_CONF"],
    )
    pool.images.set(FrameworkImage.objects.all())
    pool.packages.set(Package.objects.all())
    yield pool
    for attempt in JobAttempt.objects.exclude(slurm_job_id=""):
        slurm_client.run_client(["scancel", attempt.slurm_job_id], target)


def queue_job(owner: User, pool: SlurmPool, script: str, args: list[str]) -> Job:
    body = {**pytorch_request("pass", script, 1, "cpu-1", args), "pool": pool.name}
    return submission.submit_job(owner, submission.check_job_request(body, owner))


def in_slurm(cluster: slurm.SlurmCluster, slurm_id: str) -> str:
    """The job's state in Slurm (PENDING, RUNNING, …), or "" once Slurm no longer lists it."""
    listed = cluster.command(["squeue", "-h", "-o", "%T", "-j", slurm_id], check=False)
    return listed.stdout.strip()


def test_a_pass_never_cancels_a_job_another_pass_is_submitting(
    slurm_cluster: slurm.SlurmCluster, pool: SlurmPool, alice: User, monkeypatch: Any
) -> None:
    """The console worker's loop and its slurm_now tasks run passes side by side. A pass that
    runs while another's sbatch has just gone through sees a trainyard-<id> job no attempt
    names yet: it must not take it for a stray and cancel it."""
    set_quota(alice)
    job = queue_job(alice, pool, "hold.py", ["--release", str(signal_file("never"))])
    real_submit = slurm_batch.submit
    during: list[slurm_pass.PassReport] = []

    def submit_then_another_pass(*args: Any, **kwargs: Any) -> str:
        slurm_id = real_submit(*args, **kwargs)
        during.append(slurm_pass.run_pass())  # the other pass, before this one writes the id
        return slurm_id

    monkeypatch.setattr(slurm_batch, "submit", submit_then_another_pass)
    report = slurm_pass.run_pass()
    assert report.submitted == 1 and report.errors == [], report
    assert during and during[0].cancelled == 0 and during[0].submitted == 0, during
    slurm_id = JobAttempt.objects.get(job=job).slurm_job_id
    assert in_slurm(slurm_cluster, slurm_id) in ("PENDING", "RUNNING")
    # And later passes follow it as the job's, never as a stray.
    monkeypatch.setattr(slurm_batch, "submit", real_submit)
    assert slurm_pass.run_pass().cancelled == 0
    assert in_slurm(slurm_cluster, slurm_id) in ("PENDING", "RUNNING")


def test_a_job_whose_plan_cannot_be_written_waits_and_the_others_go_on(
    slurm_cluster: slurm.SlurmCluster, pool: SlurmPool, alice: User
) -> None:
    set_quota(alice)
    blocked = queue_job(alice, pool, "numbered.py", ["--lines", "3"])
    other = queue_job(alice, pool, "numbered.py", ["--lines", "3"])
    # Where the blocked job's folder goes, a file: its plan cannot be written.
    jobs = Path(pool.shared_root) / "jobs"
    jobs.mkdir(parents=True, exist_ok=True)
    (jobs / str(blocked.pk)).write_text("in the way")
    report = slurm_pass.run_pass()
    assert report.submitted == 1 and len(report.errors) == 1, report
    blocked.refresh_from_db()
    assert blocked.state == Job.State.QUEUED
    assert blocked.reason.startswith(
        "waiting: it could not be submitted to Slurm (pass-test) yet: "
    ), blocked.reason
    assert JobAttempt.objects.get(job=blocked).slurm_job_id == ""
    other_id = JobAttempt.objects.get(job=other).slurm_job_id
    assert other_id and in_slurm(slurm_cluster, other_id) in ("PENDING", "RUNNING", "COMPLETING")
    # Once the way is clear, the next pass submits it.
    (jobs / str(blocked.pk)).unlink()
    assert slurm_pass.run_pass().submitted == 1
    assert JobAttempt.objects.get(job=blocked).slurm_job_id


# --- through the console: the form's API, the Slurm pass, the job's log ------------------------

POOL = "slurm-test"
LOST_SECONDS = 15


@pytest.fixture(scope="module")
def slurm_stack(
    slurm_cluster: slurm.SlurmCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningStack]:
    """The console, as `make run` runs it, with a Slurm pool on the cluster above: its Redis
    also listens where the Slurm nodes reach this machine (the bridge), and no agent runs."""
    gateway = slurm_cluster.controller_address
    also = () if gateway == "127.0.0.1" else (gateway,)
    with running_stack(
        tmp_path_factory.mktemp("slurm-stack"),
        nodes=0,
        redis_also_on=also,
        # An instance silent this long is lost (its step wrapper's beats stop): the silent
        # instance's test waits for it.
        extra_env={"TRAINYARD_NODE_LOST_SECONDS": str(LOST_SECONDS)},
    ) as running:
        shared = slurm_cluster.root / "shared" / "console"
        shared.mkdir(parents=True)
        running.stack.manage(
            "slurm_pool", POOL,
            "--partition", slurm_cluster.partition,
            "--shared-root", str(shared),
            "--python", sys.executable,
            "--code-root", str(FIXTURE_CODE),
            "--slurm-conf", str(slurm_cluster.conf),
            "--redis-host", gateway,
            "--all-images", "--all-packages", "--check",
        )  # fmt: skip
        yield running


@pytest.fixture(scope="module")
def sam(slurm_stack: RunningStack) -> StackClient:
    return slurm_stack.create_user(
        "sam", "sam-password-1", {"cpu": 32, "gpus": 0, "memory_gb": 256, "running_jobs": 8}
    )


def slurm_request(
    script: str, instances: int, package: str = "cpu-2", args: list[str] | None = None, **more: Any
) -> dict[str, Any]:
    return {**pytorch_request("on-slurm", script, instances, package, args), "pool": POOL, **more}


def test_a_ddp_job_from_the_api_runs_on_slurm_with_every_line_in_its_log(
    slurm_cluster: slurm.SlurmCluster, sam: StackClient
) -> None:
    job = sam.submit(slurm_request("numbered.py", 3, args=["--lines", "300"]))
    assert job["pool"] == POOL
    done = sam.wait_finished(job["id"])
    assert done["state"] == "succeeded", done
    lines = sam.logs(job["id"])
    # Every line tagged with its instance, and none lost: 300 numbered lines from each.
    for role, index in (("master", 0), ("worker", 1), ("worker", 2)):
        mine = [line["text"] for line in lines if (line["role"], line["index"]) == (role, index)]
        numbers = sorted(int(t.split()[1]) for t in mine if t.startswith(f"{role}-{index} "))
        assert numbers == list(range(300)), (role, index, mine[:5])
    # One Slurm job, placed by Slurm on its three nodes.
    attempts = done["attempts"]
    assert len(attempts) == 1 and attempts[0]["nodes"] == ["n[1-3]"], attempts


def ps_request(server: str, worker: str, workers: int = 2) -> dict[str, Any]:
    return {
        "name": "ps on slurm",
        "image": "kvstore-ps:2.13",
        "program": {"script": "digits-ps", "args": ["--epochs", "2"]},
        "roles": {
            "server": {"package": server, "instances": 1},
            "worker": {"package": worker, "instances": workers},
        },
        "kvstore": "dist_sync",
        "pool": POOL,
    }


def test_a_parameter_server_job_of_one_package_runs_on_three_slurm_nodes(
    sam: StackClient,
) -> None:
    """A scheduler, a server and three workers of one core each on three nodes of two: as a
    heterogeneous job (one component per role) it needed 1 + 1 + 2 nodes and waited for ever
    ("Resources" on an idle cluster), since Slurm never puts two components on one node. Its
    roles share a package, so it is one component of five tasks, and runs."""
    job = sam.submit(ps_request("cpu-1", "cpu-1", workers=3))
    done = sam.wait_finished(job["id"])
    assert done["state"] == "succeeded", done["reason"]
    tags = sorted(r["tag"] for r in done["replicas"])
    assert tags == ["scheduler", "server-0", "worker-0", "worker-1", "worker-2"]
    lines = sam.logs(job["id"])
    said = {(line["role"], line["index"]) for line in lines}
    assert said >= {("scheduler", 0), ("server", 0), ("worker", 0), ("worker", 1), ("worker", 2)}
    assert any("eval_accuracy" in line["text"] for line in lines if line["role"] == "worker")


def test_a_heterogeneous_job_that_needs_more_nodes_than_the_partition_is_refused(
    sam: StackClient,
) -> None:
    response = sam.http.post("/api/v1/jobs", json=ps_request("cpu-1", "cpu-2"))
    assert response.status_code == 400, response.text
    said = json.dumps(response.json())
    assert "Slurm never puts two of its components on one node" in said, said
    assert "need 1 + 1 + 2 = 4 nodes; Slurm's partition 'trainyard' has 3" in said, said


def test_a_failing_script_on_slurm_names_the_instance_and_its_exception(
    sam: StackClient,
) -> None:
    job = sam.submit(slurm_request("fail.py", 2, package="cpu-1"))
    done = sam.wait_finished(job["id"])
    assert done["state"] == "failed"
    assert re.match(
        r"^(master|worker-1) on n\d: RuntimeError: simulated failure in step 3 "
        r"\(exited with code 3\)",
        done["reason"],
    ), done["reason"]
    failed = [r for r in done["replicas"] if r["state"] == "failed"]
    assert failed and all("RuntimeError: simulated failure" in r["reason"] for r in failed)


def test_cancel_ends_the_slurm_job_and_every_process(
    slurm_cluster: slurm.SlurmCluster, sam: StackClient
) -> None:
    release = signal_file("never")
    job = sam.submit(slurm_request("hold.py", 3, args=["--release", str(release)]))
    sam.wait(job["id"], lambda j: j["state"] == "running")
    # Wait for the trainers themselves: they print once they have joined.
    sam.wait(job["id"], lambda j: len({(x["role"], x["index"]) for x in sam.logs(j["id"])}) == 3)
    response = sam.http.post(f"/api/v1/jobs/{job['id']}/cancel")
    assert response.status_code == 200, response.text
    done = sam.wait_finished(job["id"])
    assert done["state"] == "cancelled"
    assert slurm_cluster.command(["squeue", "-h"]).stdout.strip() == ""
    leftovers = [
        p.pid
        for p in psutil.process_iter()
        if _environ(p).get("TRAINYARD_JOB_ID") == str(job["id"])
    ]
    assert leftovers == []
    assert {r["state"] for r in done["replicas"]} == {"stopped"}


def _environ(process: psutil.Process) -> dict[str, str]:
    try:
        return process.environ()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return {}


def test_a_job_larger_than_the_slurm_partition_is_refused_at_submission(
    sam: StackClient,
) -> None:
    response = sam.http.post("/api/v1/jobs", json=slurm_request("numbered.py", 4))
    assert response.status_code == 400, response.text
    said = json.dumps(response.json())
    assert "it needs 8 CPU cores in all; Slurm's partition 'trainyard' has 6 on 3 nodes" in said
    assert "Slurm would keep it waiting for ever" in said


def test_one_instance_per_node_is_ntasks_per_node_1_on_slurm(sam: StackClient) -> None:
    """Two instances of one core fit one node of two cores, where Slurm packs them; one per
    node (issue 49, item 11) they get two nodes. Four of them would need four of the three."""
    job = sam.submit(slurm_request("numbered.py", 2, "cpu-1", ["--lines", "3"],
                                   one_instance_per_node=True))  # fmt: skip
    done = sam.wait_finished(job["id"])
    assert done["state"] == "succeeded", done["reason"]
    assert done["one_instance_per_node"] is True
    nodes = {r["node"] for r in done["replicas"]}
    assert len(nodes) == 2 and nodes <= {"n1", "n2", "n3"}, done["replicas"]
    refused = sam.http.post(
        "/api/v1/jobs", json=slurm_request("numbered.py", 4, "cpu-1", one_instance_per_node=True)
    )
    assert refused.status_code == 400, refused.text
    assert refused.json()["errors"]["roles"][0] == (
        "4 instances of the master/worker (cpu-1) need at least 4 nodes, as they go one per "
        "node (--ntasks-per-node=1); Slurm's partition 'trainyard' has 3 (Slurm would keep it "
        "waiting for ever)"
    )


def test_a_job_waiting_in_slurm_shows_slurms_reason_on_its_page(
    slurm_cluster: slurm.SlurmCluster, slurm_stack: RunningStack, sam: StackClient
) -> None:
    release = signal_file("holder")
    holder = sam.submit(slurm_request("hold.py", 3, args=["--release", str(release)]))
    sam.wait(holder["id"], lambda j: j["state"] == "running")
    waiter = sam.submit(slurm_request("numbered.py", 1, package="cpu-1", args=["--lines", "3"]))
    waiting = sam.wait(
        waiter["id"], lambda j: j["reason"].startswith("waiting for free nodes in Slurm")
    )
    assert waiting["state"] == "queued"
    # Its place in Slurm's queue, on its page, in the API and on the Queue page.
    assert waiting["reason"] == (
        "waiting for free nodes in Slurm (place 1 of 1 waiting in partition trainyard)"
    ), waiting["reason"]
    assert waiting["queue_position"] == 1, waiting
    page = page_for(slurm_stack, "sam", "sam-password-1", f"/jobs/{waiter['id']}/")
    assert "waiting for free nodes in Slurm" in page
    listed = sam.http.get("/api/v1/queue").json()["slurm"]
    mine = [e for e in listed if e["job_id"] == waiter["id"]]
    assert len(mine) == 1 and mine[0]["place"] == 1 and mine[0]["pool"] == POOL, listed
    assert mine[0]["slurm_job_id"] == slurm_id_of(slurm_cluster, waiter["id"]), mine
    queue_page = page_for(slurm_stack, "sam", "sam-password-1", "/queue/")
    assert 'id="slurm-queue"' in queue_page and f'data-job="{waiter["id"]}"' in queue_page
    # The Nodes page lists the pool's nodes as Slurm sees them, the holder on each of them.
    nodes_page = page_for(slurm_stack, "sam", "sam-password-1", "/nodes/")
    assert f'data-pool="{POOL}"' in nodes_page
    for node in slurm_cluster.nodes:
        row = re.search(rf'<tr data-node="{node.name}">(.*?)</tr>', nodes_page, re.S)
        assert row, f"{node.name} not on the Nodes page"
        assert f'href="/jobs/{holder["id"]}/"' in row.group(1), row.group(1)
        assert re.search(r"(allocated|mixed)", row.group(1)), row.group(1)
    release.touch()
    assert sam.wait_finished(holder["id"])["state"] == "succeeded"
    assert sam.wait_finished(waiter["id"])["state"] == "succeeded"


def test_a_redis_restart_loses_no_line_of_a_slurm_job(
    slurm_stack: RunningStack, sam: StackClient
) -> None:
    """Redis restarted mid-job comes back without the job's Redis user (ACLs live in memory):
    the Slurm pass makes it again from the hash it kept, and the lines the wrappers spooled
    meanwhile reach the log, none lost and none twice. (A clean restart: a Redis killed with
    SIGKILL may come back without its last second of writes, which the wrapper does not send
    again; docs/slurm.md.)"""
    lines = 400
    job = sam.submit(
        slurm_request(
            "numbered.py", 2, package="cpu-1", args=["--lines", str(lines), "--rate", "40"]
        )
    )
    sam.wait(job["id"], lambda j: len(sam.logs(j["id"])) >= 40)
    slurm_stack.stack.restart("redis")
    done = sam.wait_finished(job["id"])
    assert done["state"] == "succeeded", done["reason"]
    got = sam.logs(job["id"])
    for tag in ("master-0", "worker-1"):
        numbers = [int(x["text"].split()[1]) for x in got if x["text"].startswith(f"{tag} ")]
        assert sorted(numbers) == list(range(lines)), (tag, len(numbers))


def test_a_slurm_job_no_console_job_owns_is_cancelled(
    slurm_cluster: slurm.SlurmCluster, slurm_stack: RunningStack
) -> None:
    """Reconciliation the other way: a job of this pool (its name and its folder under the
    pool's shared root) that no attempt of an active job is, as one whose submit answer was
    lost, is cancelled by the Slurm pass; a job of someone else's is left alone."""
    jobs = slurm_cluster.root / "shared" / "console" / "jobs"
    folder = jobs / "987654" / "attempt-0"
    folder.mkdir(parents=True)
    elsewhere = slurm_cluster.root / "not-ours"
    elsewhere.mkdir()
    script = elsewhere / "sleep.py"
    script.write_text(f"#!{sys.executable}\nimport time\ntime.sleep(600)\n")

    def sbatch(name: str, chdir: Path) -> str:
        argv = [
            "sbatch", "--parsable", f"--job-name={name}", f"--chdir={chdir}",
            f"--partition={slurm_cluster.partition}", "--ntasks=1", "--cpus-per-task=1",
            f"--output={chdir}/out", str(script),
        ]  # fmt: skip
        return slurm_cluster.command(argv).stdout.strip()

    stray = sbatch("trainyard-987654", folder)
    foreign = sbatch("trainyard-987654", elsewhere)
    try:
        deadline = time.monotonic() + 60
        while slurm_cluster.command(["squeue", "-h", "-j", stray], check=False).stdout.strip():
            assert time.monotonic() < deadline, slurm_cluster.command(["squeue"]).stdout
            time.sleep(0.2)
        # Left alone: Slurm starts it (as soon as its scheduler runs), and nobody cancels it.
        while (
            listed := slurm_cluster.command(["squeue", "-h", "-o", "%i %T", "-j", foreign]).stdout
        ).split() != [foreign, "RUNNING"]:
            assert listed.split()[:1] == [foreign], listed
            assert time.monotonic() < deadline + 60, listed
            time.sleep(0.2)
    finally:
        slurm_cluster.command(["scancel", foreign], check=False)


def checkpointer_request(release: Path) -> dict[str, Any]:
    """Two instances that checkpoint and hold until `release`, restarted once on a failure."""
    return slurm_request(
        "checkpointer.py", 2, args=["--hold", str(release)],
        restart={"policy": "on-failure", "max_restarts": 1, "backoff_seconds": 0},
    )  # fmt: skip


def test_a_lost_slurm_node_restarts_the_job_on_the_others_from_its_checkpoint(
    slurm_cluster: slurm.SlurmCluster, sam: StackClient
) -> None:
    release = signal_file("checkpointer")
    job = sam.submit(checkpointer_request(release))
    sam.wait(job["id"], lambda j: j["state"] == "running")
    # Both trainers started (the first to write its checkpoint may be read by the other).
    sam.wait(
        job["id"],
        lambda j: sum(x["text"].startswith("resumed from: ") for x in sam.logs(j["id"])) == 2,
    )
    first = sam.job(job["id"])["attempts"][0]["nodes"][0]  # n[1-2]: the first two
    lost = "n2"
    assert first == "n[1-2]", first
    try:
        slurm_cluster.lose_node(lost)
        restarted = sam.wait(job["id"], lambda j: j["attempt"] == 1 and j["state"] == "running")
        assert "n2" not in restarted["attempts"][1]["nodes"][0], restarted["attempts"]
        release.touch()
        done = sam.wait_finished(job["id"])
    finally:
        slurm_cluster.restore_node(lost)
    assert done["state"] == "succeeded", done["reason"]
    assert done["restarts_used"] == 1
    assert "NODE_FAIL" in done["attempts"][0]["reason"] or "n2" in done["attempts"][0]["reason"], (
        done["attempts"]
    )
    second = [x["text"] for x in sam.logs(job["id"]) if x["attempt"] == 1]
    resumed = [t for t in second if t.startswith("resumed from: ")]
    assert len(resumed) == 2 and "resumed from: nothing" not in resumed, second


def test_a_silent_instance_shows_at_once_and_is_lost_before_slurm_notices(
    slurm_cluster: slurm.SlurmCluster, sam: StackClient
) -> None:
    """A node that hangs: its slurmd answers Slurm, so Slurm keeps the job running (for ever,
    or SlurmdTimeout on a node that died), while the instance does nothing. Here worker-1's step
    wrapper and trainer are frozen. Its beats stop: the page says at once that it is not heard
    from, and after TRAINYARD_NODE_LOST_SECONDS the instance is lost, as an agent's silent node
    is, and the job restarts from its checkpoint."""
    release = signal_file("frozen")
    job = sam.submit(checkpointer_request(release))
    sam.wait(
        job["id"],
        lambda j: sum(x["text"].startswith("resumed from: ") for x in sam.logs(j["id"])) == 2,
    )
    plan = slurm_cluster.root / "shared" / "console" / "jobs" / str(job["id"]) / "attempt-0"
    wrappers = [
        p
        for p in map(psutil.Process, processes_of(plan))
        if "workers.slurmstep" in p.cmdline() and _environ(p).get("SLURM_PROCID") == "1"
    ]
    assert len(wrappers) == 1, wrappers
    frozen = [wrappers[0], *wrappers[0].children(recursive=True)]
    for process in frozen:
        process.suspend()
    try:
        silent = sam.wait(job["id"], lambda j: "not heard from" in j["reason"])
        assert silent["attempt"] == 0 and "worker-1 (on n2)" in silent["reason"], silent
        restarted = sam.wait(job["id"], lambda j: j["attempt"] == 1)
        lost = restarted["attempts"][0]["reason"]
        assert f"not heard from for {LOST_SECONDS} s" in lost and "n2" in lost, lost
        # Slurm never said so: its node is up, and slurmd answers.
        node = slurm_cluster.command(["scontrol", "show", "node", "n2"]).stdout
        assert "DOWN" not in node and "NOT_RESPONDING" not in node, node
    finally:
        for process in frozen:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.resume()
    sam.wait(job["id"], lambda j: j["state"] == "running")
    release.touch()
    done = sam.wait_finished(job["id"])
    assert done["state"] == "succeeded", done["reason"]
    assert done["restarts_used"] == 1
    second = [x["text"] for x in sam.logs(job["id"]) if x["attempt"] == 1]
    resumed = [t for t in second if t.startswith("resumed from: ")]
    assert len(resumed) == 2 and "resumed from: nothing" not in resumed, second


def test_a_slurm_controller_outage_fails_no_job(
    slurm_cluster: slurm.SlurmCluster, sam: StackClient
) -> None:
    """slurmctld away: a running job runs on (squeue's "errors" are not an empty queue), a job
    submitted meanwhile is admitted and waits, saying why; with Slurm back both finish."""
    release = signal_file("outage")
    holder = sam.submit(
        slurm_request("hold.py", 1, package="cpu-1", args=["--release", str(release)])
    )
    # Its trainer running, not only its Slurm job: the batch script's srun needs slurmctld to
    # make its step, and fails (Slurm's own behaviour) if the outage comes before that.
    sam.wait(holder["id"], lambda j: any("pid=" in x["text"] for x in sam.logs(j["id"])))
    slurm_cluster.stop_controller()
    try:
        response = sam.http.post(
            "/api/v1/jobs",
            json=slurm_request("numbered.py", 1, package="cpu-1", args=["--lines", "3"]),
        )
        assert response.status_code == 201, response.text
        waiter = response.json()
        waiting = sam.wait(waiter["id"], lambda j: "cannot be reached now" in j["reason"])
        assert waiting["state"] == "queued", waiting
        assert waiting["reason"].startswith("waiting: Slurm (slurm-test) cannot be reached now")
        # A pass or more has run without Slurm meanwhile: the running job is as it was.
        assert sam.job(holder["id"])["state"] == "running"
    finally:
        slurm_cluster.start_controller()
    release.touch()
    for job in (holder, waiter):
        done = sam.wait_finished(job["id"])
        assert done["state"] == "succeeded", done["reason"]


def test_the_pools_check_runs_a_test_job_and_names_what_fails(
    slurm_cluster: slurm.SlurmCluster, slurm_stack: RunningStack
) -> None:
    """`slurm_pool --check` asked sinfo only, and passed a pool whose nodes could not reach
    Redis. It runs a test job now, and says what it found on the node."""

    def check(name: str, redis_host: str, code_root: Path = FIXTURE_CODE) -> str:
        return slurm_stack.stack.manage(
            "slurm_pool", name,
            "--partition", slurm_cluster.partition,
            "--shared-root", str(slurm_cluster.root / "shared" / name),
            "--python", sys.executable,
            "--code-root", str(code_root),
            "--slurm-conf", str(slurm_cluster.conf),
            "--redis-host", redis_host,
            "--check",
        )  # fmt: skip

    said = check("checked", slurm_cluster.controller_address).splitlines()
    assert [line[:4] for line in said[:-1]] == ["ok  "] * 6, said
    assert said[-1] == "Added Slurm pool checked (partition trainyard)", said
    assert any(
        re.match(r"^ok   the console's Redis answers at [\d.]+:\d+ from n\d$", x) for x in said
    )
    with pytest.raises(RuntimeError) as refused:
        check("unchecked", "nowhere.invalid", code_root=Path("/nonexistent-code"))
    words = str(refused.value)
    assert re.search(
        r"the pool's check failed: the code root /nonexistent-code is not there on n\d; the "
        r"console's Redis cannot be reached at nowhere\.invalid:\d+ from n\d: ConnectionError",
        words,
    ), words
    assert "--redis-also-on" in words, words


UNIX_USER = "alice"


def unix_user(name: str) -> pwd.struct_passwd:
    """A person's Unix account on this machine (the console host and the nodes alike), made
    once where missing: a login-less account, as a site's directory would give."""
    try:
        return pwd.getpwnam(name)
    except KeyError:
        pass
    useradd = shutil.which("useradd")
    required_here("the run-as-owner Slurm test", None if useradd else "no useradd here")
    assert useradd is not None
    subprocess.run([useradd, "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True)
    return pwd.getpwnam(name)


def test_a_job_runs_as_its_owners_unix_account_with_their_slurm_account(
    slurm_cluster: slurm.SlurmCluster, slurm_stack: RunningStack
) -> None:
    """A pool on a partition with DisableRootJobs=YES, whose jobs run as their owners: a job of
    console user alice is Slurm's job of Unix user alice, with her Slurm account and the job's
    time limit; its lines reach the log as on any pool. A console user with no Unix account is
    told so at submission; the same partition refuses the console's own (root's) jobs."""
    entry = unix_user(UNIX_USER)
    # Slurm's accounting as a site keeps it: her account, her association in it.
    required_here("Slurm's accounting (slurmdbd)", slurm_cluster.accounting_off or None)
    assert slurm_cluster.accounting is not None
    slurm_cluster.accounting.manage(slurm_cluster.env(), "add", "account", "vision")
    slurm_cluster.accounting.manage(slurm_cluster.env(), "add", "user", UNIX_USER, "account=vision")
    try:
        python = slurm.python_for_everyone()
    except slurm.SlurmUnavailable as exc:
        required_here("the run-as-owner Slurm test", str(exc))
    alice = slurm_stack.create_user(
        "alice", "alice-password-1", {"cpu": 8, "gpus": 0, "memory_gb": 32, "running_jobs": 2}
    )
    nobody = slurm_stack.create_user(
        "mapless", "mapless-password-1", {"cpu": 8, "gpus": 0, "memory_gb": 32, "running_jobs": 2}
    )
    slurm_stack.stack.manage(
        "shell", "-c",
        "from django.contrib.auth.models import User; from jobs.models import UnixAccount; "
        "UnixAccount.objects.create(user=User.objects.get(username='alice'), "
        f"username={UNIX_USER!r}, slurm_account='vision')",
    )  # fmt: skip
    for name, as_owner in (("slurm-people", ("--run-as-owner",)), ("slurm-root", ())):
        slurm_stack.stack.manage(
            "slurm_pool", name,
            "--partition", slurm.USERS_PARTITION,
            "--shared-root", str(slurm_cluster.root / "shared" / name),
            "--python", python,
            "--code-root", str(FIXTURE_CODE),
            "--slurm-conf", str(slurm_cluster.conf),
            "--redis-host", slurm_cluster.controller_address,
            *as_owner, "--all-images", "--all-packages",
        )  # fmt: skip
    release = signal_file("as-alice")

    def request(pool: str, script: str = "hold.py") -> dict[str, Any]:
        return {
            **slurm_request(script, 2, package="cpu-1", args=["--release", str(release)]),
            "pool": pool,
            "time_limit": "10m",
        }

    refused = nobody.http.post("/api/v1/jobs", json=request("slurm-people"))
    assert refused.status_code == 400, refused.text
    assert "mapless has no Unix account for this pool" in refused.text, refused.text

    job = alice.submit(request("slurm-people"))
    alice.wait(
        job["id"], lambda j: len({(x["role"], x["index"]) for x in alice.logs(j["id"])}) == 2
    )
    slurm_id = slurm_id_of(slurm_cluster, job["id"])
    shown = slurm_cluster.command(["scontrol", "show", "job", slurm_id]).stdout
    assert f"UserId={UNIX_USER}({entry.pw_uid})" in shown, shown
    assert f"GroupId={grp.getgrgid(entry.pw_gid).gr_name}({entry.pw_gid})" in shown, shown
    assert "Account=vision" in shown, shown
    assert re.search(r"TimeLimit=00:1[01]:00", shown), shown
    # Its trainers are alice's processes.
    # (A process that ends between the listing and the look is not one to count.)
    owners = set()
    for process in psutil.process_iter():
        if _environ(process).get("TRAINYARD_JOB_ID") == str(job["id"]):
            with contextlib.suppress(psutil.NoSuchProcess):
                owners.add(process.uids().real)
    assert owners == {entry.pw_uid}, owners
    release.touch()
    done = alice.wait_finished(job["id"])
    assert done["state"] == "succeeded", done["reason"]
    # Slurm's accounting has the person, and the attempt has what it recorded.
    accounted = slurm_cluster.command(
        ["sacct", "--jobs", slurm_id, "--allocations", "--noheader", "--parsable2",
         "--format=User,Account,State"]
    ).stdout.split()  # fmt: skip
    assert accounted == [f"{UNIX_USER}|vision|COMPLETED"], accounted
    record = done["attempts"][0]["slurm"]
    assert record["state"] == "COMPLETED" and record["exit_code"] == "0:0", record
    assert record["start"] and record["end"] and record["max_rss_mb"] is not None, record
    if slurm_cluster.cgroups:  # jobacct_gather/cgroup measures the steps
        assert record["max_rss_mb"] > 0, record
    assert done["attempts"][0]["started"].startswith(record["start"][:16]), done["attempts"]

    # The console's own user is root here: that partition refuses its jobs.
    as_root = alice.submit(request("slurm-root", "numbered.py"))
    ended = alice.wait_finished(as_root["id"])
    assert ended["state"] == "failed", ended
    assert "Slurm did not take it" in ended["reason"], ended["reason"]


def directory_person_on_the_nodes(name: str, uid: int, groups: dict[str, int]) -> None:
    """The person as the cluster's nodes know them through sssd: an account of the directory's
    numbers (uid, a primary group of the same number) in the directory's groups; made here
    with useradd and groupadd where missing, refused where the numbers are someone else's."""
    for tool in ("useradd", "groupadd"):
        required_here("the directory Slurm test", None if shutil.which(tool) else f"no {tool}")
    for group, gid in {name: uid, **groups}.items():
        try:
            found = grp.getgrgid(gid)
        except KeyError:
            subprocess.run(["groupadd", "--gid", str(gid), group], check=True)
            continue
        assert found.gr_name == group, f"gid {gid} is {found.gr_name} here, not {group}"
    try:
        entry = pwd.getpwuid(uid)
    except KeyError:
        subprocess.run(
            ["useradd", "--uid", str(uid), "--gid", str(uid), "--groups", ",".join(groups),
             "--no-create-home", "--shell", "/usr/sbin/nologin", name],
            check=True,
        )  # fmt: skip
        return
    assert entry.pw_name == name, f"uid {uid} is {entry.pw_name} here, not {name}"


def test_a_directory_persons_slurm_job_runs_as_them_and_reads_the_teams_data(
    slurm_cluster: slurm.SlurmCluster,
    slurm_stack: RunningStack,
    directory: Any,
    team_tree: TeamTree,
) -> None:
    """ada signs in through the directory (slapd): on a pool that runs jobs as their owners,
    Slurm runs her job as her, uid 20001, with her group vision, so it reads the team's data
    set (root:vision, 0750) and what it writes into her results folder is hers."""
    directory_person_on_the_nodes("ada", ADA.uid, {"trainyard-users": 30000, "vision": VISION})
    if slurm_cluster.accounting is not None:
        # Her association, as a site's admin makes it (an account of her own: the test above
        # made `vision` already).
        slurm_cluster.accounting.manage(slurm_cluster.env(), "add", "account", "ada-team")
        slurm_cluster.accounting.manage(
            slurm_cluster.env(), "add", "user", "ada", "account=ada-team"
        )
    try:
        python = slurm.python_for_everyone()
    except slurm.SlurmUnavailable as exc:
        required_here("the directory Slurm test", str(exc))
    ada = sign_in_through_directory(slurm_stack, directory, "ada", "ada-directory-pw")
    slurm_stack.stack.manage(
        "slurm_pool", "slurm-directory",
        "--partition", slurm.USERS_PARTITION,
        "--shared-root", str(slurm_cluster.root / "shared" / "slurm-directory"),
        "--python", python,
        "--code-root", str(FIXTURE_CODE),
        "--slurm-conf", str(slurm_cluster.conf),
        "--redis-host", slurm_cluster.controller_address,
        "--run-as-owner", "--all-images", "--all-packages",
    )  # fmt: skip
    args = ["--data", str(team_tree.vision), "--results", str(team_tree.results)]
    job = ada.submit({
        **slurm_request("team_data.py", 1, package="cpu-1", args=args),
        "pool": "slurm-directory", "time_limit": "10m",
        "data": [str(team_tree.vision)], "results": str(team_tree.results),
    })  # fmt: skip
    assert job["run_as"] == {"uid": 20001, "gid": 20001, "groups": [20001, 30000, VISION]}
    done = ada.wait_finished(job["id"])
    lines = [line["text"] for line in ada.logs(job["id"])]
    assert done["state"] == "succeeded", (done["reason"], lines)
    # The step's sandbox is a user namespace of hers, where groups it does not map show as
    # the overflow gid; the kernel still grants what they grant: she reads vision's files.
    identity = next(line for line in lines if line.startswith("identity "))
    assert identity.startswith("identity uid=20001 gid=20001 groups="), identity
    assert "first sample says: a cat" in lines
    assert "data writable: no (Read-only file system)" in lines
    result = team_tree.results / "result-0.txt"
    assert (result.stat().st_uid, result.stat().st_gid) == ADA.ids
    record = done["attempts"][0]["slurm"]
    assert record["state"] == "COMPLETED", record


def test_where_sbatch_takes_no_uid_it_runs_as_the_person(
    slurm_cluster: slurm.SlurmCluster,
    target: slurm_client.SlurmTarget,
    catalog: None,
    alice: User,
    settings: Any,
) -> None:
    """Slurm's releases after 22.05 dropped sbatch's --uid/--gid. There the console runs sbatch
    itself as the person (their uid, gid and groups): the job is theirs in Slurm as with
    --uid, on a partition that refuses root's jobs, and its instances run as them."""
    entry = unix_user(UNIX_USER)
    try:
        python = slurm.python_for_everyone()
    except slurm.SlurmUnavailable as exc:
        required_here("the run-as-owner Slurm test", str(exc))
    settings.TRAINYARD_SLURM_SUBMIT_AS = "person"
    UnixAccount.objects.create(user=alice, username=UNIX_USER)
    people = dataclasses.replace(
        target, partition=slurm.USERS_PARTITION, python=python, run_as_owner=True
    )
    job = make_job(
        alice, "pytorch:2.13-cpu", {"path": "numbered.py"}, ["--lines", "5"],
        {"master": ("cpu-1", 1), "worker": ("cpu-1", 1)},
    )  # fmt: skip
    job.time_limit = 600
    job.save(update_fields=["time_limit"])
    # Would Slurm 22.05 take it the other way, the command line says this is not that way.
    assert not any(a.startswith("--uid") for a in slurm_batch.sbatch_argv(
        job, people, slurm_batch.attempt_folder(people, job) / "batch.py",
        slurm_identity.identity_of(alice),
    ))  # fmt: skip
    slurm_id = slurm_batch.submit(job, people)
    shown = slurm_cluster.command(["scontrol", "show", "job", slurm_id], check=False).stdout
    assert not shown or f"UserId={UNIX_USER}({entry.pw_uid})" in shown, shown
    wait_until_gone(slurm_cluster, slurm_id)
    ended = outcomes(people, job, ["master", "worker-1"])
    assert {o["state"] for o in ended.values()} == {"succeeded"}, ended
    # Slurm's output file is the person's: sbatch made it as them.
    output = slurm_batch.attempt_folder(people, job) / f"slurm-{slurm_id}.out"
    assert output.stat().st_uid == entry.pw_uid
    assert any(
        line.startswith("[worker-1] worker-1 4") for line in output_of(people, job, slurm_id)
    )


def test_a_job_chooses_its_partition_qos_and_whole_nodes_within_what_its_pool_allows(
    slurm_cluster: slurm.SlurmCluster, slurm_stack: RunningStack, sam: StackClient
) -> None:
    """A pool of two partitions (all three nodes, and the first node alone) whose admin lets a
    job choose its QOS among two and ask for whole nodes: a choice outside that is refused
    saying what is allowed; a job too large for the partition it chose is refused naming that
    partition's limit, while the same job sent to the pool's whole list is admitted; a job's
    choices are what Slurm runs it with."""
    required_here("Slurm's accounting (slurmdbd)", slurm_cluster.accounting_off or None)
    assert slurm_cluster.accounting is not None
    slurm_cluster.accounting.manage(slurm_cluster.env(), "add", "qos", "high")
    pool = "slurm-choices"
    slurm_stack.stack.manage(
        "slurm_pool", pool,
        "--partition", f"{slurm.PARTITION},{slurm.FIRST_NODE_PARTITION}",
        "--shared-root", str(slurm_cluster.root / "shared" / pool),
        "--python", sys.executable,
        "--code-root", str(FIXTURE_CODE),
        "--slurm-conf", str(slurm_cluster.conf),
        "--redis-host", slurm_cluster.controller_address,
        "--job-qos", "normal high", "--job-exclusive", "--all-images", "--all-packages",
    )  # fmt: skip
    pools = {p["name"]: p for p in sam.http.get("/api/v1/catalog").json()["pools"]}
    assert pools[pool]["choices"] == {
        "partition": [slurm.PARTITION, slurm.FIRST_NODE_PARTITION],
        "account": [],
        "qos": ["normal", "high"],
        "constraint": [],
        "reservation": [],
        "exclusive": True,
    }
    release = signal_file("chosen")

    def request(instances: int, **slurm_options: object) -> dict[str, Any]:
        return slurm_request(
            "hold.py", instances, "cpu-1", ["--release", str(release)],
            pool=pool, slurm=slurm_options,
        )  # fmt: skip

    refused = sam.http.post("/api/v1/jobs", json=request(2, qos="urgent"))
    assert refused.status_code == 400, refused.text
    assert "does not let a job choose qos 'urgent'; it allows normal, high" in refused.text

    # Three instances of a core each: more than the first node's two cores.
    too_big = sam.http.post("/api/v1/jobs", json=request(3, partition=slurm.FIRST_NODE_PARTITION))
    assert too_big.status_code == 400, too_big.text
    assert f"Slurm's partition '{slurm.FIRST_NODE_PARTITION}'" in too_big.text, too_big.text
    anywhere = sam.submit(request(3))
    assert anywhere["slurm"] == {}
    assert sam.http.post(f"/api/v1/jobs/{anywhere['id']}/cancel").status_code == 200
    assert sam.wait_finished(anywhere["id"])["state"] == "cancelled"

    job = sam.submit(request(2, partition=slurm.FIRST_NODE_PARTITION, qos="high", exclusive=True))
    assert job["slurm"] == {
        "partition": slurm.FIRST_NODE_PARTITION, "qos": "high", "exclusive": True
    }  # fmt: skip
    sam.wait(job["id"], lambda j: len({(x["role"], x["index"]) for x in sam.logs(j["id"])}) == 2)
    shown = slurm_cluster.command(
        ["scontrol", "show", "job", slurm_id_of(slurm_cluster, job["id"])]
    )
    assert f"Partition={slurm.FIRST_NODE_PARTITION}" in shown.stdout, shown.stdout
    assert "QOS=high" in shown.stdout, shown.stdout
    assert "OverSubscribe=NO" in shown.stdout, shown.stdout
    assert f"NodeList={slurm_cluster.nodes[0].name}" in shown.stdout, shown.stdout
    release.touch()
    done = sam.wait_finished(job["id"])
    assert done["state"] == "succeeded", done["reason"]
    page = page_for(slurm_stack, "sam", "sam-password-1", f"/jobs/{job['id']}/")
    assert "--qos=high" in page and "--exclusive" in page, page


def test_a_pool_whose_nodes_cannot_reach_redis_says_so_and_never_ends_silent(
    slurm_cluster: slurm.SlurmCluster, slurm_stack: RunningStack, sam: StackClient
) -> None:
    """A pool connected with a Redis host its nodes cannot reach: the job ran, its lines went
    to the wrappers' spools, and it "succeeded" with an empty log and nothing said. The page
    now says so while it runs, and the ended job's reason says what its log lacks and where
    the lines are."""
    slurm_stack.stack.manage(
        "slurm_pool", "slurm-blind",
        "--partition", slurm_cluster.partition,
        "--shared-root", str(slurm_cluster.root / "shared" / "blind"),
        "--python", sys.executable,
        "--code-root", str(FIXTURE_CODE),
        "--slurm-conf", str(slurm_cluster.conf),
        "--redis-host", "nowhere.invalid",
        "--all-images", "--all-packages",
    )  # fmt: skip
    release = signal_file("blind")
    request = {
        **slurm_request("hold.py", 1, package="cpu-1", args=["--release", str(release)]),
        "pool": "slurm-blind",
    }
    job = sam.submit(request)
    running = sam.wait(job["id"], lambda j: j["reason"].startswith("running, but its lines"))
    assert running["state"] == "running", running
    assert "master cannot reach Redis at nowhere.invalid:" in running["reason"], running
    release.touch()
    done = sam.wait_finished(job["id"])
    assert done["state"] == "succeeded", done
    assert re.match(
        r"^its log is incomplete: lines of master never reached Redis at nowhere\.invalid:\d+ "
        r"from the Slurm nodes; they are in /\S+/\.spool-master ",
        done["reason"],
    ), done["reason"]


def resume(cluster: slurm.SlurmCluster, node: str) -> None:
    """Back in service. slurmctld may have done it already (a node set down whose slurmd then
    registers again is idle once more), and then refuses the resume: that is not a failure."""
    done = cluster.command(["scontrol", "update", f"nodename={node}", "state=resume"], check=False)
    if done.returncode != 0:
        state = cluster.command(["sinfo", "--noheader", "--nodes", node, "--format", "%t"]).stdout
        assert not state.strip().startswith(("down", "drain")), (node, state, done.stderr)


def test_a_down_or_drained_node_never_refuses_a_job_that_fits(
    slurm_cluster: slurm.SlurmCluster, sam: StackClient
) -> None:
    """A job needing all three nodes while n2 is drained and n3 is down: sbatch --test-only
    called it "never" and admission refused it; it fits the partition, so it waits and runs
    once the nodes are back."""

    def update(node: str, *state: str) -> None:
        slurm_cluster.command(["scontrol", "update", f"nodename={node}", *state])

    update("n2", "state=drain", "reason=maintenance")
    update("n3", "state=down", "reason=test")
    try:
        response = sam.http.post(
            "/api/v1/jobs", json=slurm_request("numbered.py", 3, args=["--lines", "3"])
        )
        assert response.status_code == 201, response.text
        job = response.json()
        waiting = sam.wait(job["id"], lambda j: "in Slurm" in j["reason"])
        assert waiting["state"] == "queued", waiting
    finally:
        for node in ("n2", "n3"):
            resume(slurm_cluster, node)
    done = sam.wait_finished(job["id"])
    assert done["state"] == "succeeded", done["reason"]


def test_a_time_limit_counts_from_slurms_start_not_from_its_queue(
    slurm_cluster: slurm.SlurmCluster, sam: StackClient
) -> None:
    """A job with a 15-second limit that waits longer than that in Slurm's queue is not failed
    for it: the clock starts when Slurm starts the job. Slurm gets the limit too (--time, in
    whole minutes, with the console's grace after it)."""
    release = signal_file("time-holder")
    holder = sam.submit(slurm_request("hold.py", 3, args=["--release", str(release)]))
    sam.wait(holder["id"], lambda j: j["state"] == "running")
    waiter = sam.submit(
        slurm_request("numbered.py", 1, package="cpu-1", args=["--lines", "3"], time_limit=15)
    )
    queued_at = time.monotonic()
    sam.wait(
        waiter["id"], lambda j: "Slurm" in j["reason"] and "to be submitted" not in j["reason"]
    )
    shown = slurm_cluster.command(
        ["scontrol", "show", "job", slurm_id_of(slurm_cluster, waiter["id"])]
    )
    assert re.search(r"TimeLimit=00:0[1-9]:00", shown.stdout), shown.stdout
    # Past its limit, and a reconciliation pass later, in Slurm's queue all along.
    waited = sam.wait(waiter["id"], lambda j: time.monotonic() - queued_at > 25)
    assert waited["state"] == "queued", waited
    release.touch()
    assert sam.wait_finished(holder["id"])["state"] == "succeeded"
    done = sam.wait_finished(waiter["id"])
    assert done["state"] == "succeeded", done["reason"]


@pytest.mark.browser
def test_a_job_launched_on_the_slurm_pool_from_the_form_streams_its_log_live(
    slurm_stack: RunningStack, sam: StackClient
) -> None:
    from playwright.sync_api import expect, sync_playwright

    from tests.browser.conftest import CHROMIUM, CHROMIUM_ARGS, keep_screenshot, logged_in_page

    # Closed before the test ends: Django refuses database calls from a thread in which
    # Playwright's event loop runs, and the other tests here use the database.
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
        )
        with logged_in_page(browser, slurm_stack.url, "sam", "sam-password-1") as page:
            page.goto(f"{slurm_stack.url}/jobs/new/")
            page.fill("#id_name", "digits on slurm")
            page.select_option("#id_script", "digits-ddp")
            page.fill("#id_args", "--epochs 6")
            page.select_option("#id_package", "cpu-2")
            page.fill("#id_instances", "3")
            page.select_option("#id_pool", POOL)
            page.click("#launch")
            page.wait_for_url(re.compile(r"/jobs/\d+/$"))
            expect(page.locator("#job-pool")).to_contain_text(f"Slurm pool {POOL}")
            log = page.locator("#log")
            # Live: the first lines are drawn while the job still runs.
            expect(log.locator(".line[data-tag=worker-2]").first).to_be_visible()
            assert page.locator("#job-state").inner_text() in ("queued", "running")
            expect(log.locator(".line[data-tag=master]").first).to_be_visible()
            expect(page.locator("#job-state")).to_have_text("succeeded")
            expect(page.locator("#log-status")).to_contain_text("log complete")
            # The Slurm job's id came while the page was open, without a reload.
            job_id = int(page.url.rstrip("/").rsplit("/", 1)[1])
            slurm_ids = [a["slurm_job_id"] for a in sam.job(job_id)["attempts"]]
            assert len(slurm_ids) == 1 and slurm_ids[0], slurm_ids
            expect(page.locator("#slurm-jobs")).to_have_text(f" · Slurm job {slurm_ids[0]}")
            keep_screenshot(page, "slurm-job")
        browser.close()


def test_a_job_from_a_code_snapshot_runs_the_uploaded_files_on_slurm(
    sam: StackClient, tmp_path: Path
) -> None:
    (tmp_path / "train.py").write_text(
        "import os\nprint('snapshot code on', os.environ['TRAINYARD_ROLE'], flush=True)\n"
    )
    sha = sam.upload(tmp_path, "slurm-code")
    request = slurm_request("train.py", 2, package="cpu-1")
    request["program"]["snapshot"] = sha
    done = sam.wait_finished(sam.submit(request)["id"])
    assert done["state"] == "succeeded", done["reason"]
    said = sorted(x["text"] for x in sam.logs(done["id"]) if x["text"].startswith("snapshot"))
    assert said == ["snapshot code on master", "snapshot code on worker"]


def test_a_job_on_slurm_reaches_nothing_beyond_itself(
    slurm_cluster: slurm.SlurmCluster, slurm_stack: RunningStack, tmp_path: Path
) -> None:
    """escape.py as an ordinary user's Slurm job, while another user's Slurm job runs: the
    console's files, the other job's plan, Redis credentials, code, instance and checkpoint
    folders, and Redis itself, are all out of its reach; its own folders work."""
    quota = {"cpu": 8, "gpus": 0, "memory_gb": 32, "running_jobs": 4}
    mallory = slurm_stack.create_user("mallory-on-slurm", "mallory-pw", quota)
    victim = slurm_stack.create_user("victim-on-slurm", "victim-pw", quota)
    code = tmp_path / "victim-code"
    code.mkdir()
    (code / "secret_model.py").write_text((FIXTURE_CODE / "checkpointer.py").read_text())
    sha = victim.upload(code, "victim's model")
    hold = signal_file("victim")
    theirs = victim.submit(
        {
            **slurm_request("secret_model.py", 1, package="cpu-1", args=["--hold", str(hold)]),
            "program": {
                "snapshot": sha,
                "script": "secret_model.py",
                "args": ["--hold", str(hold)],
            },
        }
    )
    try:
        victim.wait(theirs["id"], lambda j: any(x["text"] == "ready" for x in victim.logs(j["id"])))
        shared = slurm_cluster.root / "shared" / "console"
        attempt = shared / "jobs" / str(theirs["id"]) / "attempt-0"
        var = slurm_stack.stack.var_dir
        targets = [
            *(
                p
                for p in (var / "trainyard.sqlite3", var / "secret_key", var / "redis")
                if p.exists()
            ),
            attempt / "plan.json",
            attempt / "credentials.url",
            attempt / "master",
            shared / "code" / sha,
            *sorted((shared / "checkpoints").iterdir()),
        ]
        assert all(p.exists() for p in targets), targets
        redis = urlsplit(slurm_stack.stack.redis_url)
        job = mallory.submit(
            slurm_request(
                "escape.py", 1, package="cpu-1",
                args=[
                    "--paths", *map(str, targets),
                    "--redis", f"{slurm_cluster.controller_address}:{redis.port}",
                    "--queue", "node.node-1",
                ],
            )
        )  # fmt: skip
        done = mallory.wait_finished(job["id"])
        assert done["state"] == "succeeded", done["reason"]
        verdicts = escape_verdicts(x["text"] for x in mallory.logs(job["id"]))
    finally:
        hold.touch()
    assert victim.wait_finished(theirs["id"])["state"] == "succeeded"
    for path in targets:
        assert verdicts.get(f"path:{path}", "").startswith("BLOCKED"), (path, verdicts)
    opened = {k: v for k, v in verdicts.items() if v.startswith("OPEN")}
    assert not opened, opened
    for own in ("write:TRAINYARD_CHECKPOINT_DIR", "write:TRAINYARD_SCRATCH_DIR", "read:own-script"):
        assert verdicts.get(own, "").startswith("OK"), (own, verdicts)
    assert len(verdicts) >= 12, verdicts


# The console's own variables (stack/run.py's Stack.env, as a deployment sets them): none may
# reach a Slurm job, by name or by value.
CONSOLE_NAMES = (
    "REDIS_URL",
    "TRAINYARD_HEALTHZ_TOKEN",
    "DJANGO_SETTINGS_MODULE",
    "TRAINYARD_VAR_DIR",
)
# What slurmd sets in a step beside SLURM_* and the exported names.
SET_BY_SLURMD = ("TMPDIR",)


def slurm_id_of(cluster: slurm.SlurmCluster, job_id: int) -> str:
    name = f"{slurm_batch.JOB_NAME_PREFIX}{job_id}"
    ids = cluster.command(["squeue", "-h", f"--name={name}", "--format=%A"]).stdout.split()
    assert len(ids) == 1, ids
    return ids[0]


def job_processes(cluster: slurm.SlurmCluster, slurm_id: str) -> dict[int, str]:
    """Every process of one Slurm job on every node, with its step ("batch", "0", …), as the
    job's own slurmstepds list them (scontrol listpids): asked of Slurm, not looked for among
    the machine's processes, where other clusters and stacks may run beside this one."""
    found = {}
    for node in cluster.nodes:
        listed = cluster.command(["scontrol", "listpids", slurm_id, node.name], check=False)
        for line in listed.stdout.splitlines()[1:]:
            pid, job, step, *_ = [*line.split(), "", "", ""]
            if pid.isdigit() and job == slurm_id:
                found[int(pid)] = step
    return found


def environ_of(pid: int) -> list[bytes]:
    """A process's environment as it was started ("NAME=value" entries); [] once it ended."""
    try:
        return [e for e in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") if e]
    except (FileNotFoundError, ProcessLookupError):
        return []


def environment_leaks(where: str, environ: bytes, secrets: dict[str, str]) -> list[str]:
    """What of the console's is in one NUL-separated environment (a saved job's, a process's):
    the names of its variables and the values of its secrets."""
    entries = environ.split(b"\0")
    named = [n for n in CONSOLE_NAMES if any(e.startswith(n.encode() + b"=") for e in entries)]
    valued = [what for what, value in secrets.items() if value.encode() in environ]
    return [f"{where}: {what}" for what in named + valued]


def test_slurm_keeps_and_exports_none_of_the_consoles_secrets(
    slurm_cluster: slurm.SlurmCluster, slurm_stack: RunningStack, sam: StackClient
) -> None:
    """sbatch gives a job the environment it is run with: slurmctld keeps it in its saved
    state and every node's batch and step processes get it. The console worker that runs
    sbatch holds Redis's administrator URL and the health token; neither may be in there,
    and the batch script and the step wrappers get Slurm's variables and the exported ones
    alone."""
    console = slurm_stack.stack.env()
    secrets = {
        "Redis's administrator password": urlsplit(console["REDIS_URL"]).password or "",
        "the health token": console["TRAINYARD_HEALTHZ_TOKEN"],
    }
    assert all(secrets.values()), "the console has no secret to look for: the test proves nothing"
    release = signal_file("slurm-env")
    job = sam.submit(slurm_request("hold.py", 2, args=["--release", str(release)]))
    try:
        sam.wait(
            job["id"], lambda j: len({(x["role"], x["index"]) for x in sam.logs(j["id"])}) == 2
        )
        slurm_id = slurm_id_of(slurm_cluster, job["id"])
        # slurmctld's saved state: StateSaveLocation/hash.N/job.M/environment.
        saved = list((slurm_cluster.root / "state").glob(f"hash.*/job.{slurm_id}/environment"))
        assert len(saved) == 1, "slurmctld saved no environment for the job: nothing to read"
        leaks = environment_leaks("slurmctld's saved state", saved[0].read_bytes(), secrets)
        # The batch script (exec'd into srun), the step wrappers and their trainers.
        processes = job_processes(slurm_cluster, slurm_id)
        environments = {pid: environ_of(pid) for pid in processes}
        for pid, step in processes.items():
            environ = b"\0".join(environments[pid])
            leaks += environment_leaks(f"step {step}'s process {pid}", environ, secrets)
        assert not leaks, "\n".join(leaks)
        batch = [pid for pid, step in processes.items() if step == "batch"]
        wrappers = [pid for pid in processes if "workers.slurmstep" in _cmdline(pid)[:3]]
        assert batch and len(wrappers) >= 2, processes
        for pid in batch + wrappers:
            names = {e.split(b"=")[0].decode() for e in environments[pid]}
            extra = {
                name
                for name in names
                if not name.startswith("SLURM")
                and name not in slurm_client.STEP_NAMES + SET_BY_SLURMD
            }
            assert not extra, (pid, processes[pid], sorted(extra))
            assert "PATH" in names, (pid, processes[pid], sorted(names))
    finally:
        release.touch()
    assert sam.wait_finished(job["id"])["state"] == "succeeded"


def _cmdline(pid: int) -> list[str]:
    try:
        return psutil.Process(pid).cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return []
