"""Images that are containers (workers/containers.py): the docker and podman command lines, and
the code around the supervisor's use of a runtime, through a stand-in runtime
(tests/fixtures/fake_container_runtime.py) that starts the command on the host the way docker
would start it in the container. The real engine runs in tests/integration/test_containers.py."""

import json
import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.conftest import FIXTURE_CODE_ROOT
from tests.unit.test_supervisor import Reports, spec, texts, wait_until
from workers import containers, contract, limits, unixids
from workers.cgroups import Request
from workers.containers import Mount
from workers.launcher import TRAINER_LIB, LocalProcess
from workers.logship import LogShipper
from workers.supervisor import Supervisor

FAKE_RUNTIME = Path(__file__).parent.parent / "fixtures" / "fake_container_runtime.py"


def process(**env: str) -> LocalProcess:
    base = {"PATH": "/host/venv/bin", "VIRTUAL_ENV": "/host/venv", "RANK": "3", **env}
    return LocalProcess(1, ["/host/venv/bin/python", "/code/train.py", "--lr", "$(id)"], base)


def test_docker_runs_the_script_on_the_host_network_with_the_instances_gpus(
    tmp_path: Path,
) -> None:
    argv = containers.run_argv(
        "/usr/bin/docker",
        "registry.example.com/train:2.13",
        "trainyard-7-a0-worker-1-1",
        "gpu-7",
        process(),
        Path("/code"),
        [Mount(Path("/code")), Mount(Path("/ck")), Mount(TRAINER_LIB, read_only=True)],
        tmp_path / "env-1",
        [2, 5],
        user=unixids.own_user(20001, 20001, [30001]),
        shared_ipc=True,
        agent=Path("/var/lib/trainyard/agent"),
    )
    assert argv == [
        "/usr/bin/docker", "run", "--rm", "--name", "trainyard-7-a0-worker-1-1",
        "--label", "trainyard.node=gpu-7", "--network", "host", "--ipc", "host", "--init",
        "--cap-drop", "ALL", "--security-opt", "no-new-privileges", "--read-only",
        "--tmpfs", "/tmp", "--env-file", str(tmp_path / "env-1"), "--workdir", "/code",
        "--label", "trainyard.workdir=/var/lib/trainyard/agent",
        "--user", "20001:20001", "--group-add", "30001",
        "--volume", "/code:/code", "--volume", "/ck:/ck",
        "--volume", f"{TRAINER_LIB}:{TRAINER_LIB}:ro",
        "--gpus", '"device=2,5"',
        "registry.example.com/train:2.13", "python", "/code/train.py", "--lr", "$(id)",
    ]  # fmt: skip


def test_podman_gets_each_gpu_by_its_cdi_name_and_removal_that_tolerates_absence(
    tmp_path: Path,
) -> None:
    argv = containers.run_argv(
        "/usr/bin/podman", "img", "n", "gpu-7", process(), Path("/code"), [], tmp_path / "e", [0, 1]
    )
    assert argv[argv.index("img") - 4 : argv.index("img")] == [
        "--device", "nvidia.com/gpu=0", "--device", "nvidia.com/gpu=1",
    ]  # fmt: skip
    assert containers.remove_argv("/usr/bin/podman", "n") == [
        "/usr/bin/podman", "rm", "--force", "--ignore", "n",
    ]  # fmt: skip
    assert containers.remove_argv("docker", "n") == ["docker", "rm", "--force", "n"]
    assert containers.image_exists_argv("/usr/bin/podman", "img") == [
        "/usr/bin/podman", "image", "exists", "img",
    ]  # fmt: skip
    assert containers.image_exists_argv("docker", "img") == [
        "docker", "image", "inspect", "--format", "{{.Id}}", "img",
    ]  # fmt: skip
    # Only this agent's: another console's agent on the host may call its node gpu-7 too.
    assert containers.leftovers_argv("docker", "gpu-7", Path("/var/a")) == [
        "docker", "ps", "--all", "--filter", "label=trainyard.node=gpu-7",
        "--filter", "label=trainyard.workdir=/var/a", "--format", "{{.Names}}",
    ]  # fmt: skip


