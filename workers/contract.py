"""Names shared by the console and the node agents: env variables, queues, tasks, Redis keys.

Each name is defined once here so that the two sides cannot drift apart.
"""

from typing import Any

# --- How logs, charts and pages name an instance: `[master]`, `[scheduler]`, and
# `[worker-1]`, `[server-0]` for roles with several instances. The console's pages get this
# rule from the server (jobs.page_rules), not from a copy of their own.
SOLO_ROLES = ("master", "scheduler")
TAG_FORMAT = "{role}-{index}"


def first_index(role: str, kvstore: bool) -> int:
    """The index of a role's first instance: a PyTorch job's workers follow its master, rank 0
    (`[master]`, `[worker-1]`, …); a parameter-server job's roles count from 0 (`[server-0]`,
    `[worker-0]`, …)."""
    return 1 if role == "worker" and not kvstore else 0


def tag_of(role: str, index: int) -> str:
    return role if role in SOLO_ROLES else TAG_FORMAT.format(role=role, index=index)


# --- Environment of a PyTorch trainer process (the variables torchrun sets) ---
MASTER_ADDR = "MASTER_ADDR"
MASTER_PORT = "MASTER_PORT"
WORLD_SIZE = "WORLD_SIZE"
RANK = "RANK"
LOCAL_RANK = "LOCAL_RANK"
LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"
NODE_RANK = "NODE_RANK"
# The rest of what torchrun's elastic agent sets, so that libraries that ask whether they run
# under torchrun (torch.distributed.is_torchelastic_launched(): TORCHELASTIC_RUN_ID) take
# their torchrun path: Lightning, Accelerate, ...
GROUP_RANK = "GROUP_RANK"  # the instance's rank among instances (= NODE_RANK)
GROUP_WORLD_SIZE = "GROUP_WORLD_SIZE"  # how many instances
ROLE_NAME = "ROLE_NAME"
ROLE_RANK = "ROLE_RANK"
ROLE_WORLD_SIZE = "ROLE_WORLD_SIZE"
TORCHELASTIC_RUN_ID = "TORCHELASTIC_RUN_ID"
TORCHELASTIC_USE_AGENT_STORE = "TORCHELASTIC_USE_AGENT_STORE"
# Where torch's @record writes the exception that ends a process; the agent reads it back
# and makes it the replica's reason.
TORCHELASTIC_ERROR_FILE = "TORCHELASTIC_ERROR_FILE"
TORCH_NCCL_ASYNC_ERROR_HANDLING = "TORCH_NCCL_ASYNC_ERROR_HANDLING"
TORCHELASTIC_SIGNALS_TO_HANDLE = "TORCHELASTIC_SIGNALS_TO_HANDLE"
SIGNALS_TO_HANDLE = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"  # torchrun's default
TORCHRUN_ROLE = "default"  # torchrun's --role default: every process is in one role
# PyTorch Lightning reads PL_TRAINER_<ARGUMENT> as the default of Trainer(<argument>=...)
# (lightning.pytorch.utilities.argparse._defaults_from_env_vars; an argument the script passes
# wins). Set to the job's instances and processes per instance, so that a script with the
# default num_nodes=1 trains as one group across the instances, not once per instance.
PL_TRAINER_NUM_NODES = "PL_TRAINER_NUM_NODES"
PL_TRAINER_DEVICES = "PL_TRAINER_DEVICES"

# --- Environment of a parameter-server process (MXNet's names) ---
DMLC_ROLE = "DMLC_ROLE"
DMLC_PS_ROOT_URI = "DMLC_PS_ROOT_URI"
DMLC_PS_ROOT_PORT = "DMLC_PS_ROOT_PORT"
DMLC_NUM_SERVER = "DMLC_NUM_SERVER"
DMLC_NUM_WORKER = "DMLC_NUM_WORKER"
# The address this process is reached at (the node's, as its agent advertises it), and the
# network interface to use where the node names one.
DMLC_NODE_HOST = "DMLC_NODE_HOST"
DMLC_INTERFACE = "DMLC_INTERFACE"

# --- Which network interface gloo and NCCL bind to (PyTorch processes), where the node names
# one: without them gloo binds to whatever the host name resolves to, which on a multi-homed
# host (or in a network namespace) may be no interface the peers can reach. ---
GLOO_SOCKET_IFNAME = "GLOO_SOCKET_IFNAME"
NCCL_SOCKET_IFNAME = "NCCL_SOCKET_IFNAME"

