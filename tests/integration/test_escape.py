"""A job reaches nothing beyond itself, on the real stack: alice's hostile script
(tests/fixtures/code/escape.py) runs while bob's job, with his own uploaded code, a masked
variable and a checkpoint, runs on the same machine. Each attempt is its own test.

The same probe runs on the multi-host set-up (tests/integration/test_cluster.py)."""

import contextlib
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.conftest import (
    FIXTURE_CODE_ROOT,
    RunningStack,
    escape_verdicts,
    signal_file,
    wait_until,
)

pytestmark = pytest.mark.integration

BOB_SECRET = "bob-secret-123"
QUOTA = {"cpu": 4, "gpus": 0, "memory_gb": 16, "running_jobs": 4}


@dataclass
class Probe:
    verdicts: dict[str, str]
    targets: dict[str, list[Path]]
    bob_job: int


@contextlib.contextmanager
def run_probe(
    running: RunningStack, tmp_path: Path, tag: str, image: str = "pytorch:2.13-cpu"
) -> Iterator[Probe]:
    """Bob's job runs; alice's escape job (on `image`) tries everything; bob's job is released
    after."""
    alice = running.create_user(f"alice-{tag}", "alice-pw", quota=QUOTA)
    bob = running.create_user(f"bob-{tag}", "bob-pw", quota=QUOTA)
    code = tmp_path / "bob-code"
    code.mkdir()
    shutil.copy(FIXTURE_CODE_ROOT / "checkpointer.py", code / "secret_model.py")
    sha = bob.upload(code, "bob's model")
    hold = signal_file()
    bobs = bob.submit(
        {
            "name": "bob's run",
            "image": "pytorch:2.13-cpu",
            "program": {
                "snapshot": sha,
                "script": "secret_model.py",
                "args": ["--hold", str(hold)],
            },
            "roles": {"master": {"package": "cpu-1", "instances": 1}},
            "env": {"BOB_API_TOKEN": BOB_SECRET},
        }
    )
    try:
        wait_until(
            "bob's job to run", lambda: any(x["text"] == "ready" for x in bob.logs(bobs["id"]))
        )
        var = running.stack.var_dir
        agents = var / "agents"
        targets = {
            # (var/ itself holds the agents' folders, so the sandbox shows the way to the job's
            # own; what the console keeps there must not show.)
            "console var": [
                p
                for p in (
                    var / "trainyard.sqlite3",
                    var / "secret_key",
                    var / "admin-password",
                    var / "redis",
                    var / "redis" / "redis.conf",
                    var / "logs",
                )
                if p.exists()
            ],
            "bob's instance": sorted(agents.glob(f"*/jobs/{bobs['id']}/attempt-0/master")),
            # Unpacked once for the job, in its working folder on the shared root.
            "bob's code": sorted(agents.glob(f"checkpoints/workdirs/job-{bobs['id']}-*/.code")),
            "bob's working folder": sorted(agents.glob(f"checkpoints/workdirs/job-{bobs['id']}-*")),
            "bob's checkpoint": sorted(agents.glob(f"checkpoints/job-{bobs['id']}-*")),
            "snapshot caches": sorted(agents.glob("*/snapshots")),
            "agents' folders": sorted(agents.glob("*/log-spool")) + sorted(agents.glob("*/procs")),
        }
        for what, paths in targets.items():
            assert paths, f"the test found no {what} to try"
        redis = urlsplit(running.stack.redis_url)
        # Hosts in network namespaces reach Redis across their bridge, as their agents do.
        network = running.stack.network
        redis_host = network.gateway if network is not None else redis.hostname
        nodes = running.admin.http.get("/api/v1/nodes").json()["nodes"]
        other_node = nodes[-1]["name"]
        job = alice.submit(
            {
                "name": "escape",
                "image": image,
                "program": {
                    "script": "escape.py",
                    "args": [
                        "--paths",
                        *(str(p) for paths in targets.values() for p in paths),
                        "--redis",
                        f"{redis_host}:{redis.port}",
                        "--queue",
                        f"node.{other_node}",
                    ],
                },
                "roles": {"master": {"package": "cpu-1", "instances": 1}},
            }
        )
        finished = alice.wait_finished(job["id"])
        assert finished["state"] == "succeeded", finished["reason"]
        yield Probe(escape_verdicts(x["text"] for x in alice.logs(job["id"])), targets, bobs["id"])
    finally:
        hold.touch()
    assert bob.wait_finished(bobs["id"])["state"] == "succeeded"