def test_the_environment_goes_in_a_private_file_without_the_hosts_paths(tmp_path: Path) -> None:
    env = containers.container_env(process(CUDA_VISIBLE_DEVICES="2,5"), [2, 5], library=True)
    assert env == {
        "RANK": "3",
        "CUDA_VISIBLE_DEVICES": "0,1",  # as the runtime numbers the GPUs it passes
        "PYTHONPATH": "/opt/trainyard/lib",
    }
    path = tmp_path / "env"
    containers.write_env_file(path, env)
    assert path.read_text() == "CUDA_VISIBLE_DEVICES=0,1\nPYTHONPATH=/opt/trainyard/lib\nRANK=3\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    with pytest.raises(containers.ContainerError, match="BAD"):
        containers.write_env_file(path, {"BAD": "two\nlines"})


@pytest.mark.parametrize("planted", ["link", "fifo", "hard link"])
def test_the_env_file_is_made_anew_never_written_through_what_the_job_left(
    tmp_path: Path, planted: str
) -> None:
    """The instance folder is the job's to write: a link, FIFO or hard link at the env file's
    name is replaced, and what it pointed to is neither written nor blocked on."""
    outside = tmp_path / "root-only"
    outside.write_text("root's own\n")
    job = tmp_path / "instance"
    job.mkdir()
    path = job / "env-0"
    if planted == "link":
        path.symlink_to(outside)
    elif planted == "fifo":
        os.mkfifo(path)
    else:
        os.link(outside, path)
    containers.write_env_file(path, {"SEED": "7"})
    assert outside.read_text() == "root's own\n"
    assert path.read_text() == "SEED=7\n" and not path.is_symlink()
    assert path.stat().st_nlink == 1 and oct(path.stat().st_mode & 0o777) == "0o600"


def test_a_built_in_example_sees_the_workers_package_and_nothing_else_of_the_agent() -> None:
    script = containers.WORKERS_PACKAGE / "examples" / "digits_ps.py"
    mount, inside = containers.example_layout(script)
    assert mount.option() == f"{containers.WORKERS_PACKAGE}:/opt/trainyard/lib/workers:ro"
    assert inside == Path("/opt/trainyard/lib/workers/examples/digits_ps.py")


# --- the supervisor, through a stand-in runtime ---


@pytest.fixture
def client(redis_server: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_server, decode_responses=True)
    c.flushdb()
    yield c


def supervisor_with(
    client: redis.Redis, reports: Reports, tmp_path: Path, runtime: str | None
) -> tuple[Supervisor, LogShipper]:
    shipper = LogShipper(client, tmp_path / "spool")
    sup = Supervisor(
        "n1", client, shipper, reports, tmp_path / "work", FIXTURE_CODE_ROOT, gpus=2,
        container_runtime=containers.Runtime(runtime) if runtime else None,
    )  # fmt: skip
    return sup, shipper


