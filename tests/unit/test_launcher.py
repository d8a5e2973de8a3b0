from pathlib import Path

import pytest

from workers import contract
from workers.launcher import build_processes
from workers.spec import ReplicaSpec, SpecError


def spec(**overrides: object) -> ReplicaSpec:
    fields: dict[str, object] = dict(
        job_id=5,
        role="worker",
        index=2,
        node="n2",
        framework="pytorch",
        program={"example": "digits-ddp"},
        args=["--lr", "$(id)"],
        master_addr="10.0.0.1",
        hosts_rendezvous=False,
        world_size=4,
        node_rank=2,
        rank_offset=2,
        local_world_size=1,
        cpus=4,
        gpus=0,
    )
    fields.update(overrides)
    return ReplicaSpec(**fields)  # type: ignore[arg-type]


def test_it_sets_torchruns_variables_and_ours() -> None:
    (proc,) = build_processes(
        spec(attempt=2, max_restarts=3),
        Path("/code/t.py"),
        29500,
        Path("/work/5/attempt-2/worker-2"),
        Path("/ck"),
        [],
        python="py",
        base_env={"PATH": "/bin", "REDIS_URL": "secret", "NCCL_DEBUG": "1"},
    )
    env = proc.env
    assert {
        k: env[k]
        for k in (
            contract.MASTER_ADDR,
            contract.MASTER_PORT,
            contract.WORLD_SIZE,
            contract.RANK,
            contract.LOCAL_RANK,
            contract.LOCAL_WORLD_SIZE,
            contract.NODE_RANK,
        )
    } == {
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29500",
        "WORLD_SIZE": "4",
        "RANK": "2",
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "NODE_RANK": "2",
    }
    assert env["TRAINYARD_JOB_ID"] == "5" and env["TRAINYARD_ROLE"] == "worker"
    assert env["TRAINYARD_INDEX"] == "2" and env["TRAINYARD_CHECKPOINT_DIR"] == "/ck"
    assert env["OMP_NUM_THREADS"] == "4" and env["CUDA_VISIBLE_DEVICES"] == ""
    # A restart: the attempt under both names, and the metrics channel in the instance's folder.
    assert env["TRAINYARD_RESTART_COUNT"] == env["TORCHELASTIC_RESTART_COUNT"] == "2"
    assert env["TORCHELASTIC_MAX_RESTARTS"] == "3"
    assert env["TRAINYARD_METRICS_FILE"] == "/work/5/attempt-2/worker-2/metrics-0.jsonl"
    assert env["NCCL_DEBUG"] == "1" and "REDIS_URL" not in env
    assert proc.argv == ["py", "/code/t.py", "--lr", "$(id)"]


def test_it_runs_one_process_per_gpu_with_consecutive_ranks() -> None:
    procs = build_processes(
        spec(gpus=2, local_world_size=2, rank_offset=2, world_size=6),
        Path("t.py"),
        1,
        Path("/i"),
        Path("/ck"),
        [3, 5],
    )
    assert [(p.env["RANK"], p.env["LOCAL_RANK"]) for p in procs] == [("2", "0"), ("3", "1")]
    assert {p.env["CUDA_VISIBLE_DEVICES"] for p in procs} == {"3,5"}
    assert {p.env["OMP_NUM_THREADS"] for p in procs} == {"2"}


@pytest.mark.parametrize(
    "overrides",
    [
        {"framework": "tensorflow"},
        {"local_world_size": 2},
        {"rank_offset": 4},
        {"args": ["ok", 3]},
        {"job_id": 0},
    ],
)
def test_it_refuses_inconsistent_specs(overrides: dict[str, object]) -> None:
    with pytest.raises(SpecError):
        spec(**overrides)


def test_it_round_trips_through_json_dicts() -> None:
    s = spec()
    assert ReplicaSpec.from_dict(s.to_dict()) == s
    with pytest.raises(SpecError):
        ReplicaSpec.from_dict({**s.to_dict(), "surprise": 1})
