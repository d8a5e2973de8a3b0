"""Trainers in a sandbox (workers/sandbox.py): the argv it builds, and real trainers under a real
supervisor and a real bubblewrap, two users' jobs side by side on one node."""

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.conftest import (
    FIXTURE_CODE_ROOT,
    escape_verdicts,
    job_processes,
    required_here,
    signal_file,
)
from tests.unit.test_supervisor import Reports, spec, texts, wait_until
from workers import contract, sandbox
from workers.folderaccess import NamedFolder
from workers.logship import LogShipper
from workers.sandbox import Folders, Isolation, Sandbox
from workers.supervisor import Supervisor

ROOTED = Sandbox(Isolation.SANDBOX, "/usr/bin/bwrap", "/usr/bin/setpriv", "/usr/bin/env")


def option_pairs(argv: list[str], option: str) -> list[tuple[str, str]]:
    return [(argv[i + 1], argv[i + 2]) for i, a in enumerate(argv) if a == option]


def test_it_gives_a_process_only_the_device_nodes_of_its_own_gpus(tmp_path: Path) -> None:
    """A launch plan on a fake 4-GPU node: the instance given GPUs 1 and 2 sees those two
    device nodes, numbered 0 and 1 by CUDA, and no other GPU."""
    folders = Folders(cwd=tmp_path, writable=[tmp_path], gpu_ids=[1, 2], scratch=tmp_path)
    argv, env = ROOTED.wrap(["/usr/bin/python3", "train.py"], folders, {}, ROOTED.user_of(7))
    gpus = [d for d, _ in option_pairs(argv, "--dev-bind-try") if d[len("/dev/nvidia") :].isdigit()]
    assert gpus == ["/dev/nvidia1", "/dev/nvidia2"]
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1"


def test_it_runs_a_users_trainers_as_that_users_own_uid_without_capabilities(
    tmp_path: Path,
) -> None:
    argv, _ = ROOTED.wrap(
        ["/usr/bin/python3", "train.py"], Folders(cwd=tmp_path), {}, ROOTED.user_of(7)
    )
    inside = argv[argv.index("--") + 1 :]
    uid = sandbox.DEFAULT_UID_BASE + 7
    assert inside[:7] == [
        "/usr/bin/setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
        "--bounding-set=-all", "--inh-caps=-all", "--no-new-privs",
    ]  # fmt: skip
    # After the drop, SIGTERM's default comes back, and only then is the job's environment
    # set (workers/jobenv.py), by the trainer's own interpreter.
    assert inside[7:9] == ["/usr/bin/env", "--default-signal=TERM"]
    assert inside[9:13] == ["/usr/bin/python3", "-I", "-S", str(sandbox.JOBENV_SHIM)]
    assert inside[-2:] == ["/usr/bin/python3", "train.py"]
    # bwrap ignores SIGTERM, the trainer gets it back: a stop reaches the trainer alone.
    assert argv[:2] == ["/usr/bin/env", "--ignore-signal=TERM"]


def test_no_variable_of_the_job_is_on_the_command_line(tmp_path: Path) -> None:
    """The job's variables travel on stdin, not in the argv: `ps` on the host shows none of
    their values, and nothing before the drop runs with them."""
    secret = {"BOB_API_TOKEN": "bob-secret-123", "LD_PRELOAD": "/x/evil.so"}
    for wrapper in (ROOTED, Sandbox(Isolation.NONE, reason="bwrap not found")):
        argv, env = wrapper.wrap(
            ["/usr/bin/python3", "t.py"], Folders(cwd=tmp_path), secret, ROOTED.user_of(7)
        )
        assert not any("bob-secret" in a or "evil.so" in a for a in argv)
        assert env["BOB_API_TOKEN"] == "bob-secret-123"


def test_a_node_without_a_sandbox_still_sets_the_environment_in_the_last_step(
    tmp_path: Path,
) -> None:
    bare = Sandbox(Isolation.NONE, reason="bwrap not found")
    argv, env = bare.wrap(["python", "x.py"], Folders(cwd=tmp_path), {"A": "1"}, bare.user_of(3))
    assert argv == ["python", "-I", "-S", str(sandbox.JOBENV_SHIM), "--chdir", str(tmp_path),
                    "--", "python", "x.py"]  # fmt: skip
    assert env == {"A": "1"}