def test_the_supervisor_runs_a_container_instance_and_removes_the_container_after(
    client: redis.Redis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime = tmp_path / "runtime"
    shutil.copy(FAKE_RUNTIME, runtime)
    log = tmp_path / "runtime.log"  # where that copy logs its calls
    log.touch()
    reports = Reports()
    sup, shipper = supervisor_with(client, reports, tmp_path, str(runtime))
    try:
        job = spec(
            "container_probe.py", gpus=2, local_world_size=2, world_size=2, cpus=2,
            memory_gb=2, container_image="registry.example.com/train:2.13",
        )  # fmt: skip
        assert sup.start(job)
        exited = reports.wait_for(contract.TASK_REPLICA_EXITED)
        assert (exited["state"], exited["exit_code"]) == ("succeeded", 0), exited
        # Its processes start in the job's working folder, on the shared checkpoint root.
        work = tmp_path / "work" / "checkpoints" / "workdirs" / "job-11"
        assert sorted(texts(client)) == [
            f"image=registry.example.com/train:2.13 cwd={work} cuda=0,1 rank={r} "
            f"local_rank={r} has_path_of_agent=False"
            for r in (0, 1)
        ]
        calls = [json.loads(line) for line in log.read_text().splitlines()]
        runs = [c for c in calls if c[0] == "run"]
        mark = containers.container_name(11, 0, "master", 0, tmp_path / "work").rsplit("-", 1)[1]
        assert sorted(c[c.index("--name") + 1] for c in runs) == [
            f"trainyard-11-a0-master-0-{mark}",
            f"trainyard-11-a0-master-1-{mark}",
        ]
        assert all(c[c.index("--gpus") + 1] == '"device=0,1"' for c in runs)
        # Each of the instance's 2 containers gets half its package: on a node that enforces
        # no limits of its own (as this one), the runtime's flags hold them.
        assert all(c[c.index("--memory") + 1] == str(1 << 30) for c in runs)
        assert all(c[c.index("--memory-swap") + 1] == str(1 << 30) for c in runs)
        assert all(c[c.index("--cpus") + 1] == "1" for c in runs)
        instance = tmp_path / "work" / "jobs" / "11" / "attempt-0" / "master"
        for c in runs:  # the code root (read-only, as in the sandbox), their own folder
            volumes = {c[i + 1] for i, x in enumerate(c) if x == "--volume"}
            assert {
                f"{FIXTURE_CODE_ROOT}:{FIXTURE_CODE_ROOT}:ro",
                f"{instance}:{instance}",
            } <= volumes
        # Once the processes have ended, their containers are removed, whatever became of them.
        wait_until(
            lambda: sum(c[:2] == ["rm", "--force"] for c in
                        (json.loads(x) for x in log.read_text().splitlines())) == 2,
            10,
            "both containers to be removed",
        )  # fmt: skip
    finally:
        sup.shutdown()
        shipper.close()


def test_a_container_image_on_a_node_without_a_runtime_fails_with_the_reason(
    client: redis.Redis, tmp_path: Path
) -> None:
    reports = Reports()
    sup, shipper = supervisor_with(client, reports, tmp_path, None)
    try:
        assert sup.start(spec("container_probe.py", container_image="train:2.13"))
        exited = reports.wait_for(contract.TASK_REPLICA_EXITED)
        assert exited["state"] == "failed"
        assert exited["reason"] == (
            "image train:2.13 runs in containers, but n1 has no container runtime (podman or "
            "docker; the agent's --container-runtime)"
        )
    finally:
        sup.shutdown()
        shipper.close()


def test_each_process_container_gets_its_own_slice_of_the_instances_cores() -> None:
    cores = list(range(8, 20))  # 12 cores
    slices = [limits.cores_of_process(cores, i, 3) for i in range(3)]
    assert slices == [(8, 9, 10, 11), (12, 13, 14, 15), (16, 17, 18, 19)]
    uneven = [limits.cores_of_process(list(range(5)), i, 2) for i in range(2)]
    assert uneven == [(0, 1), (2, 3, 4)]  # every core given, none twice
    assert limits.cores_of_process([3, 4], 1, 4) == (3, 4)  # fewer cores than processes: shared
    assert limits.cores_of_process([3, 4], 0, 1) == (3, 4)
    assert limits.cores_of_process([], 0, 2) == ()  # no cpuset on this node


def test_a_container_in_its_instances_group_gets_the_parent_and_no_flags_of_its_own(
    tmp_path: Path,
) -> None:
    """Where the node holds the instance's containers in a group of its own, that group has
    the whole package for all of them: no per-container share on top."""
    argv = containers.run_argv(
        "/usr/bin/podman", "localhost/train:1", "trainyard-7-a0-master-0", "node-1", process(),
        Path("/code"), [], tmp_path / "env", [],
        limits=Request(memory_bytes=1 << 30, cpus=1, max_processes=64, cores=(2,)),
        cgroup_parent="/trainyard-containers/trainyard-node-1-abc/7-0-master",
    )  # fmt: skip
    at = argv.index("--cgroup-parent")
    assert argv[at + 1] == "/trainyard-containers/trainyard-node-1-abc/7-0-master"
    assert not {"--memory", "--cpus", "--pids-limit", "--cpuset-cpus"} & set(argv)


def test_container_names_of_two_agents_on_one_host_differ() -> None:
    """Two consoles' agents on one host may both run a job 7: podman refuses a second
    container of a name in use, so the agent's work dir is part of the name."""
    ours = containers.container_name(7, 0, "worker-1", 0, Path("/var/lib/trainyard/a"))
    theirs = containers.container_name(7, 0, "worker-1", 0, Path("/srv/other-console/agent"))
    assert ours.startswith("trainyard-7-a0-worker-1-0-") and ours != theirs
