"""Turning a replica spec into the processes to start: argv and environment per local rank.

Like torch's elastic agent, an instance runs `local_world_size` processes (one per GPU, or as
many as its package says on CPU), each with its own pipes. A PyTorch process gets every
variable torchrun 2.13 sets: MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK, LOCAL_RANK,
LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE, ROLE_NAME ("default"), ROLE_RANK,
ROLE_WORLD_SIZE, TORCHELASTIC_RUN_ID, TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_MAX_RESTARTS,
TORCHELASTIC_USE_AGENT_STORE, TORCHELASTIC_ERROR_FILE, TORCHELASTIC_SIGNALS_TO_HANDLE,
TORCH_NCCL_ASYNC_ERROR_HANDLING and OMP_NUM_THREADS, plus NODE_RANK, and Lightning's
PL_TRAINER_NUM_NODES and PL_TRAINER_DEVICES where the job sets neither. A parameter-server
process gets MXNet's DMLC_* variables. Both get Trainyard's own (TRAINYARD_*), the node's
interface where it is known (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME, DMLC_INTERFACE), and the
job's own variables (`env`, which may not name any of these).
"""

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from workers import contract
from workers.spec import FRAMEWORK_KVSTORE, ReplicaSpec

# Variables a trainer may inherit from the agent's environment. Everything else (the agent's
# Redis URL, credentials, Django settings) stays out of the trainer's reach.
INHERITED_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "TZ", "LD_LIBRARY_PATH", "VIRTUAL_ENV")
INHERITED_PREFIXES = ("CUDA_", "NCCL_", "GLOO_", "TORCH_NCCL_")
# The agent's own package: the built-in examples import it, and it holds the trainer library.
WORKERS_PACKAGE = Path(__file__).resolve().parent
TRAINER_LIB = WORKERS_PACKAGE / "trainer_lib"


def metrics_file(instance_dir: Path, local_rank: int) -> Path:
    """Where a process's metrics channel is: in its instance's folder, one file per process."""
    return instance_dir / f"metrics-{local_rank}.jsonl"


def error_file(instance_dir: Path, local_rank: int) -> Path:
    """Where a process's @record writes the exception that ended it (TORCHELASTIC_ERROR_FILE)."""
    return instance_dir / f"error-{local_rank}.json"


@dataclass(frozen=True)
class NodeNetwork:
    """Where this node is reached: the address its agent advertises (the master's becomes
    MASTER_ADDR / DMLC_PS_ROOT_URI for the whole job) and, if known, the interface holding it."""

    address: str
    interface: str | None = None


@dataclass(frozen=True)
class LocalProcess:
    local_rank: int
    argv: list[str]
    env: dict[str, str]


def inherited_env(source: dict[str, str] | None = None) -> dict[str, str]:
    source = dict(os.environ) if source is None else source
    return {
        k: v for k, v in source.items() if k in INHERITED_ENV or k.startswith(INHERITED_PREFIXES)
    }