def test_exit_codes_of_signals_read_as_signals() -> None:
    assert sandbox.exit_code(137, ROOTED) == -signal.SIGKILL
    assert sandbox.exit_code(143, ROOTED) == -signal.SIGTERM
    assert sandbox.exit_code(3, ROOTED) == 3
    assert sandbox.exit_code(None, ROOTED) is None
    assert sandbox.exit_code(137, Sandbox(Isolation.NONE)) == 137


# --- real trainers in real sandboxes ---------------------------------------------------------


@pytest.fixture(scope="module")
def host_sandbox() -> Sandbox:
    """What this host can do; CI must be able to sandbox (make test installs bubblewrap)."""
    found = sandbox.probe(shared=[signal_file().parent])
    if not found.isolation.isolated:
        required_here("the sandbox tests", f"no sandbox here: {found.reason}")
    return found


@pytest.fixture
def client(redis_server: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_server, decode_responses=True)
    c.flushdb()
    yield c


@pytest.fixture
def reports() -> Reports:
    return Reports()


@pytest.fixture
def node(
    client: redis.Redis, reports: Reports, tmp_path: Path, host_sandbox: Sandbox
) -> Iterator[Supervisor]:
    shipper = LogShipper(client, tmp_path / "spool")
    work = tmp_path / "work"
    work.mkdir(mode=0o700)
    sup = Supervisor(
        "n1", client, shipper, reports, work, FIXTURE_CODE_ROOT, trainer_sandbox=host_sandbox
    )
    yield sup
    sup.shutdown()
    shipper.close()


def test_a_job_reaches_nothing_of_another_users_job_on_the_same_node(
    node: Supervisor, reports: Reports, client: redis.Redis, tmp_path: Path
) -> None:
    """Bob's job holds its checkpoint and instance folder; alice's job, on the same node, tries
    them, the agent's folders, a secret the console keeps, and every other process."""
    hold = signal_file()
    bobs = spec("checkpointer.py", job_id=21, owner=2, args=["--hold", str(hold)])
    try:
        node.start(bobs)
        wait_until(lambda: "ready" in texts(client, 21), 60, "bob's job to be ready")
        bob_checkpoint = node.checkpoint_root / "job-21"
        bob_instance = node._workdir / "jobs" / "21" / "attempt-0" / "master"
        secret = tmp_path / "admin-password"  # world-readable, as var/ files once were
        secret.write_text("hunter2")
        secret.chmod(0o644)
        targets = [
            bob_checkpoint,
            bob_checkpoint / "state.txt",
            bob_instance,
            node._workdir / "log-spool",
            node._workdir / "procs",
            secret,
            Path("/var"),
        ]
        node.start(
            spec(
                "escape.py",
                job_id=22,
                owner=1,
                args=["--paths", *map(str, targets)],
            )
        )
        reports.wait_for(contract.TASK_REPLICA_EXITED, job_id=22)
        verdicts = escape_verdicts(texts(client, 22))
        for target in targets:
            assert verdicts[f"path:{target}"].startswith("BLOCKED"), (target, verdicts)
        assert verdicts["process-command-lines"].startswith("BLOCKED"), verdicts[
            "process-command-lines"
        ]
        assert verdicts["process-environments"].startswith("BLOCKED"), verdicts
        assert verdicts["write:/usr/trainyard-escape"].startswith("BLOCKED"), verdicts
        assert verdicts["write:/etc/trainyard-escape"].startswith("BLOCKED"), verdicts
        assert verdicts["uid-root"].startswith("BLOCKED"), verdicts
        # It is no vacuous pass: the job could do what it should.
        assert verdicts["write:TRAINYARD_CHECKPOINT_DIR"].startswith("OK"), verdicts
        assert verdicts["write:TRAINYARD_SCRATCH_DIR"].startswith("OK"), verdicts
        assert verdicts["read:own-script"].startswith("OK"), verdicts
        # Bob's checkpoint is his: another uid, mode 0700, unchanged.
        assert bob_checkpoint.stat().st_mode & 0o777 == 0o700
        if node.sandbox.switches_uid:
            assert bob_checkpoint.stat().st_uid == node.sandbox.uid_of(2)
        assert (bob_checkpoint / "state.txt").read_text() == "attempt 0"
    finally:
        hold.touch()
    assert reports.wait_for(contract.TASK_REPLICA_EXITED, job_id=21)["state"] == "succeeded"


