"""Where this process sits in a parameter-server job, read from the environment.

The platform starts 1 scheduler, S servers and W workers with MXNet's variables (DMLC_ROLE,
DMLC_PS_ROOT_URI, DMLC_PS_ROOT_PORT, DMLC_NUM_SERVER, DMLC_NUM_WORKER) plus TRAINYARD_INDEX.
MXNet's ps-lite hands out node ids in order of arrival; we derive the torch.distributed rank from
the role and the platform's index instead, so that `worker-1` in the console is always rank
1+S+1 here and a restart lands on the same data shard:

    scheduler -> 0,   server i -> 1 + i,   worker i -> 1 + S + i,   world size 1 + S + W.

Bad values fail here, before any socket is opened, with a message naming the variable.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass

from workers import contract
from workers.ps.errors import ConfigError

SCHEDULER = "scheduler"
SERVER = "server"
WORKER = "worker"
ROLES = (SCHEDULER, SERVER, WORKER)

# Trainyard's own knobs for this runtime. They are read only here; the platform does not set
# them, so the defaults are what every job gets unless a user adds them to the job's env.
TIMEOUT_ENV = "TRAINYARD_PS_TIMEOUT"
JOIN_TIMEOUT_ENV = "TRAINYARD_PS_JOIN_TIMEOUT"
# How long any process waits for a reply, a barrier or a sign of life from a peer before it
# gives up. A dead server must fail the job within 30 s; 20 s leaves room for the report.
DEFAULT_TIMEOUT_S = 20.0
# How long the processes of one job may take to all start (imports, image pulls on a cluster):
# instances are started one by one by different agents, so this is much longer than the above.
DEFAULT_JOIN_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Topology:
    """This process's role and index, the job's shape, and where the scheduler listens."""

    role: str
    index: int
    num_servers: int
    num_workers: int
    root_uri: str
    root_port: int
    timeout_s: float = DEFAULT_TIMEOUT_S
    join_timeout_s: float = DEFAULT_JOIN_TIMEOUT_S

    @property
    def world_size(self) -> int:
        return 1 + self.num_servers + self.num_workers

    @property
    def rank(self) -> int:
        return self.rank_of(self.role, self.index)

    @property
    def label(self) -> str:
        return label(self.role, self.index)

    @property
    def server_ranks(self) -> list[int]:
        return [1 + i for i in range(self.num_servers)]

    @property
    def worker_ranks(self) -> list[int]:
        return [1 + self.num_servers + i for i in range(self.num_workers)]

    def rank_of(self, role: str, index: int) -> int:
        if role == SCHEDULER:
            return 0
        if role == SERVER:
            return 1 + index
        return 1 + self.num_servers + index

    def role_of(self, rank: int) -> tuple[str, int]:
        """The (role, index) that holds a global rank."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside a world of {self.world_size}")
        if rank == 0:
            return SCHEDULER, 0
        if rank <= self.num_servers:
            return SERVER, rank - 1
        return WORKER, rank - 1 - self.num_servers

    def label_of(self, rank: int) -> str:
        return label(*self.role_of(rank))


def label(role: str, index: int) -> str:
    """How the console tags the replica: `scheduler`, `server-0`, `worker-1`."""
    return role if role == SCHEDULER else f"{role}-{index}"


def read_topology(env: Mapping[str, str] | None = None) -> Topology:
    """Parse the environment the platform sets; raise ConfigError naming what is wrong."""
    env = os.environ if env is None else env
    role = _required(env, contract.DMLC_ROLE, "scheduler, server or worker").strip().lower()
    if role not in ROLES:
        raise ConfigError(
            f"{contract.DMLC_ROLE}={env[contract.DMLC_ROLE]!r} is not one of {', '.join(ROLES)}."
        )
    trainyard_role = env.get(contract.TRAINYARD_ROLE)
    if trainyard_role and trainyard_role != role:
        raise ConfigError(
            f"{contract.TRAINYARD_ROLE}={trainyard_role!r} disagrees with "
            f"{contract.DMLC_ROLE}={role!r}; they must name the same role."
        )
    num_servers = _count(env, contract.DMLC_NUM_SERVER, "servers")
    num_workers = _count(env, contract.DMLC_NUM_WORKER, "workers")
    root_uri = _required(env, contract.DMLC_PS_ROOT_URI, "the scheduler's host name or address")
    root_port = _integer(env, contract.DMLC_PS_ROOT_PORT, "a TCP port")
    if not 1 <= root_port <= 65535:
        raise ConfigError(f"{contract.DMLC_PS_ROOT_PORT}={root_port} is not a TCP port (1-65535).")
    index = _index(env, role, num_servers, num_workers)
    timeout_s = _seconds(env, TIMEOUT_ENV, DEFAULT_TIMEOUT_S)
    join_timeout_s = _seconds(env, JOIN_TIMEOUT_ENV, DEFAULT_JOIN_TIMEOUT_S)
    return Topology(
        role=role,
        index=index,
        num_servers=num_servers,
        num_workers=num_workers,
        root_uri=root_uri.strip(),
        root_port=root_port,
        timeout_s=timeout_s,
        join_timeout_s=join_timeout_s,
    )


def _required(env: Mapping[str, str], name: str, meaning: str) -> str:
    value = env.get(name, "")
    if not value.strip():
        raise ConfigError(
            f"{name} is not set. It should be {meaning}; the platform sets it for every process "
            "of a parameter-server job (scheduler, servers, workers)."
        )
    return value


def _integer(env: Mapping[str, str], name: str, meaning: str) -> int:
    value = _required(env, name, meaning)
    try:
        return int(value.strip())
    except ValueError:
        raise ConfigError(f"{name}={value!r} is not a whole number ({meaning}).") from None


def _count(env: Mapping[str, str], name: str, what: str) -> int:
    value = _integer(env, name, f"the number of {what}")
    if value < 1:
        raise ConfigError(f"{name}={value}: a parameter-server job needs at least 1 of its {what}.")
    return value


def _index(env: Mapping[str, str], role: str, num_servers: int, num_workers: int) -> int:
    if role == SCHEDULER:
        # There is exactly one scheduler; an index, if given, can only be 0.
        raw = env.get(contract.TRAINYARD_INDEX, "0").strip() or "0"
        if raw != "0":
            raise ConfigError(f"{contract.TRAINYARD_INDEX}={raw!r}: the scheduler's index is 0.")
        return 0
    count = num_servers if role == SERVER else num_workers
    count_name = contract.DMLC_NUM_SERVER if role == SERVER else contract.DMLC_NUM_WORKER
    index = _integer(env, contract.TRAINYARD_INDEX, f"this {role}'s index, 0 to {count - 1}")
    if not 0 <= index < count:
        raise ConfigError(
            f"{contract.TRAINYARD_INDEX}={index} is out of range for a {role}: "
            f"{count_name}={count} allows 0 to {count - 1}."
        )
    return index


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number of seconds.") from None
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(f"{name}={raw!r} must be a positive number of seconds.")
    return value