def build_processes(
    spec: ReplicaSpec,
    script: Path,
    master_port: int,
    instance_dir: Path,
    checkpoint_dir: Path,
    gpu_ids: list[int],
    python: str = sys.executable,
    base_env: dict[str, str] | None = None,
    network: NodeNetwork | None = None,
) -> list[LocalProcess]:
    """The processes of one replica. argv is a list: arguments are never seen by a shell.

    `master_port` is the rendezvous port: MASTER_PORT for PyTorch, DMLC_PS_ROOT_PORT for a
    parameter-server job (whose scheduler hosts the rendezvous). `instance_dir` is this
    instance's own folder in this attempt; `checkpoint_dir` is the job's, shared by every
    instance and every attempt.
    """
    common = inherited_env(base_env)
    common.update(spec.extra_env)
    # `import trainyard_metrics` works in every trainer, whatever its image, and its
    # sitecustomize makes stdout line-buffered: lines reach the log as they are printed.
    common["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(TRAINER_LIB), common.get("PYTHONPATH", "")) if p
    )
    common.update(
        {
            "OMP_NUM_THREADS": str(max(1, spec.cpus // spec.local_world_size)),
            contract.TRAINYARD_JOB_ID: str(spec.job_id),
            contract.TRAINYARD_ROLE: spec.role,
            contract.TRAINYARD_INDEX: str(spec.index),
            contract.TRAINYARD_CHECKPOINT_DIR: str(checkpoint_dir),
            contract.TRAINYARD_SCRATCH_DIR: str(instance_dir),
            contract.TRAINYARD_RESTART_COUNT: str(spec.attempt),
            contract.TORCHELASTIC_RESTART_COUNT: str(spec.attempt),
            contract.TORCHELASTIC_MAX_RESTARTS: str(spec.max_restarts),
            contract.TRAINYARD_RESIZE_COUNT: str(spec.resize_count),
        }
    )
    # An instance without GPUs must not pick up the host's GPUs by accident.
    common["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpu_ids)
    argv = [python, str(script), *spec.args]
    interface = network.interface if network is not None else None
    if interface:
        # torch.distributed under both frameworks (Trainyard's parameter server runs on gloo).
        common[contract.GLOO_SOCKET_IFNAME] = interface
        common[contract.NCCL_SOCKET_IFNAME] = interface
    if spec.framework == FRAMEWORK_KVSTORE:
        # MXNet's variables; one process per instance: a worker with several devices
        # aggregates across them itself (dist_device_sync).
        common.update(
            {
                contract.DMLC_ROLE: spec.role,
                contract.DMLC_PS_ROOT_URI: spec.master_addr,
                contract.DMLC_PS_ROOT_PORT: str(master_port),
                contract.DMLC_NUM_SERVER: str(spec.num_servers),
                contract.DMLC_NUM_WORKER: str(spec.num_workers),
                contract.TRAINYARD_KVSTORE: spec.kvstore,
            }
        )
        if network is not None:
            common[contract.DMLC_NODE_HOST] = network.address
        if interface:
            common[contract.DMLC_INTERFACE] = interface
        common[contract.TRAINYARD_METRICS_FILE] = str(metrics_file(instance_dir, 0))
        return [LocalProcess(0, argv, common)]
    # What torchrun's elastic agent sets, name for name (torch/distributed/elastic/agent/
    # server/local_elastic_agent.py): every process is in one role, "default", as there.
    common.update(
        {
            contract.MASTER_ADDR: spec.master_addr,
            contract.MASTER_PORT: str(master_port),
            contract.WORLD_SIZE: str(spec.world_size),
            contract.NODE_RANK: str(spec.node_rank),
            contract.GROUP_RANK: str(spec.node_rank),
            contract.GROUP_WORLD_SIZE: str(spec.group_world_size or spec.world_size),
            contract.LOCAL_WORLD_SIZE: str(spec.local_world_size),
            contract.ROLE_NAME: contract.TORCHRUN_ROLE,
            contract.ROLE_WORLD_SIZE: str(spec.world_size),
            contract.TORCHELASTIC_RUN_ID: contract.torchelastic_run_id(spec.job_id),
            # Rank 0 hosts the store (env://), as under torchrun's static rendezvous.
            contract.TORCHELASTIC_USE_AGENT_STORE: "False",
            contract.TORCH_NCCL_ASYNC_ERROR_HANDLING: common.get(
                contract.TORCH_NCCL_ASYNC_ERROR_HANDLING, "1"
            ),
            contract.TORCHELASTIC_SIGNALS_TO_HANDLE: contract.SIGNALS_TO_HANDLE,
        }
    )
    # Lightning's Trainer defaults, unless the job's own variables set them.
    common.setdefault(
        contract.PL_TRAINER_NUM_NODES,
        str(spec.group_world_size or spec.world_size // spec.local_world_size),
    )
    common.setdefault(contract.PL_TRAINER_DEVICES, str(spec.local_world_size))
    processes = []
    for local_rank in range(spec.local_world_size):
        env = dict(common)
        rank = str(spec.rank_offset + local_rank)
        env[contract.LOCAL_RANK] = str(local_rank)
        env[contract.RANK] = env[contract.ROLE_RANK] = rank
        env[contract.TRAINYARD_METRICS_FILE] = str(metrics_file(instance_dir, local_rank))
        env[contract.TORCHELASTIC_ERROR_FILE] = str(error_file(instance_dir, local_rank))
        processes.append(LocalProcess(local_rank, argv, env))
    return processes