def test_a_restarted_job_resumes_from_its_own_checkpoint(
    node: Supervisor, reports: Reports, client: redis.Redis
) -> None:
    node.start(spec("checkpointer.py", job_id=23, owner=4, checkpoint_key="k23"))
    assert reports.wait_for(contract.TASK_REPLICA_EXITED, job_id=23)["state"] == "succeeded"
    node.start(spec("checkpointer.py", job_id=23, owner=4, checkpoint_key="k23", attempt=1))
    exited = reports.wait_for(contract.TASK_REPLICA_EXITED, job_id=23, attempt=1)
    assert exited["state"] == "succeeded", exited["reason"]
    assert "resumed from: attempt 0" in texts(client, 23)


def test_a_stop_gives_the_trainer_its_grace_to_checkpoint(
    node: Supervisor, reports: Reports, client: redis.Redis
) -> None:
    """SIGTERM reaches the trainer, not only bubblewrap, which would kill it at once."""
    node.start(spec("checkpointer.py", job_id=24, owner=4, args=["--hold", str(signal_file())]))
    wait_until(lambda: "ready" in texts(client, 24), 60, "the trainer to be ready")
    assert node.stop_job(24, "cancelled by alice") == 1
    exited = reports.wait_for(contract.TASK_REPLICA_EXITED, job_id=24)
    assert (exited["state"], exited["reason"]) == ("stopped", "cancelled by alice")
    assert "saved on SIGTERM" in texts(client, 24)
    assert (node.checkpoint_root / "job-24" / "state.txt").read_text() == "saved on SIGTERM"


def script(name: str) -> str:
    return str(FIXTURE_CODE_ROOT / f"{name}.py")


def test_a_trainer_killed_by_a_signal_is_reported_so(
    node: Supervisor, reports: Reports, client: redis.Redis
) -> None:
    node.start(spec("checkpointer.py", job_id=25, owner=4, args=["--hold", str(signal_file())]))
    wait_until(lambda: "ready" in texts(client, 25), 60, "the trainer to be ready")
    (trainer,) = [p for p in job_processes(25) if p.cmdline()[1:2] == [script("checkpointer")]]
    trainer.kill()
    exited = reports.wait_for(contract.TASK_REPLICA_EXITED, job_id=25)
    assert (exited["state"], exited["exit_code"], exited["reason"]) == (
        "failed",
        -9,
        "killed by signal SIGKILL",
    )


def test_what_a_trainer_leaves_behind_ends_with_it(
    node: Supervisor, reports: Reports, client: redis.Redis
) -> None:
    """A child that left the trainer's process group (setsid) is out of reach of a group
    signal, but not of the sandbox's PID namespace, which ends with the trainer."""
    node.start(spec("checkpointer.py", job_id=26, owner=4, args=["--orphan"]))
    assert reports.wait_for(contract.TASK_REPLICA_EXITED, job_id=26)["state"] == "succeeded"
    assert "left an orphan" in texts(client, 26)
    wait_until(lambda: not job_processes(26), 10, "the orphan to end with its trainer")


def test_the_trainer_runs_as_its_owners_uid(
    node: Supervisor, reports: Reports, client: redis.Redis
) -> None:
    node.start(spec("checkpointer.py", job_id=27, owner=9, args=["--hold", str(signal_file())]))
    wait_until(lambda: "ready" in texts(client, 27), 60, "the trainer to be ready")
    try:
        trainers = [p for p in job_processes(27) if p.cmdline()[1:2] == [script("checkpointer")]]
        uids = {p.uids().real for p in trainers}
        expected = node.sandbox.uid_of(9) if node.sandbox.switches_uid else os.getuid()
        assert uids == {expected}
    finally:
        node.stop_job(27, "done")
    reports.wait_for(contract.TASK_REPLICA_EXITED, job_id=27)