# --- Environment every Trainyard process gets ---
TRAINYARD_JOB_ID = "TRAINYARD_JOB_ID"
TRAINYARD_ROLE = "TRAINYARD_ROLE"
TRAINYARD_INDEX = "TRAINYARD_INDEX"
TRAINYARD_CHECKPOINT_DIR = "TRAINYARD_CHECKPOINT_DIR"
# Restarts so far (0 on the first attempt), under Trainyard's name and torch elastic's.
TRAINYARD_RESTART_COUNT = "TRAINYARD_RESTART_COUNT"
TORCHELASTIC_RESTART_COUNT = "TORCHELASTIC_RESTART_COUNT"
TORCHELASTIC_MAX_RESTARTS = "TORCHELASTIC_MAX_RESTARTS"
# An elastic job's resizes so far: a script may tell a new world size from a failure's restart.
TRAINYARD_RESIZE_COUNT = "TRAINYARD_RESIZE_COUNT"


def torchelastic_run_id(job_id: int) -> str:
    """The same for every process and every attempt of a job, as a rendezvous id is."""
    return f"trainyard-job-{job_id}"


TRAINYARD_CODE_ROOT = "TRAINYARD_CODE_ROOT"
# A folder of the instance's own in this attempt, on its node, for scratch files: processes
# start in the job's working folder (workers/workfolder.py), which every instance and attempt
# of the job shares.
TRAINYARD_SCRATCH_DIR = "TRAINYARD_SCRATCH_DIR"
TRAINYARD_KVSTORE = "TRAINYARD_KVSTORE"  # parameter-server jobs: the mode the user picked
# The metrics channel: a file the process appends JSON lines to (see workers/metrics.py).
TRAINYARD_METRICS_FILE = "TRAINYARD_METRICS_FILE"

# --- A job's own environment variables (`env` in a job request) ---
# Names the platform sets: a job may not set them (its value would be overwritten, or would
# break the contract between the processes of the job).
RESERVED_ENV_NAMES = frozenset(
    {
        MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK, LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK,
        GROUP_RANK, GROUP_WORLD_SIZE, ROLE_NAME, ROLE_RANK, ROLE_WORLD_SIZE,
        GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME, "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS",
    }
)  # fmt: skip
RESERVED_ENV_PREFIXES = ("TRAINYARD_", "TORCHELASTIC_", "DMLC_")
# Values of names like these are shown masked to anyone but the job's owner.
SECRET_NAME_PARTS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "KEY", "CREDENTIAL")
MASKED = "••••••••"


def is_reserved_env_name(name: str) -> bool:
    return name in RESERVED_ENV_NAMES or name.startswith(RESERVED_ENV_PREFIXES)


# Names the dynamic loader and the C library act on before a program's own code runs: glibc's
# list of what it removes for setuid programs (UNSECURE_ENVVARS in sysdeps/generic/unsecvars.h),
# without TMPDIR (the sandbox sets it), and every LD_ and MALLOC_ name. A job's variables reach
# only its own trainer, after the privilege drop (workers/jobenv.py); these are refused from
# jobs all the same, so that a mistake in that chain is not a way to root. An admin may set
# them in an image's defaults (an LD_LIBRARY_PATH for its libraries, say).
LOADER_ENV_NAMES = frozenset(
    {
        "GCONV_PATH", "GETCONF_DIR", "GLIBC_TUNABLES", "HOSTALIASES", "LOCALDOMAIN", "LOCPATH",
        "NIS_PATH", "NLSPATH", "RESOLV_HOST_CONF", "RES_OPTIONS", "TZDIR",
    }
)  # fmt: skip
LOADER_ENV_PREFIXES = ("LD_", "MALLOC_")


def is_loader_env_name(name: str) -> bool:
    return name in LOADER_ENV_NAMES or name.startswith(LOADER_ENV_PREFIXES)


def looks_secret(name: str) -> bool:
    return any(part in name.upper() for part in SECRET_NAME_PARTS)


def masked_env(env: dict[str, str]) -> dict[str, str]:
    """`env` as someone other than its owner sees it: values of secret-looking names hidden."""
    return {k: MASKED if looks_secret(k) else v for k, v in env.items()}


# --- The agent protocol: what a start message, a heartbeat and a report carry and mean. Every
# heartbeat and report says which version its agent speaks; the console stores it per node and
# starts replicas only on agents of MIN_AGENT_PROTOCOL or later, so agents of two versions can
# serve side by side through a rolling upgrade (docs/operations.md). Bump PROTOCOL_VERSION when
# an agent learns something the console may rely on; raise MIN_AGENT_PROTOCOL when the console
# starts sending what older agents would misread. Agents from before versioning count as 0.
# 2: a start message may carry the owner's Unix identity and folders named by path
# (ReplicaSpec run_uid/run_gid/run_groups, data_folders, results_folder), which an agent of 1
# would refuse as unknown fields, or would run as a uid of Trainyard's own.
PROTOCOL_VERSION = 2
MIN_AGENT_PROTOCOL = 2
PROTOCOL_FIELD = "protocol"

