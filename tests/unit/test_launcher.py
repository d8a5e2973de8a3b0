from pathlib import Path

import pytest

from workers import contract
from workers.launcher import NodeNetwork, build_processes
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
        {"local_world_size": 0},
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


def test_it_sets_the_rest_of_torchruns_contract_and_the_nodes_interface() -> None:
    procs = build_processes(
        spec(attempt=1, max_restarts=3, group_world_size=3, rank_offset=2, world_size=5,
             local_world_size=2, cpus=4),
        Path("/code/t.py"),
        29500,
        Path("/work/5/attempt-1/worker-2"),
        Path("/ck"),
        [],
        python="py",
        base_env={},
        network=NodeNetwork(address="10.0.0.7", interface="eth1"),
    )  # fmt: skip
    names = (
        "RANK", "LOCAL_RANK", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_NAME", "ROLE_RANK",
        "ROLE_WORLD_SIZE", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE",
        "TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
        "TORCHELASTIC_SIGNALS_TO_HANDLE", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "OMP_NUM_THREADS",
        "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "TRAINYARD_SCRATCH_DIR",
    )  # fmt: skip
    assert [{n: p.env[n] for n in names} for p in procs] == [
        {
            "RANK": str(2 + local), "LOCAL_RANK": str(local), "GROUP_RANK": "2",
            "GROUP_WORLD_SIZE": "3", "ROLE_NAME": "default", "ROLE_RANK": str(2 + local),
            "ROLE_WORLD_SIZE": "5", "TORCHELASTIC_RUN_ID": "trainyard-job-5",
            "TORCHELASTIC_USE_AGENT_STORE": "False",
            "TORCHELASTIC_ERROR_FILE": f"/work/5/attempt-1/worker-2/error-{local}.json",
            "TORCHELASTIC_RESTART_COUNT": "1", "TORCHELASTIC_MAX_RESTARTS": "3",
            "TORCHELASTIC_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "OMP_NUM_THREADS": "2",
            "GLOO_SOCKET_IFNAME": "eth1", "NCCL_SOCKET_IFNAME": "eth1",
            "TRAINYARD_SCRATCH_DIR": "/work/5/attempt-1/worker-2",
        }
        for local in (0, 1)
    ]  # fmt: skip
    assert "DMLC_NODE_HOST" not in procs[0].env


def test_a_parameter_server_process_gets_the_nodes_address_and_interface() -> None:
    (proc,) = build_processes(
        spec(framework="kvstore", role="server", num_servers=2, num_workers=2,
             kvstore="dist_sync"),
        Path("/code/t.py"), 9000, Path("/i"), Path("/ck"), [], python="py", base_env={},
        network=NodeNetwork(address="10.0.0.7", interface="eth1"),
    )  # fmt: skip
    assert {k: v for k, v in proc.env.items() if k.startswith("DMLC_")} == {
        "DMLC_ROLE": "server", "DMLC_PS_ROOT_URI": "10.0.0.1", "DMLC_PS_ROOT_PORT": "9000",
        "DMLC_NUM_SERVER": "2", "DMLC_NUM_WORKER": "2", "DMLC_NODE_HOST": "10.0.0.7",
        "DMLC_INTERFACE": "eth1",
    }  # fmt: skip
    assert proc.env["GLOO_SOCKET_IFNAME"] == "eth1"  # Trainyard's own PS runs on gloo


def test_lightning_learns_the_instances_and_processes_unless_the_job_says_otherwise() -> None:
    """Lightning's Trainer reads PL_TRAINER_* as its defaults: a script with num_nodes left at
    1 would otherwise train once per instance (issue 49, item 11)."""
    processes = build_processes(
        spec(world_size=6, local_world_size=2, rank_offset=2, group_world_size=3),
        Path("/code/t.py"), 29500, Path("/i"), Path("/ck"), [], python="py", base_env={},
    )  # fmt: skip
    for proc in processes:
        assert proc.env[contract.PL_TRAINER_NUM_NODES] == "3"
        assert proc.env[contract.PL_TRAINER_DEVICES] == "2"
    (own,) = build_processes(
        spec(extra_env={contract.PL_TRAINER_NUM_NODES: "1"}),
        Path("/code/t.py"), 29500, Path("/i"), Path("/ck"), [], python="py", base_env={},
    )  # fmt: skip
    assert own.env[contract.PL_TRAINER_NUM_NODES] == "1"
    assert own.env[contract.PL_TRAINER_DEVICES] == "1"
    (ps,) = build_processes(
        spec(framework="kvstore", role="server", index=0, kvstore="dist_sync", num_servers=1,
             num_workers=1),
        Path("/code/t.py"), 29500, Path("/i"), Path("/ck"), [], python="py", base_env={},
    )  # fmt: skip
    assert contract.PL_TRAINER_NUM_NODES not in ps.env