def test_the_code_in_the_working_folder_is_bound_read_only_over_it(tmp_path: Path) -> None:
    """The working folder is writable, its `.code` is not: bwrap binds the outer folder first,
    then the code over it (workers/workfolder.py)."""
    work = tmp_path / "workdirs" / "job-1-ab"
    code = work / ".code"
    code.mkdir(parents=True)
    options = sandbox.mounts(Folders(cwd=work, read_only=[code], writable=[work]), python=[])
    binds = [
        (options[i], options[i + 2])
        for i, option in enumerate(options)
        if option in ("--bind", "--ro-bind") and options[i + 2] in (str(work), str(code))
    ]
    assert binds == [("--bind", str(work)), ("--ro-bind", str(code))]


def test_the_instances_dev_shm_lies_beside_its_folder_not_in_it(tmp_path: Path) -> None:
    """bwrap binds /dev/shm by its path each time a process of the instance starts, maybe
    after another is running: a folder the job could replace with a link would have the next
    sandbox bind whatever it names. It lies in the attempt's folder, the agent's alone."""
    scratch = tmp_path / "attempt-0" / "master"
    scratch.mkdir(parents=True)
    sandbox.prepare_scratch(scratch)
    shm = sandbox.shm_folder(scratch)
    assert shm.is_dir() and shm.parent == scratch.parent and not shm.is_relative_to(scratch)
    assert sandbox.scratch_folders(scratch) == [scratch, scratch / "tmp", shm]
    options = sandbox.mounts(Folders(cwd=scratch, writable=[scratch], scratch=scratch), [])
    assert ["--bind", str(shm), sandbox.PRIVATE_SHM] in [
        options[i : i + 3] for i in range(len(options) - 2)
    ]


def test_the_node_side_reads_a_jobs_files_as_its_trainers_uid_owns_them() -> None:
    """What jobfiles checks a job's metrics and error files against: the uid its trainers run
    as, which for a root agent's containers is the owner's even without a sandbox."""
    bare = Sandbox(Isolation.NONE, reason="bwrap not found")
    seven = ROOTED.user_of(7)
    assert ROOTED.file_owner(seven) == sandbox.DEFAULT_UID_BASE + 7
    assert bare.file_owner(seven) == os.geteuid()
    expected = sandbox.DEFAULT_UID_BASE + 7 if os.geteuid() == 0 else os.geteuid()
    assert bare.file_owner(seven, container=True) == expected
    # A person's own identity, where the console sent one.
    ada = ROOTED.user_of(7, 20001, 20001, [30001])
    assert ROOTED.file_owner(ada) == 20001


def test_a_person_with_a_unix_identity_runs_as_it_with_their_groups(tmp_path: Path) -> None:
    ada = ROOTED.user_of(7, 20001, 20002, [30000, 30001, 20002])
    assert (ada.uid, ada.gid, ada.groups, ada.own) == (20001, 20002, (20002, 30000, 30001), True)
    argv, _ = ROOTED.wrap(["/usr/bin/python3", "train.py"], Folders(cwd=tmp_path), {}, ada)
    inside = argv[argv.index("--") + 1 :]
    assert inside[:4] == [
        "/usr/bin/setpriv", "--reuid=20001", "--regid=20002", "--groups=20002,30000,30001"
    ]  # fmt: skip
    assert "uid 20001, gid 20002, groups 30000,30001 (the owner's own)" == ada.describe()
    assert "Trainyard's own" in ROOTED.user_of(7).describe()


def test_named_folders_are_bound_where_the_job_named_them(tmp_path: Path) -> None:
    data = NamedFolder("/shared/datasets/vision", tmp_path / "real-vision", writable=False)
    results = NamedFolder("/shared/results/vision", tmp_path / "real-results", writable=True)
    folders = Folders(cwd=tmp_path / "work", named=(data, results))
    argv, _ = ROOTED.wrap(["/usr/bin/python3", "t.py"], folders, {}, ROOTED.user_of(7))
    assert (str(tmp_path / "real-vision"), "/shared/datasets/vision") in option_pairs(
        argv, "--ro-bind"
    )
    assert (str(tmp_path / "real-results"), "/shared/results/vision") in option_pairs(
        argv, "--bind"
    )
    # Their parents are made in the new root, open to the job's uid (not copied from the host).
    assert ["--perms", "0755", "--dir", "/shared"] in [
        argv[i : i + 4] for i in range(len(argv) - 3)
    ]
