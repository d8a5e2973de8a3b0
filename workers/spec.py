"""What the console sends an agent to start one replica: a small, validated, JSON-able spec."""

from dataclasses import asdict, dataclass, field
from typing import Any

from workers.contract import tag_of
from workers.folderaccess import MAX_FOLDERS, requests, shape_problem

FRAMEWORK_PYTORCH = "pytorch"
FRAMEWORK_KVSTORE = "kvstore"
FRAMEWORKS = (FRAMEWORK_PYTORCH, FRAMEWORK_KVSTORE)
KVSTORE_ROLES = ("scheduler", "server", "worker")


class SpecError(ValueError):
    pass


@dataclass(frozen=True)
class ReplicaSpec:
    """One instance of one role of a job, as its node agent must run it.

    The console computes everything that depends on the whole job (world size, this instance's
    node rank and first global rank, the master's address); the agent adds what only the host
    knows (the rendezvous port, local ranks, directories).
    """

    job_id: int
    role: str
    index: int
    node: str
    framework: str
    program: dict[str, str]
    args: list[str]
    master_addr: str
    hosts_rendezvous: bool  # this instance picks MASTER_PORT and publishes it to the others
    world_size: int
    node_rank: int
    rank_offset: int  # global rank of this instance's local rank 0
    local_world_size: int
    cpus: int
    gpus: int
    # PyTorch jobs: how many instances the job has (torchrun's GROUP_WORLD_SIZE); 0 from a
    # console older than this field, taken as one instance per process.
    group_world_size: int = 0
    extra_env: dict[str, str] = field(default_factory=dict)
    # Parameter-server jobs only: how many servers and workers there are, and the kvstore mode.
    num_servers: int = 0
    num_workers: int = 0
    kvstore: str = ""
    # Metrics read off log lines: [{"name": "loss", "regex": "loss=([0-9.]+)"}, ...]
    metric_definitions: list[dict[str, str]] = field(default_factory=list)
    # Which run of the whole job this is (0: the first; each restart adds one), how many
    # restarts the job may use, and the key naming its checkpoint folder on every attempt.
    attempt: int = 0
    max_restarts: int = 0
    # An elastic job's resizes so far (each is an attempt too, but neither a failure nor a
    # restart of its policy).
    resize_count: int = 0
    checkpoint_key: str = ""
    # The image is a container (workers/containers.py): its reference; empty: the host's Python.
    container_image: str = ""
    # The interpreter the image's trainers run with on this node; empty: the agent's own choice.
    python: str = ""
    # The console user who owns the job: a sandboxed trainer runs as a uid made from it where
    # the console knows no Unix identity of theirs.
    owner: int = 0
    # The owner's own Unix identity (workers/unixids.py), where the console knows one: the
    # trainers run as it; uid -1: none known.
    run_uid: int = -1
    run_gid: int = -1
    run_groups: list[int] = field(default_factory=list)
    # Folders of the host's file system the job named (workers/folderaccess.py): data its
    # trainers read, and a folder their results go to ("": none).
    data_folders: list[str] = field(default_factory=list)
    results_folder: str = ""
    # The package's name and what it gives the instance beyond cpus and gpus (workers/limits.py
    # holds the instance to them); 0: no such limit (a console older than limits).
    package: str = ""
    memory_gb: float = 0
    max_processes: int = 0
    disk_gb: float = 0
    # The instance's log budget (workers.logquota.LogLimits as a dict); empty: none (a console
    # older than log limits).
    log_limits: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.framework not in FRAMEWORKS:
            raise SpecError(f"unknown framework {self.framework!r}")
        if self.index < 0 or self.job_id < 1 or self.attempt < 0 or self.owner < 0:
            raise SpecError("job id, index and attempt must be positive")
        if not all(c.isalnum() for c in self.checkpoint_key):
            raise SpecError("the checkpoint key must be letters and digits")
        if min(self.memory_gb, self.max_processes, self.disk_gb) < 0:
            raise SpecError("limits must not be negative")
        if self.local_world_size < 1:
            raise SpecError("an instance runs at least one process")
        if not 0 <= self.rank_offset < self.world_size:
            raise SpecError("rank_offset must lie inside the world")
        if not all(isinstance(a, str) for a in self.args):
            raise SpecError("args must be strings")
        self._check_identity()
        if self.framework == FRAMEWORK_KVSTORE:
            if self.role not in KVSTORE_ROLES:
                raise SpecError(f"a parameter-server job has no role {self.role!r}")
            if self.num_servers < 1 or self.num_workers < 1 or not self.kvstore:
                raise SpecError("a parameter-server job needs servers, workers and a mode")

    def _check_identity(self) -> None:
        if self.run_uid < -1 or (self.run_uid >= 0 and self.run_gid < 0):
            raise SpecError("a Unix identity needs a uid and a gid")
        if not all(isinstance(g, int) and g >= 0 for g in self.run_groups):
            raise SpecError("groups must be gids")
        folders = [path for path, _ in requests(self.data_folders, self.results_folder)]
        if len(folders) > MAX_FOLDERS:
            raise SpecError(f"at most {MAX_FOLDERS} folders")
        for folder in folders:
            if not isinstance(folder, str) or (problem := shape_problem(folder)) is not None:
                raise SpecError(f"folder: {problem or 'not a path'}")

    @property
    def user_known(self) -> bool:
        """Whether the trainers run as their owner's own Unix identity."""
        return self.run_uid >= 0

    @property
    def tag(self) -> str:
        """How logs name this instance: `master`, `worker-1`, `server-0`."""
        return tag_of(self.role, self.index)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ReplicaSpec":
        try:
            return cls(**data)
        except TypeError as exc:
            raise SpecError(str(exc)) from None