# The state of a replica the console asked about and this node does not know.
REPLICA_UNKNOWN = "unknown"


def exit_report(
    *,
    job_id: int,
    attempt: int,
    role: str,
    index: int,
    node: str,
    state: str,
    exit_code: int | None,
    reason: str,
    stderr_tail: list[str],
    ended_at: float | None,
    incarnation: str,
    log_ends: dict[str, int] | None = None,
    usage: dict[str, float | int] | None = None,
) -> dict[str, Any]:
    """What TASK_REPLICA_EXITED carries: how one replica ended on a node (or that the node does
    not know it: state REPLICA_UNKNOWN), sent by real agents and the simulated fleet alike.
    `log_ends`: per file writer of the replica's lines, the sequence number its last lines end
    at; the log keeper closes the job's log only once the database has them (so lines Redis
    loses after the exit, and the agent sends again, still come before the end marker); absent
    when there are none. `usage`: what the replica used, from its cgroup's counters
    (workers/cgroups.Usage), where the node enforces limits."""
    report: dict[str, Any] = {
        "job_id": job_id,
        "attempt": attempt,
        "role": role,
        "index": index,
        "node": node,
        "state": state,
        "exit_code": exit_code,
        "reason": reason,
        "stderr_tail": stderr_tail,
        "ended_at": ended_at,
        "incarnation": incarnation,
    }
    if log_ends:
        report["log_ends"] = dict(log_ends)
    if usage is not None:
        report["usage"] = dict(usage)
    return report


# --- Celery queues and task names (tasks are sent by name: neither side imports the other's) ---
CONSOLE_QUEUE = "console"
TASK_START_REPLICA = "trainyard.agent.start_replica"
TASK_STOP_JOB = "trainyard.agent.stop_job"
# A deleted job's checkpoint folder goes (sent to the nodes it ran on; the folder is shared).
TASK_REMOVE_CHECKPOINTS = "trainyard.agent.remove_checkpoints"
# An ended job's working folder goes when its retention ends (workers/workfolder.py); its
# checkpoint folder stays until the job is deleted. An agent older than this task drops it.
TASK_REMOVE_WORKING_FOLDER = "trainyard.agent.remove_working_folder"
# A job's artifacts (workers/artifacts.py): list them, read one file's chunk. The agent answers
# on the reply list the request names (workers/agentreply.py); an agent older than these tasks
# drops them, and the console says the node did not answer.
TASK_LIST_ARTIFACTS = "trainyard.agent.list_artifacts"
TASK_READ_ARTIFACT = "trainyard.agent.read_artifact"
TASK_NODE_HEARTBEAT = "trainyard.console.node_heartbeat"
TASK_REPLICA_STARTED = "trainyard.console.replica_started"
TASK_REPLICA_EXITED = "trainyard.console.replica_exited"
# Console-internal: place waiting jobs (sent on commit by whatever may have made room).
TASK_SCHEDULE = "trainyard.console.schedule"
# The Slurm pass now, not at its next tick: a job for a Slurm pool was just admitted.
TASK_SLURM_NOW = "trainyard.console.slurm_now"
# Console-internal: start a restarting job's next attempt once its back-off is over.
TASK_RESUME_RESTART = "trainyard.console.resume_restart"


# Heartbeats past Celery (issue 24; workers/heartbeat_route.py): while a console worker drains
# heartbeats itself it keeps the flag key set (a TTL of seconds, refreshed), and agents then
# RPUSH their signed heartbeat, as JSON, onto the list instead of sending TASK_NODE_HEARTBEAT.
# An agent may push onto the list and read the flag, nothing more (workers/credentials.py).
HEARTBEATS_KEY = "trainyard:console:heartbeats"
HEARTBEATS_DRAINED_KEY = "trainyard:console:heartbeats-drained"


def node_queue(node_name: str) -> str:
    """The Celery queue a node agent consumes; the console sends a node's work only there."""
    return f"node.{node_name}"


def reply_key_prefix(node_name: str) -> str:
    """A node's reply lists (workers/agentreply.py) start so: its agent may write there only."""
    return f"trainyard:reply:{node_name}:"


def reply_key(node_name: str, token: str) -> str:
    return f"{reply_key_prefix(node_name)}{token}"


def is_reply_key(key: str, node_name: str) -> bool:
    token = key.removeprefix(reply_key_prefix(node_name))
    return token != key and token.isalnum()


# --- Redis keys. The {job:N} hash tag keeps a job's keys on one Redis Cluster slot, which the
# Lua append script needs. ---
def log_stream_key(job_id: int) -> str:
    return f"trainyard:{{job:{job_id}}}:log"


def log_cursor_key(job_id: int) -> str:
    return f"trainyard:{{job:{job_id}}}:cursor"


