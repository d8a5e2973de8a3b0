"""The Slurm backend's pure parts: Slurm's states in Trainyard's words, the sbatch command line
of a job, and the step wrapper's choice of instance, rendezvous and failure reason.
(tests/integration/test_slurm.py runs all of it on a real Slurm.)"""

import json
import os
import subprocess
import sys
import threading
from collections import deque
from decimal import Decimal
from pathlib import Path

import pytest
from django.contrib.auth.models import User

from jobs.models import FrameworkImage, Job, JobRole, Package
from jobs.services.slurm import slurm_batch, slurm_client, slurm_identity, slurm_states
from workers import launcher, slurmstep
from workers.spec import ReplicaSpec


def test_slurm_states_map_onto_trainyards() -> None:
    waiting = slurm_states.SlurmStatus("PENDING", "Resources", "")
    assert (waiting.state, waiting.words) == (Job.State.QUEUED, "waiting for free nodes in Slurm")
    odd = slurm_states.SlurmStatus("PENDING", "AssocMaxWallDurationPerJobLimit", "")
    assert odd.words == "waiting in Slurm: AssocMaxWallDurationPerJobLimit"
    lost = slurm_states.SlurmStatus("NODE_FAIL", "None", "n[1-3]")
    assert (lost.state, lost.words) == (
        Job.State.FAILED,
        "a Slurm node it ran on failed (NODE_FAIL)",
    )
    for state in ("TIMEOUT", "PREEMPTED", "OUT_OF_MEMORY"):
        assert slurm_states.SlurmStatus(state, "None", "").state == Job.State.FAILED
    assert slurm_states.SlurmStatus("COMPLETED", "None", "n1").words == ""
    assert slurm_states.SlurmStatus("SOMETHING_NEW", "None", "").state == Job.State.FAILED


def test_a_heterogeneous_job_is_as_far_as_its_least_advanced_component() -> None:
    parts: list[dict[str, object]] = [
        {"job_state": "RUNNING", "state_reason": "None", "nodes": "n1"},
        {"job_state": "PENDING", "state_reason": "Resources", "nodes": ""},
    ]
    assert slurm_states.combined(parts).slurm_state == "PENDING"
    parts[1] = {"job_state": "NODE_FAIL", "state_reason": "None", "nodes": "n2"}
    status = slurm_states.combined(parts)
    assert (status.slurm_state, status.nodes) == ("NODE_FAIL", "n1,n2")


@pytest.fixture
def ps_job(db: None, catalog: None, alice: User) -> Job:
    job = Job.objects.create(
        owner=alice, name="ps", image=FrameworkImage.objects.get(name="kvstore-ps:2.13"),
        program={"example": "digits-ps"}, args=["--epochs", "1; rm -rf /"], kvstore="dist_sync",
        cpu_total=1, gpus_total=0, memory_gb_total=1, price_per_hour=Decimal(0),
    )  # fmt: skip
    for role, package, instances in (
        ("worker", "cpu-2", 2),
        ("scheduler", "cpu-1", 1),
        ("server", "cpu-1", 2),
    ):
        JobRole.objects.create(
            job=job, role=role, package=Package.objects.get(name=package), instances=instances
        )
    return job


def test_a_parameter_server_job_is_one_component_per_role_in_rank_order(
    ps_job: Job, tmp_path: Path
) -> None:
    target = slurm_client.SlurmTarget("gpu", tmp_path, sys.executable, tmp_path)
    script = slurm_batch.write_batch_script(ps_job, target, slurm_batch.write_plan(ps_job, target))
    argv = slurm_batch.sbatch_argv(ps_job, target, script)
    assert argv[argv.index(f"--job-name=trainyard-{ps_job.pk}") + 1 :] == [
        "--partition=gpu",
        f"--output={script.parent / 'slurm-%j.out'}",
        f"--chdir={script.parent}",
        "--no-requeue",
        f"--export={target.exported()}",
        "--ntasks=1", "--cpus-per-task=1", "--mem-per-cpu=2048M", ":",
        "--ntasks=2", "--cpus-per-task=1", "--mem-per-cpu=2048M", ":",
        "--ntasks=2", "--cpus-per-task=2", "--mem-per-cpu=2048M",
        str(script),
    ]  # fmt: skip
    # The user's arguments travel in the plan, never on a command line; task N runs spec N.
    plan = json.loads((script.parent / "plan.json").read_text())
    assert [(s["role"], s["index"]) for s in plan["specs"]] == [
        ("scheduler", 0), ("server", 0), ("server", 1), ("worker", 0), ("worker", 1)
    ]  # fmt: skip
    assert plan["specs"][3]["args"] == ["--epochs", "1; rm -rf /"]
    assert "rm -rf" not in script.read_text()
    assert "--het-group=0,1,2" in script.read_text()


