"""Scripts written for torchrun run unchanged: a Trainyard process gets every variable a bare
`torchrun` process gets, with an equivalent value; an instance may run several processes on
CPU, as `--nproc-per-node` does; and an exception recorded by torch's @record is the job's
reason."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import FIXTURE_CODE_ROOT, RunningStack, StackClient, pytorch_request

pytestmark = pytest.mark.integration

TORCHRUN = Path(sys.executable).parent / "torchrun"
# What the launching environment, not torchrun, puts there: not part of the comparison.
AMBIENT = {"PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "PWD", "SHLVL", "_"}


@pytest.fixture(scope="module")
def user(stack: RunningStack) -> StackClient:
    return stack.create_user(
        "torchrunner", "torchrunner-password",
        quota={"cpu": 8, "gpus": 0, "memory_gb": 32, "running_jobs": 2},
    )  # fmt: skip


def dumps(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [json.loads(x["text"]) for x in lines if x["text"].startswith("{")]


def bare_torchrun(processes: int) -> list[dict[str, Any]]:
    """What `torchrun --standalone --nproc-per-node N env_dump.py` gives its processes, in an
    environment with nothing else in it."""
    ran = subprocess.run(
        [str(TORCHRUN), "--standalone", "--nproc-per-node", str(processes),
         str(FIXTURE_CODE_ROOT / "env_dump.py")],
        env={"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root")},
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    return [json.loads(line) for line in ran.stdout.splitlines() if line.startswith("{")]


def test_every_variable_torchrun_sets_is_there_with_an_equivalent_value(
    user: StackClient,
) -> None:
    job = user.submit(pytorch_request("env", "env_dump.py", 1, package="cpu-2-x2"))
    finished = user.wait_finished(job["id"])
    assert finished["state"] == "succeeded", finished["reason"]
    ours = sorted(dumps(user.logs(job["id"])), key=lambda d: int(d["env"]["RANK"]))
    theirs = sorted(bare_torchrun(2), key=lambda d: int(d["env"]["RANK"]))
    assert len(ours) == len(theirs) == 2
    for mine, bare in zip(ours, theirs, strict=True):
        assert mine["torchelastic"] is bare["torchelastic"] is True
        env, reference = mine["env"], bare["env"]
        names = set(reference) - AMBIENT
        assert names - set(env) == set(), "torchrun sets these, Trainyard does not"
        same = names - {
            "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE",
            "TORCHELASTIC_USE_AGENT_STORE",
        }  # fmt: skip
        assert {n: env[n] for n in same} == {n: reference[n] for n in same}
        # The rest is equivalent, not equal: where this job's store and files are.
        assert env["MASTER_ADDR"] == "127.0.0.1" and 0 < int(env["MASTER_PORT"]) < 65536
        assert env["TORCHELASTIC_RUN_ID"] == f"trainyard-job-{job['id']}"
        assert env["TORCHELASTIC_ERROR_FILE"].endswith(f"/error-{env['LOCAL_RANK']}.json")
        # torchrun's agent hosts the store; here rank 0 does, as with a static rendezvous.
        assert (env["TORCHELASTIC_USE_AGENT_STORE"], reference["TORCHELASTIC_USE_AGENT_STORE"]) == (
            "False",
            "True",
        )
    assert ours[0]["env"]["TORCHELASTIC_ERROR_FILE"] != ours[1]["env"]["TORCHELASTIC_ERROR_FILE"]


def test_two_instances_are_two_groups_of_one_role_with_the_jobs_own_variables(
    user: StackClient,
) -> None:
    request = pytorch_request("groups", "env_dump.py", 2, package="cpu-2-x2")
    request["env"] = {"DATA_DIR": "/mnt/data", "HF_TOKEN": "hf_not_really", "NCCL_DEBUG": "INFO"}
    job = user.submit(request)
    finished = user.wait_finished(job["id"])
    assert finished["state"] == "succeeded", finished["reason"]
    seen = sorted(
        (int(e["RANK"]), e["GROUP_RANK"], e["LOCAL_RANK"], e["GROUP_WORLD_SIZE"], e["ROLE_RANK"],
         e["ROLE_WORLD_SIZE"], e["WORLD_SIZE"], e["TRAINYARD_ROLE"])
        for e in (d["env"] for d in dumps(user.logs(job["id"])))
    )  # fmt: skip
    assert seen == [
        (0, "0", "0", "2", "0", "4", "4", "master"),
        (1, "0", "1", "2", "1", "4", "4", "master"),
        (2, "1", "0", "2", "2", "4", "4", "worker"),
        (3, "1", "1", "2", "3", "4", "4", "worker"),
    ]
    for dump in dumps(user.logs(job["id"])):
        env = dump["env"]
        assert (env["DATA_DIR"], env["HF_TOKEN"], env["NCCL_DEBUG"]) == (
            "/mnt/data",
            "hf_not_really",
            "INFO",
        )
        # They start in the job's one working folder on the shared checkpoint root, where the
        # code root's entries are linked (as under torchrun launched in the code's folder),
        # and have a folder of their instance's own.
        assert re.fullmatch(rf".*/checkpoints/workdirs/job-{job['id']}-\w+", dump["cwd"]), dump
        assert (Path(dump["cwd"]) / "env_dump.py").resolve() == FIXTURE_CODE_ROOT / "env_dump.py"
        tag = "master" if env["TRAINYARD_ROLE"] == "master" else "worker-1"
        assert env["TRAINYARD_SCRATCH_DIR"].endswith(f"/jobs/{job['id']}/attempt-0/{tag}")


def test_an_exception_recorded_by_at_record_is_the_jobs_reason(user: StackClient) -> None:
    job = user.submit(pytorch_request("recorded", "recorded_failure.py", 1, package="cpu-2-x2"))
    finished = user.wait_finished(job["id"])
    assert finished["state"] == "failed"
    node = finished["replicas"][0]["node"]
    assert finished["reason"].startswith(
        f"master on {node}: ValueError: lr=0 makes no progress; give a positive learning rate "
        "(rank 1, exited with code 1)"
    ), finished["reason"]


# --- a library that asks whether torchrun launched it: Lightning ---


def lightning_request(name: str, num_nodes: int) -> dict[str, Any]:
    return pytorch_request(
        name, "lightning_ddp.py", 3, package="cpu-1", args=["--num-nodes", str(num_nodes)]
    )


def test_a_lightning_script_runs_as_one_ddp_group_in_lightnings_torchrun_environment(
    user: StackClient,
) -> None:
    job = user.wait_finished(user.submit(lightning_request("lightning", 3))["id"])
    assert job["state"] == "succeeded", job["reason"]
    lines = sorted(
        x["text"].split(" loss=")[0]
        for x in user.logs(job["id"])
        if x["text"].startswith("lightning rank=")
    )
    assert lines == [
        f"lightning rank={r} world_size=3 environment=TorchElasticEnvironment" for r in range(3)
    ]


def test_a_lightning_size_mismatch_fails_with_lightnings_own_message(user: StackClient) -> None:
    job = user.wait_finished(user.submit(lightning_request("wrong num_nodes", 1))["id"])
    assert job["state"] == "failed"
    first_line = job["reason"].splitlines()[0]
    assert first_line.endswith(
        ": ValueError: You set `devices=1` and `num_nodes=1` in Lightning, but the product "
        "(1 * 1) does not match the world size (3). (exited with code 1)"
    ), job["reason"]


# --- HuggingFace accelerate: one group on CPU with the CPU starter image's default variable ---


def test_an_accelerate_script_trains_as_one_group_on_the_cpu_starter_image(
    user: StackClient,
) -> None:
    """The image sets ACCELERATE_USE_CPU=true; without it each instance would train alone
    (world size 1, parameters of its own)."""
    job = user.wait_finished(
        user.submit(pytorch_request("accelerate", "accelerate_ddp.py", 3))["id"]
    )
    assert job["state"] == "succeeded", job["reason"]
    lines = [x["text"] for x in user.logs(job["id"]) if x["text"].startswith("accelerate rank=")]
    ranks = sorted(line.split(" checksum=")[0] for line in lines)
    assert ranks == [f"accelerate rank={r} world_size=3 type=MULTI_CPU" for r in range(3)]
    assert len({line.split(" checksum=")[1] for line in lines}) == 1, lines