@pytest.fixture(scope="module")
def probe(stack: RunningStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Probe]:
    with run_probe(stack, tmp_path_factory.mktemp("escape"), "escape") as found:
        yield found


def blocked(probe: Probe, name: str) -> None:
    verdict = probe.verdicts.get(name)
    assert verdict is not None, f"the probe never tried {name}: {probe.verdicts}"
    assert verdict.startswith("BLOCKED"), f"{name}: {verdict}"


def blocked_paths(probe: Probe, what: str) -> None:
    for path in probe.targets[what]:
        blocked(probe, f"path:{path}")


def test_no_other_process_is_visible(probe: Probe) -> None:
    blocked(probe, "process-command-lines")


def test_no_other_process_environment_is_readable(probe: Probe) -> None:
    """Neither the agent's (its Redis URL) nor bob's trainer's (his masked variable)."""
    blocked(probe, "process-environments")


def test_the_consoles_var_folder_and_database_are_out_of_reach(probe: Probe) -> None:
    blocked_paths(probe, "console var")


def test_another_jobs_instance_folder_is_out_of_reach(probe: Probe) -> None:
    blocked_paths(probe, "bob's instance")


def test_another_jobs_code_is_out_of_reach(probe: Probe) -> None:
    blocked_paths(probe, "bob's code")


def test_another_jobs_working_folder_is_out_of_reach(probe: Probe) -> None:
    """Bob's working folder, where his trainers start and save, is on the same shared root as
    alice's own: hers is in her sandbox, his is not."""
    blocked_paths(probe, "bob's working folder")


def test_another_jobs_checkpoint_is_out_of_reach(probe: Probe) -> None:
    blocked_paths(probe, "bob's checkpoint")


def test_other_users_snapshots_are_out_of_reach(probe: Probe) -> None:
    blocked_paths(probe, "snapshot caches")


def test_the_agents_own_folders_are_out_of_reach(probe: Probe) -> None:
    blocked_paths(probe, "agents' folders")


def test_redis_refuses_a_job_without_credentials(probe: Probe) -> None:
    blocked(probe, "redis-without-credentials")
    blocked(probe, "redis-admin-command")


def test_no_redis_credential_is_in_reach(probe: Probe) -> None:
    blocked(probe, "redis-with-found-credentials")


def test_another_nodes_queue_is_out_of_reach(probe: Probe) -> None:
    blocked(probe, "redis-other-node-queue")


def test_the_system_is_read_only_and_the_job_is_not_root(probe: Probe) -> None:
    blocked(probe, "write:/usr/trainyard-escape")
    blocked(probe, "write:/etc/trainyard-escape")
    blocked(probe, "uid-root")


def test_the_job_still_does_what_a_job_does(probe: Probe) -> None:
    """Not a vacuous pass: its own checkpoint and scratch folders and its code work."""
    for name in (
        "write:TRAINYARD_CHECKPOINT_DIR",
        "write:TRAINYARD_SCRATCH_DIR",
        "write:own-working-folder",
        "read:own-script",
    ):
        assert probe.verdicts.get(name, "").startswith("OK"), (name, probe.verdicts)


def assert_reaches_nothing(probe: Probe) -> None:
    """Every attempt above at once (the multi-host set-up's test)."""
    for name, verdict in probe.verdicts.items():
        expected = (
            "OK" if name.startswith(("write:TRAINYARD_", "write:own", "read:own")) else "BLOCKED"
        )
        assert verdict.startswith(expected), f"{name}: {verdict}"
    for what in probe.targets:
        blocked_paths(probe, what)
    assert len(probe.verdicts) >= 16, probe.verdicts