def log_seen_key(job_id: int) -> str:
    """Per writer, the sequence number of the last batch appended: a resent batch is ignored."""
    return f"trainyard:{{job:{job_id}}}:seen"


def log_ack_key(job_id: int) -> str:
    """Per writer, the sequence number of its last batch the log keeper has in the database:
    what an agent may forget (its keeper's files), and where it sends from again after Redis
    lost writes. Written by the log keeper only after its transaction commits."""
    return f"trainyard:{{job:{job_id}}}:acked"


def log_skip_key(job_id: int) -> str:
    """Per writer, lines its agent dropped on purpose (over the replica's log budget) that are
    not acknowledged yet: "BASE END", the lines after sequence number BASE up to END count as
    acknowledged once the log keeper acknowledges BASE (the database will never hold them, and
    the agent may free them). Written by the append script, applied by the log keeper's."""
    return f"trainyard:{{job:{job_id}}}:skipped"


def log_epoch_key(job_id: int) -> str:
    """Set anew each time the log keeper realigns the job's stream with the database (after a
    Redis restart): an agent that finds its lines missing waits for a new one before it sends
    them again, so it sends from what the database has."""
    return f"trainyard:{{job:{job_id}}}:epoch"


def job_log_keys(job_id: int) -> list[str]:
    """Every key of a job's log, for expiring them once the log is archived in the database."""
    return [
        log_stream_key(job_id), log_cursor_key(job_id), log_seen_key(job_id), log_ack_key(job_id),
        log_skip_key(job_id), log_epoch_key(job_id),
    ]  # fmt: skip


# The Redis server (its INFO run_id) the log keeper last made agree with the database: another
# one means Redis restarted, and may have lost its last writes (appendfsync everysec).
LOG_KEEPER_REDIS_RUN_KEY = "trainyard:logkeeper:redis-run"


def alive_key(job_id: int, attempt: int, tag: str) -> str:
    """Set by a Slurm job's step wrapper every few seconds, expiring after the console's
    TRAINYARD_NODE_LOST_SECONDS: gone, the instance has not been heard from for that long."""
    return f"trainyard:{{job:{job_id}}}:alive:{attempt}:{tag}"


def heard_key(job_id: int, attempt: int) -> str:
    """The tags of an attempt's step wrappers heard from at least once: an alive_key missing
    for one of them is silence, not a start that has not come yet."""
    return f"trainyard:{{job:{job_id}}}:heard:{attempt}"


def rendezvous_key(job_id: int, attempt: int = 0) -> str:
    """Where the master's agent publishes MASTER_PORT once it has found a free port; each
    attempt of a restarted job meets on a port of its own."""
    suffix = f":{attempt}" if attempt else ""
    return f"trainyard:{{job:{job_id}}}:rendezvous{suffix}"


# --- Log stream entry fields ---
# An entry holds a batch of consecutive lines of one process's stdout or stderr. Its stream id is
# "<C>-0" where C is the cursor of the batch's last line, and entries are contiguous in cursor
# space (each takes the cursors after the previous one), so XRANGE from "(<A>-0" finds every line
# after cursor A and a batch's first cursor is C - (number of lines) + 1.
FIELD_ROLE = "r"
FIELD_INDEX = "i"
FIELD_NODE = "n"
FIELD_STREAM = "s"  # "o" (stdout) or "e" (stderr)
FIELD_TS = "t"  # unix time the agent read the batch's first line (the rest within milliseconds)
FIELD_LINES = "l"  # the lines joined by "\n" (a line never holds one: the reader splits on it)
# The job attempt the process belongs to (0 the first run, 1 after the first restart, ...).
# Present only when the attempt is > 0, so entries of a first attempt are byte-for-byte what
# they were before restarts existed; a reader takes an entry without it as attempt 0.
FIELD_ATTEMPT = "a"
# Present only on a marker's entry (workers.logquota): how many lines, and metric points, over
# the replica's log budget were dropped since the previous marker.
FIELD_DROPPED_LINES = "d"
FIELD_DROPPED_POINTS = "dp"
FIELD_END = "end"  # present only on the job's final entry: the reason the log ended
# The batch's writer and its sequence number (for a file's lines: the offset they end at), put
# there by the append script: the log keeper archives each (writer, sequence number) once, so
# lines an agent sends again after Redis lost them are never kept twice.
FIELD_WRITER = "w"
FIELD_SEQ = "q"
STREAM_STDOUT = "o"
STREAM_STDERR = "e"
STREAM_METRIC = "m"  # the "lines" are metric points, one JSON object each (workers.metricparse)


def snapshot_key(sha256: str) -> str:
    """A code snapshot's archive (workers/snapshot.py), put there by the console for agents."""
    return f"trainyard:snapshot:{sha256}"