# The console worker's own variables, as a deployment gives them (docs/deploy.md).
CONSOLE_ENV = {
    "REDIS_URL": "redis://:console-admin-secret@127.0.0.1:6379/0",
    "TRAINYARD_HEALTHZ_TOKEN": "healthz-secret",
    "DJANGO_SETTINGS_MODULE": "console.settings",
    "DJANGO_SECRET_KEY": "django-secret",
    "TRAINYARD_VAR_DIR": "/var/lib/trainyard",
}


def test_slurm_gets_none_of_the_consoles_variables(
    ps_job: Job, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sbatch gives a job the environment it runs with (slurmctld saves it with the job, every
    node's batch and step processes get it): the console's Redis administrator URL and health
    token must not be in it, and the job exports only what its steps need."""
    for name, value in CONSOLE_ENV.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("PATH", "/usr/local/bin:/usr/bin:/bin")
    monkeypatch.setenv("LANG", "C.UTF-8")
    monkeypatch.setenv("HOME", "/home/trainyard")
    for unset in ("LC_ALL", "TZ", "TRAINYARD_SANDBOX_SHARED"):
        monkeypatch.delenv(unset, raising=False)
    target = slurm_client.SlurmTarget(
        "gpu", tmp_path, sys.executable, tmp_path, client_env={"SLURM_CONF": "/etc/slurm.conf"}
    )
    runs: list[tuple[list[str], dict[str, str]]] = []

    answers = {
        "partition": "PartitionName=gpu MaxNodes=UNLIMITED MaxTime=UNLIMITED Nodes=g[1-3]\n",
        "node": "".join(
            f"NodeName=g{i} CPUTot=8 RealMemory=64000 Gres=(null) State=IDLE Partitions=gpu\n"
            for i in (1, 2, 3)
        ),
    }

    def sbatch(argv: list[str], env: dict[str, str], **_: object) -> subprocess.CompletedProcess:
        runs.append((argv, env))
        said = answers[argv[3]] if argv[0] == "scontrol" else "4242;cluster\n"
        return subprocess.CompletedProcess(argv, 0, said, "")

    monkeypatch.setattr(slurm_client.subprocess, "run", sbatch)
    job_credentials = "redis://job-7:job-password@10.0.0.1:6379/0"
    assert slurm_batch.submit(ps_job, target, job_credentials) == "4242"
    # The partition and its nodes as configured (slurm_fit), then sbatch.
    assert [argv[:4] for argv, _ in runs] == [
        ["scontrol", "--oneliner", "show", "partition"],
        ["scontrol", "--oneliner", "show", "node"],
        ["sbatch", "--parsable", f"--job-name=trainyard-{ps_job.pk}", "--partition=gpu"],
    ]
    for argv, env in runs:
        assert env == {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "HOME": "/home/trainyard",
            "SLURM_CONF": "/etc/slurm.conf",
        }
        # Only what the steps need goes with the job: not HOME, not SLURM_CONF (SLURM_*
        # variables go anyway), nothing of the console's.
        assert argv[0] == "scontrol" or "--export=PATH,LANG" in argv, argv
        assert not [v for v in (*CONSOLE_ENV.values(), "job-password") if v in " ".join(argv)]
    # The job's own Redis user travels in a file of its owner's alone, not in the environment.
    credentials = slurm_batch.attempt_folder(target, ps_job) / "credentials.url"
    assert credentials.read_text().strip() == job_credentials
    assert credentials.stat().st_mode & 0o777 == 0o600


def test_the_batch_script_gives_srun_slurms_variables_and_the_exported_ones_alone(
    ps_job: Job, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """slurmd adds the job user's login environment to the batch script's (any sbatch
    --export but ALL does that); the script execs srun without it, and srun's --export keeps
    the steps to the exported names."""
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    seen = tmp_path / "srun-saw.json"
    fake_srun = fake_bin / "srun"
    fake_srun.write_text(
        f"#!{sys.executable}\n"
        "import json, os, sys\n"
        f"open({str(seen)!r}, 'w').write(json.dumps([sys.argv[1:], dict(os.environ)]))\n"
    )
    fake_srun.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake_bin}:/usr/bin:/bin")
    monkeypatch.setenv("LANG", "C.UTF-8")
    for unset in ("LC_ALL", "TZ", "TRAINYARD_SANDBOX_SHARED"):
        monkeypatch.delenv(unset, raising=False)
    target = slurm_client.SlurmTarget("gpu", tmp_path, sys.executable, tmp_path)
    script = slurm_batch.write_batch_script(ps_job, target, slurm_batch.write_plan(ps_job, target))
    batch_env = {
        # What sbatch sent, and what slurmd sets.
        "PATH": f"{fake_bin}:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "SLURM_JOB_ID": "4242",
        "SLURM_EXPORT_ENV": "PATH,LANG",
        "SLURMD_NODENAME": "n1",
        # The login environment slurmd loads (`su - <user>`), here with a leaked secret.
        "HOME": "/home/trainyard",
        "SHELL": "/bin/bash",
        "REDIS_URL": CONSOLE_ENV["REDIS_URL"],
    }
    subprocess.run([str(script)], env=batch_env, check=True, timeout=30)
    argv, env = json.loads(seen.read_text())
    assert argv[:4] == [
        "--kill-on-bad-exit=1",
        "--unbuffered",
        "--export=PATH,LANG",
        "--het-group=0,1,2",
    ]
    assert env == {
        "PATH": f"{fake_bin}:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "SLURM_JOB_ID": "4242",
        "SLURM_EXPORT_ENV": "PATH,LANG",
        "SLURMD_NODENAME": "n1",
    }


def test_the_step_wrapper_takes_the_spec_of_its_task_and_refuses_a_missing_one() -> None:
    plan: dict[str, object] = {"specs": [{"role": "master"}, {"role": "worker"}]}
    assert slurmstep.spec_for_task(plan, 1) == {"role": "worker"}
    with pytest.raises(slurmstep.StepError, match="no instance for Slurm task 2"):
        slurmstep.spec_for_task(plan, 2)


def test_the_rendezvous_file_is_read_whole_once_it_is_there(tmp_path: Path) -> None:
    with pytest.raises(slurmstep.StepError, match="did not publish its address"):
        slurmstep.wait_for_rendezvous(tmp_path, timeout=0)
    writer = threading.Thread(
        target=slurmstep.publish_rendezvous, args=(tmp_path, "10.0.0.1", 29500)
    )
    writer.start()
    assert slurmstep.wait_for_rendezvous(tmp_path, timeout=30) == ("10.0.0.1", 29500)
    writer.join()


def test_gpus_are_the_ones_slurm_made_visible() -> None:
    assert slurmstep.gpu_ids({"CUDA_VISIBLE_DEVICES": "2,3"}) == [2, 3]
    assert slurmstep.gpu_ids({}) == []


def test_a_failure_reason_prefers_what_the_process_recorded(tmp_path: Path) -> None:
    spec = ReplicaSpec(
        job_id=1, role="worker", index=1, node="n2", framework="pytorch",
        program={"example": "digits-ddp"}, args=[], master_addr="10.0.0.1",
        hosts_rendezvous=False, world_size=4, node_rank=1, rank_offset=2,
        local_world_size=2, cpus=2, gpus=0,
    )  # fmt: skip
    tails = {
        1: deque(["Traceback (most recent call last):", '  File "x.py", line 1', "KeyError: 'x'"])
    }
    assert (
        slurmstep.failure_reason(spec, tmp_path, [0, 1], tails, os.geteuid())
        == "KeyError: 'x' (exited with code 1)"
    )
    launcher.error_file(tmp_path, 1).write_text(
        json.dumps({"message": {"message": "ValueError: bad"}})
    )
    assert (
        slurmstep.failure_reason(spec, tmp_path, [0, 1], tails, os.geteuid())
        == "ValueError: bad (rank 3, exited with code 1)"
    )
    assert (
        slurmstep.failure_reason(spec, tmp_path, [-9, 0], {}, os.geteuid())
        == "killed by signal SIGKILL"
    )


def test_an_admin_adds_a_pool_from_the_command_line(
    db: None, catalog: None, tmp_path: Path
) -> None:
    from django.core.management import call_command
    from django.core.management.base import CommandError

    from jobs.models import SlurmPool

    call_command(
        "slurm_pool", "gpu", "--partition", "gpu", "--shared-root", str(tmp_path),
        "--python", "/opt/trainyard/bin/python", "--all-images", "--all-packages",
    )  # fmt: skip
    pool = SlurmPool.objects.get(name="gpu")
    assert pool.shared_root == str(tmp_path)
    assert pool.images.count() == FrameworkImage.objects.filter(enabled=True).count()
    assert pool.packages.count() == Package.objects.filter(enabled=True).count()
    with pytest.raises(CommandError, match="partition"):
        call_command(
            "slurm_pool", "bad", "--partition", "no/slash", "--shared-root", str(tmp_path),
            "--python", "python",
        )  # fmt: skip
    assert not SlurmPool.objects.filter(name="bad").exists()


def test_the_pass_reads_no_link_fifo_or_hard_link_a_job_plants_in_its_folder(
    tmp_path: Path,
) -> None:
    """On a pool whose jobs run as their owners, the attempt's folder is the person's: whoever
    holds that account may plant a FIFO (the pass would wait on it for ever), a link to a file
    only root reads, or a hard link, where the pass reads its wrappers' files."""
    import os

    from jobs.services.slurm import slurm_pass

    folder = tmp_path / "jobs" / "7" / "attempt-0"
    folder.mkdir(parents=True)
    secret = tmp_path / "root-only.json"
    secret.write_text('{"state": "succeeded", "reason": "read through a link"}')
    os.mkfifo(folder / "outcome-master.json")
    (folder / "where-master.json").symlink_to(secret)
    os.link(secret, folder / "redis-master.json")
    (folder / "outcome-worker-1.json").write_text('{"state": "failed", "reason": "its own"}')
    for name in ("outcome-master.json", "where-master.json", "redis-master.json"):
        assert slurm_pass._wrapper_file(folder / name) is None, name
    assert slurm_pass._wrapper_file(folder / "outcome-worker-1.json") == {
        "state": "failed",
        "reason": "its own",
    }


def test_the_console_writes_nothing_through_a_link_planted_in_an_attempts_folder(
    ps_job: Job, tmp_path: Path
) -> None:
    """A resubmitted attempt's folder may be the person's (a pool whose jobs run as their
    owners): a link they put where the console writes the plan, the batch script or the Redis
    credentials is replaced, never written through."""
    target = slurm_client.SlurmTarget("gpu", tmp_path, sys.executable, tmp_path)
    folder = slurm_batch.attempt_folder(target, ps_job)
    folder.mkdir(parents=True)
    victim = tmp_path / "root-only.conf"
    victim.write_text("untouched\n")
    names = ("plan.json", "batch.py", "credentials.url")
    for name in names:
        (folder / name).symlink_to(victim)
    plan = slurm_batch.write_plan(ps_job, target, "redis://job-7:secret@10.0.0.1:6379/0")
    script = slurm_batch.write_batch_script(ps_job, target, plan)
    assert victim.read_text() == "untouched\n"
    assert not any((folder / name).is_symlink() for name in names)
    assert script.stat().st_mode & 0o777 == 0o755
    assert plan.stat().st_mode & 0o777 == 0o600


def test_handing_an_attempt_over_to_its_owner_hands_over_nothing_the_job_put_there(
    ps_job: Job, tmp_path: Path
) -> None:
    """On a resubmission the attempt's folder holds what the job made as the person: a hard
    link there to another's file stays that file's owner's; only the folders and the files the
    console writes become the person's."""
    if os.geteuid() != 0:
        pytest.skip("handing files to another uid needs root (CI runs as root)")
    person = slurm_identity.Identity("alice", 54321, 54321, "")
    target = slurm_client.SlurmTarget("gpu", tmp_path, sys.executable, tmp_path, run_as_owner=True)
    folder = slurm_batch.attempt_folder(target, ps_job)
    folder.mkdir(parents=True)
    victim = tmp_path / "roots-own.conf"
    victim.write_text("root's\n")
    os.link(victim, folder / "planted")
    slurm_batch.hand_over(ps_job, target, person)
    plan = slurm_batch.write_plan(ps_job, target, "redis://job-7:secret@10.0.0.1:6379/0", person)
    script = slurm_batch.write_batch_script(ps_job, target, plan, person)
    assert (victim.stat().st_uid, victim.stat().st_gid) == (0, 0)
    for owned in (folder, slurm_batch.checkpoint_folder(target, ps_job), plan, script):
        assert (owned.stat().st_uid, owned.stat().st_gid) == (54321, 54321), owned
    assert (folder / "credentials.url").stat().st_uid == 54321
    assert folder.stat().st_mode & 0o777 == 0o700
