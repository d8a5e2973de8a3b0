"""The agent's supervisor: owns every trainer process on this node, from start to reported exit.

Shaped like torch's elastic agent: each replica goes through `_rendezvous`, `_start`,
`_monitor` and, always, `_stop` in one thread of its own, and its outcome is reported to the
console only after every line it printed is in Redis. Celery only hands it short messages
("start this replica", "stop that job"); the processes belong to the supervisor, not to Celery.

Trainers outlive the agent for a while, never for good:
- each replica's processes are held by a keeper (workers/keeper.py), a small process in a
  session of its own that starts them (each dies with the keeper, through workers/deathsig.py),
  copies their output to files and records their exits. An agent that starts again on this
  work dir within the keeper's grace takes the replica over (`adopt`) and ships its lines on
  from where they stopped; if none comes, the keeper stops the processes;
- on SIGTERM the agent hands its replicas over (`shutdown(hand_over=True)`): a restart or an
  upgrade does not touch them. A stop message, a drain, or a shutdown asked to stop them
  (SIGUSR2) stops them as before;
- each trainer leads its own process group, recorded in `<workdir>/procs` for as long as the
  group lives (workers/procrecords.py). The agent's guardian (workers/guardian.py) or the next
  agent on this work dir kills what is left in those groups once their keeper is gone. A
  process that leaves its group (setsid) escapes all of this; only a cgroup per replica would
  hold it.

Messages are idempotent: a start of a replica that runs, or ended lately, starts nothing and
re-sends what was already reported; a stop of a replica this node does not run says so.
"""

import dataclasses
import enum
import functools
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import redis

from workers import (
    cgroups,
    checkpoint_retention,
    containers,
    contract,
    folderaccess,
    images,
    inventory,
    jobenv,
    jobfiles,
    jobfolders,
    keeper,
    limits,
    sandbox,
    unixids,
    workfolder,
)
from workers.diskspace import DiskWatch, is_no_room
from workers.filetail import FileTail
from workers.folderaccess import NamedFolder
from workers.keeperlink import KeeperLink, KeptProcess, SpareKeepers, folder_name
from workers.launcher import (
    TRAINER_LIB,
    WORKERS_PACKAGE,
    LocalProcess,
    NodeNetwork,
    build_processes,
    error_file,
)
from workers.logquota import LogLimits
from workers.logship import FILE_WRITER_PREFIX, LogShipper, ReplicaKey
from workers.logsink import Ledger
from workers.metricfeed import MetricTail, SampledInstance, SystemSampler
from workers.metricparse import Point, RegexScanner, compile_definitions
from workers.procrecords import ProcRecords, Reaped, reap_all
from workers.programs import ProgramError, resolve_program, resolve_under_root
from workers.snapshot import SnapshotCache, SnapshotError
from workers.spec import ReplicaSpec
from workers.tracebacks import ended_with_error, own_error
from workers.unixids import JobUser

log = logging.getLogger(__name__)

# How long a non-master replica waits for the master's agent to publish MASTER_PORT.
RENDEZVOUS_TIMEOUT_SECONDS = 600.0
RENDEZVOUS_POLL_SECONDS = 0.02
# Between SIGTERM and SIGKILL when stopping a process group.
STOP_GRACE_SECONDS = 5.0
# After SIGKILL, how long to wait for the keeper to see every group gone; a group still there
# after that (a process stuck in the kernel) keeps its record, for the guardian or the next agent.
KILL_WAIT_SECONDS = 5.0
# How long a file's reader, at the file's end, waits at a time for its last lines to reach Redis
# (Redis's answers may ask it to read them again).
DRAIN_WAIT_SECONDS = 1.0
# How long an ended replica's files are kept for the log keeper to acknowledge their last lines
# (Redis may lose them after the exit, and they are then sent again from the files); after that
# they go, so that a keeper that never answers cannot fill the disk (the console closes the
# log as long after the end: jobs/services/logarchive.py).
FILES_KEPT_FOR_ARCHIVE_SECONDS = 600.0
ARCHIVE_POLL_SECONDS = 0.5
# While an adopted replica waits for Redis to say where its lines stopped.
RESUME_RETRY_SECONDS = 0.5
MONITOR_INTERVAL_SECONDS = 0.1
STDERR_TAIL_LINES = 20
# How long a failure's reason waits for the failed rank's stderr reader to read its file to the
# end (it polls the keeper's file; on a loaded machine it can lag the exit record).
STDERR_CATCH_UP_SECONDS = 2.0
# Outcomes remembered, so that a start or stop that comes again gets the same answer.
FINISHED_KEEP_SECONDS = 600.0
FINISHED_KEEP_MAX = 1000
# Outside a shutdown, waits on Redis (log flush, reports) are unbounded; they say so this often.
STILL_WAITING_WARNING_SECONDS = 60.0
WAIT_SLICE_SECONDS = 0.1
FIRST_WAIT_SLICE_SECONDS = 0.002
NODE_AGENT_SHUT_DOWN = "the node agent shut down"
# Written in a job's checkpoint folder by its first attempt; a restart looks for it.
CHECKPOINT_MARKER = ".trainyard-job"


class Report(Protocol):
    def __call__(
        self, task_name: str, payload: dict[str, Any], deadline: float | None = None
    ) -> None:
        """Send one report to the console.

        `deadline` (a time.monotonic() value) is when the caller stops waiting, during a
        shutdown: retry only until then. None: retry as long as a broker outage may last.
        """


# A replica on this node: job id, attempt, role, index.
Ident = tuple[int, int, str, int]


class ReplicaState(enum.Enum):
    """Lifecycle of one replica on this node.

    WAITING -> RUNNING -> SUCCEEDED | FAILED | STOPPED; WAITING -> FAILED | STOPPED when the
    rendezvous times out or the job is stopped before the processes start. UNKNOWN is only
    reported, for a replica the console expects here and this node does not know.
    """

    WAITING = "waiting"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"
    UNKNOWN = contract.REPLICA_UNKNOWN


# What heartbeats call a replica that is ending: a stop was requested, or its processes ended
# and it is shipping their last lines before it reports the exit.
STOPPING = "stopping"


class _StopRequested(Exception):
    pass


class _HandedOver(Exception):
    """The agent is going and leaves the replica to its keeper, for the next agent."""


@dataclass
class _ReplicaRun:
    spec: ReplicaSpec
    key: ReplicaKey
    state: ReplicaState = ReplicaState.WAITING
    # Holds the processes (workers/keeper.py); set once they run.
    keeper: KeeperLink | None = None
    # Taken over from an earlier agent, whose keeper held it meanwhile.
    adopted: bool = False
    # Names this start of the replica in its writers' names (see _writer).
    nonce: str = ""
    readers: list[FileTail] = field(default_factory=list)
    stop_requested: threading.Event = field(default_factory=threading.Event)
    stop_reason: str = ""
    stop_requested_at: float = 0.0  # time.time(), as the keeper stamps exits
    stop_grace: float = STOP_GRACE_SECONDS
    handed_over: threading.Event = field(default_factory=threading.Event)
    stderr_tail: deque[str] = field(default_factory=lambda: deque(maxlen=STDERR_TAIL_LINES))
    # The reader of each local rank's output file (its stderr in it), by local rank.
    stderr_readers: dict[int, FileTail] = field(default_factory=dict)
    gpu_ids: list[int] = field(default_factory=list)
    cores: list[int] = field(default_factory=list)  # its own cores (cpuset); empty: shared
    thread: threading.Thread | None = None
    tails: list[MetricTail] = field(default_factory=list)
    # Its regex metrics, matched on the pipe readers' threads (never the heartbeat's), under
    # a CPU budget of their own.
    regex_metrics: RegexScanner | None = None
    sampled: SampledInstance | None = None
    started_report: dict[str, Any] | None = None
    ended_at: float | None = None  # unix time the outcome was decided (first failure seen)
    containers: list[str] = field(default_factory=list)  # names, for jobs on container images
    instance_dir: Path | None = None  # this attempt's folder of the instance, once started
    failed_local_rank: int | None = None  # the process whose failure ended the replica
    cgroup: cgroups.InstanceGroup | None = None  # its limits and counters, where enforced
    # For a job in containers: the group above the runtime's groups for its containers, which
    # holds them to the package and counts what they use (the runtime's client is in `cgroup`).
    container_group: cgroups.InstanceGroup | None = None
    # The folders the job named by path, as checked on this node for its user.
    named: tuple[NamedFolder, ...] = ()
    # Set when the agent stops the replica for a limit (the disk's): its failure's reason.
    limit_reason: str = ""
    limit_stop_at: float = 0.0  # monotonic time of that stop, for the SIGKILL after the grace
    limits_checked_at: float = 0.0
    disk_warned: bool = False
    process_limit_told: bool = False

    @property
    def ident(self) -> "Ident":
        return (self.spec.job_id, self.spec.attempt, self.spec.role, self.spec.index)


@dataclass(frozen=True)
class _Outcome:
    """A finished replica's exit report, kept to answer a start or stop that comes again."""

    report: dict[str, Any]
    kept_until: float  # time.monotonic()


@dataclass(frozen=True)
class _Closing:
    """The deadlines of a shutdown, all time.monotonic() values.

    Processes get SIGKILL by `kill_by`; the wait for log lines to reach Redis ends at
    `flush_until` (unsent lines stay in the spool, which the next agent sends); the exit
    reports are given up at `give_up_at`, when shutdown() returns.
    """

    kill_by: float
    flush_until: float
    give_up_at: float

    @classmethod
    def within(cls, timeout: float) -> "_Closing":
        now = time.monotonic()
        return cls(
            kill_by=now + min(STOP_GRACE_SECONDS, 0.4 * timeout),
            flush_until=now + timeout - min(2.0, 0.2 * timeout),
            give_up_at=now + timeout,
        )


# An error file longer than this is not one torch wrote: it is not read.
MAX_ERROR_FILE_BYTES = 1 << 20
MAX_RECORDED_MESSAGE = 500


def recorded_error(path: Path, below: Path, uid: int) -> str | None:
    """The exception a process recorded before it died (torch.distributed.elastic's @record:
    {"message": {"message": "RuntimeError: ...", "extraInfo": {...}}}), or None. The file is
    in the job's own folder: it is read only as the job's regular file (workers/jobfiles.py),
    `below` being a folder above it that no job can write to and `uid` the job's."""
    try:
        raw = jobfiles.read_file(path, below, uid, limit=MAX_ERROR_FILE_BYTES + 1)
        if len(raw) > MAX_ERROR_FILE_BYTES:
            return None
        data = json.loads(raw.decode(errors="replace"))
    except (OSError, ValueError, jobfiles.UnsafeFile):
        return None
    message = data.get("message") if isinstance(data, dict) else None
    if isinstance(message, dict):
        message = message.get("message")
    if not isinstance(message, str) or not message.strip():
        return None
    one_line = " ".join(message.split())
    if len(one_line) > MAX_RECORDED_MESSAGE:
        one_line = one_line[: MAX_RECORDED_MESSAGE - 1] + "…"
    return one_line


def describe_exit(code: int) -> str:
    """Why a process ended, as a reason reads: `exited with code 3`, `killed by signal SIGKILL`."""
    if code >= 0:
        return f"exited with code {code}"
    try:
        return f"killed by signal {signal.Signals(-code).name}"
    except ValueError:
        return f"killed by signal {-code}"


class Supervisor:
    def __init__(
        self,
        node: str,
        client: redis.Redis,
        shipper: LogShipper,
        report: Report,
        workdir: Path,
        code_root: Path,
        gpus: int = 0,
        incarnation: str | None = None,
        checkpoint_root: Path | None = None,
        network: NodeNetwork | None = None,
        trainer_python: str = sys.executable,
        container_runtime: containers.Runtime | None = None,
        image_cache_bytes: int = images.DEFAULT_CACHE_BYTES,
        trainer_sandbox: sandbox.Sandbox | None = None,
        keep_job_folders: int | None = None,
        keep_checkpoints: int = 0,
        keeper_grace: float = keeper.DEFAULT_GRACE_SECONDS,
        disk: DiskWatch | None = None,
        spare_keepers: int = 0,
        instance_limits: cgroups.Cgroups | None = None,
        agent_oom_lowered: bool = False,
    ) -> None:
        self.node = node
        # Keepers started ahead of the next replicas (workers/keeperlink.py), so that a start
        # does not wait for a keeper's interpreter; the agent asks for some, unit tests of the
        # supervisor's other concerns do not. Started after adopt(): a restarted agent's
        # takeover runs against its keepers' grace, and comes first.
        self._spare_keepers = (
            SpareKeepers(start=False, count=spare_keepers) if spare_keepers > 0 else None
        )
        # How long a replica's keeper waits for an agent before it stops the processes.
        self.keeper_grace = keeper_grace
        # The work disk's free space (workers/diskspace.py): no start while it is full, and a
        # failure while it is full says so. None: not watched (unit tests of other concerns).
        self.disk = disk
        # How many of a job's newest checkpoints stay once it ends here (0: all).
        self.keep_checkpoints = keep_checkpoints
        # How many ended jobs' folders stay for inspection (workers/jobfolders.py); None: all.
        self.keep_job_folders = keep_job_folders
        # How trainers are held apart (workers/sandbox.py); None: not at all, as in unit tests
        # of the supervisor's other concerns.
        self.sandbox = trainer_sandbox or sandbox.Sandbox(
            sandbox.Isolation.NONE, reason="no sandbox was asked for"
        )
        # A cgroup per instance (workers/cgroups.py); None: none, as in unit tests of the
        # supervisor's other concerns.
        self.limits = instance_limits or cgroups.Cgroups(
            cgroups.Layout.NONE, "no limits were asked for"
        )
        # Trainers take back a normal OOM score only where the agent gave itself a low one
        # (which its keepers inherit); raising a score needs no privilege.
        self._trainer_oom_score = limits.TRAINER_OOM_SCORE if agent_oom_lowered else None
        # Names this agent process in every report, so the console can tell a restarted agent
        # (which knows nothing of its predecessor's replicas) from the same one repeating itself.
        self.incarnation = incarnation or f"{os.getpid()}-{time.time_ns()}"
        self._redis = client
        self._shipper = shipper
        self._report = report
        self._workdir = workdir
        self._code_root = code_root
        # The trainers' interpreter: the agent's own, or the environment that holds the
        # frameworks (a GPU host's agent can run from a small environment of its own).
        self._trainer_python = trainer_python
        self._network = network or NodeNetwork(address="127.0.0.1", interface=None)
        # docker or podman, for jobs whose image is a container; None: this node has neither.
        self._container_runtime = container_runtime
        # The images this node's containers run: pulled once, the least used removed.
        self._images = (
            images.ImageCache(container_runtime, node, workdir / "images.json", image_cache_bytes)
            if container_runtime is not None
            else None
        )
        self._pruning = threading.Lock()
        # Shared by every node in a cluster: a restart on another node resumes from it.
        self.checkpoint_root = checkpoint_root or workdir / "checkpoints"
        self.records = ProcRecords(workdir / "procs")
        self.keepers_dir = workdir / "keepers"
        self.snapshots = SnapshotCache(client, workdir / "snapshots")
        self._free_gpus = set(range(gpus))
        self._free_cores = set(self.limits.cores)
        self._runs: dict[Ident, _ReplicaRun] = {}
        self._finished: OrderedDict[Ident, _Outcome] = OrderedDict()
        self._lock = threading.Lock()
        self._closing: _Closing | None = None
        # Jobs deleted since this agent started: their ended replicas' files wait for no
        # acknowledgement (the log keeper archives no deleted job's lines).
        self._deleted_jobs: set[int] = set()
        self._sampler = SystemSampler(self._sampled_instances, gpu_usage=inventory.gpu_usage)
        self._sampler.start()

    # --- what Celery tasks call ---

    def start(self, spec: ReplicaSpec) -> bool:
        """Start a replica unless this node has it; safe to call twice.

        Returns False when nothing was started: the replica runs (its start is reported again
        if its processes run) or ended lately (its exit is reported again).
        """
        ident = (spec.job_id, spec.attempt, spec.role, spec.index)
        with self._lock:
            if self._closing is not None:
                raise RuntimeError("agent is shutting down")
            current = self._runs.get(ident)
            outcome = self._recent_outcome(ident)
            if current is None and outcome is None:
                self._launch(spec)
                return True
            # Answered outside the lock: a report may wait for the broker.
            if current is not None:
                runs = current.state == ReplicaState.RUNNING and not current.stop_requested.is_set()
                answer = (contract.TASK_REPLICA_STARTED, current.started_report if runs else None)
            else:
                assert outcome is not None
                answer = (contract.TASK_REPLICA_EXITED, outcome.report)
        if answer[1] is not None:
            self._send_report(answer[0], answer[1])
        return False

    def _launch(self, spec: ReplicaSpec) -> None:
        """Call with the lock held."""
        key = ReplicaKey(spec.job_id, spec.role, spec.index, self.node, attempt=spec.attempt)
        run = _ReplicaRun(spec, key)
        if spec.log_limits:
            self._shipper.limit(key, LogLimits.from_dict(spec.log_limits))
        if spec.gpus:
            run.gpu_ids = sorted(self._free_gpus)[: spec.gpus]
            self._free_gpus -= set(run.gpu_ids)
        if 0 < spec.cpus <= len(self._free_cores):
            # Cores of its own where the node has that many free; else the quota alone. From
            # the highest: core 0 takes most of the system's own work (interrupts, daemons).
            run.cores = sorted(self._free_cores, reverse=True)[: spec.cpus]
            self._free_cores -= set(run.cores)
        self._runs[run.ident] = run
        # A daemon only so that a thread stuck on an unreachable Redis cannot keep a dying
        # agent alive: shutdown() waits for these threads up to its deadline, and whatever
        # still runs after the agent exits is held by its keeper, which stops it after its
        # grace unless a new agent takes it over.
        run.thread = threading.Thread(
            target=self._run, args=(run,), name=f"replica-{spec.job_id}-{spec.tag}", daemon=True
        )
        run.thread.start()

    def stop_job(
        self,
        job_id: int,
        reason: str,
        replicas: list[dict[str, Any]] | None = None,
        up_to_attempt: int | None = None,
        grace_seconds: float | None = None,
        only_listed: bool = False,
    ) -> int:
        """Stop every process of the job on this node (of attempts up to `up_to_attempt`, when
        given: a restart stops the old attempt, never the next); returns how many replicas it
        stopped. The processes get `grace_seconds` between SIGTERM and SIGKILL.

        `replicas` ([{"role", "index", "attempt"}]) are those the console expects on this node:
        each one this node does not run gets its exit report again if it ended lately, or a
        report that it is unknown here. Process groups of the job that an earlier agent left
        are killed too: a stop ends every process of the job, whether this agent knows it or
        not. With `only_listed`, only the replicas named stop (the console found them running
        where it wants none): the job's other replicas here go on.
        """
        listed = set(_replica_idents(replicas or []))
        with self._lock:
            runs = [
                r
                for (j, attempt, role, index), r in self._runs.items()
                if j == job_id
                and (up_to_attempt is None or attempt <= up_to_attempt)
                and (not only_listed or (attempt, role, index) in listed)
            ]
            known = {(r.spec.attempt, r.spec.role, r.spec.index) for r in runs}
            answers: list[dict[str, Any]] = []
            for attempt, role, index in sorted(listed):
                if (attempt, role, index) not in known:
                    outcome = self._recent_outcome((job_id, attempt, role, index))
                    answers.append(
                        outcome.report
                        if outcome
                        else self._unknown_report(job_id, attempt, role, index)
                    )
        for run in runs:
            self._request_stop(run, reason, grace_seconds)
        with self._lock:
            # The groups this agent supervises stop gracefully through their own threads; no
            # new process starts in a replica once its stop is requested.
            supervised = frozenset(pid for r in self._runs.values() for pid in _pids(r))
        self._reap_recorded(job_id, spare=supervised)
        for answer in answers:
            self._send_report(contract.TASK_REPLICA_EXITED, answer)
        return len(runs)

    def running(self) -> list[dict[str, Any]]:
        """The replicas this node has, for heartbeats: state waiting, running or stopping."""
        with self._lock:
            runs = list(self._runs.values())
        return [
            {
                "job_id": r.spec.job_id,
                "attempt": r.spec.attempt,
                "role": r.spec.role,
                "index": r.spec.index,
                "state": (
                    r.state.value
                    if r.state in (ReplicaState.WAITING, ReplicaState.RUNNING)
                    and not r.stop_requested.is_set()
                    else STOPPING
                ),
                "pids": _pids(r),
            }
            for r in runs
        ]

    def finished(self) -> list[dict[str, Any]]:
        """The replicas that ended in the last FINISHED_KEEP_SECONDS, oldest first."""
        with self._lock:
            self._forget_old_outcomes()
            outcomes = list(self._finished.values())
        keys = ("job_id", "attempt", "role", "index", "state", "exit_code", "reason", "ended_at")
        return [{k: o.report[k] for k in keys} for o in outcomes]

    def reap_leftovers(self) -> list[Reaped]:
        """Kill what an earlier agent on this work dir left (call before starting anything),
        and remove the containers it ran; what a live keeper holds is spared (see adopt)."""
        if self._container_runtime is not None:
            kept = {name for link in KeeperLink.found(self.keepers_dir) if link.alive()
                    for name in link.replica().get("containers", [])}  # fmt: skip
            try:
                listed = subprocess.run(
                    containers.leftovers_argv(
                        self._container_runtime.path, self.node, self._workdir
                    ),
                    env=self._container_runtime.env(),
                    capture_output=True, text=True, timeout=30, check=False,
                )  # fmt: skip
                self._remove_containers([n for n in listed.stdout.split() if n not in kept])
            except (OSError, subprocess.TimeoutExpired) as exc:
                log.warning("could not list this node's leftover containers: %s", exc)
        return reap_all(self.records)

    def adopt(self) -> list[str]:
        """Take over the replicas an earlier agent on this work dir left to their keepers
        (call after reap_leftovers, before the first heartbeat, so that the console sees them
        running under this incarnation); returns them as `job/tag`. A replica that ended
        meanwhile is reported as it ended; one whose keeper died, as failed."""
        adopted = []
        for link in KeeperLink.found(self.keepers_dir):
            try:
                doc = link.replica()
                spec = ReplicaSpec.from_dict(doc["spec"])
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.warning("cannot take over the replica in %s: %s", link.folder, exc)
                continue
            key = ReplicaKey(spec.job_id, spec.role, spec.index, self.node, attempt=spec.attempt)
            run = _ReplicaRun(spec, key, state=ReplicaState.RUNNING, keeper=link, adopted=True)
            run.nonce = str(doc.get("nonce", ""))
            run.gpu_ids = [int(g) for g in doc.get("gpu_ids", [])]
            run.cores = [int(c) for c in doc.get("cores", [])]
            run.containers = [str(c) for c in doc.get("containers", [])]
            run.instance_dir = Path(doc["instance_dir"]) if doc.get("instance_dir") else None
            if self.limits.enforced:
                # Its processes are still in the group the earlier agent made.
                name = folder_name(spec.job_id, spec.attempt, spec.tag)
                group = self.limits.group(name)
                run.cgroup = group if group.exists() else None
                if run.containers and self.limits.containers is not None:
                    group = self.limits.containers.group(name)
                    run.container_group = group if group.exists() else None
            link.claim()  # at once: its grace runs
            with self._lock:
                if run.ident in self._runs:
                    continue
                if spec.log_limits:
                    self._shipper.limit(key, LogLimits.from_dict(spec.log_limits))
                self._free_gpus -= set(run.gpu_ids)
                self._free_cores -= set(run.cores)
                self._runs[run.ident] = run
                run.thread = threading.Thread(
                    target=self._run, args=(run,), name=f"replica-{spec.job_id}-{spec.tag}",
                    daemon=True,
                )  # fmt: skip
                run.thread.start()
            adopted.append(f"{spec.job_id}/{spec.tag}")
        if self._spare_keepers is not None:
            self._spare_keepers.replenish()
        return adopted

    def shutdown(self, timeout: float = 30.0, hand_over: bool = False) -> None:
        """End within `timeout` seconds even when Redis is unreachable, and leave no process
        unheld. With `hand_over`, replicas whose processes run are left to their keepers (the
        next agent takes them over; lines not yet shipped stay in the keepers' files); the
        others, and all of them without it, are stopped and their exits reported."""
        with self._lock:
            self._closing = _Closing.within(timeout)
            closing = self._closing
            runs = list(self._runs.values())
        self._sampler.stop()
        if self._spare_keepers is not None:
            self._spare_keepers.close()
        for run in runs:
            if hand_over and run.keeper is not None and not run.stop_requested.is_set():
                run.handed_over.set()
            else:
                self._request_stop(run, NODE_AGENT_SHUT_DOWN)
        for run in runs:
            if run.thread is not None:
                # Each thread bounds its own waits by the same deadlines; this is a backstop.
                run.thread.join(max(0.0, closing.give_up_at - time.monotonic()) + 0.5)
                if run.thread.is_alive():
                    log.warning("replica %s of job %s still ending", run.spec.tag, run.spec.job_id)

    # --- one replica, in its own thread ---

    def _run(self, run: _ReplicaRun) -> None:
        exit_code: int | None = None
        reason = ""
        try:
            if run.adopted:
                # Already running under its keeper: a full disk refuses new starts, not this.
                self._resume(run)
            else:
                self._refuse_on_full_disk()
                port = self._rendezvous(run)
                self._start(run, port)
            exit_code = self._monitor(run)
            if exit_code is None:
                raise _StopRequested
            run.state = ReplicaState.SUCCEEDED if exit_code == 0 else ReplicaState.FAILED
            reason = "" if exit_code == 0 else self._failure_reason(run, exit_code)
        except _HandedOver:
            self._let_go(run)
            return
        except _StopRequested:
            run.state = ReplicaState.STOPPED
            reason = self._stopped_reason(run)
        except Exception as exc:  # anything else is a failure of this replica, reported below
            log.exception("replica %s of job %s failed to run", run.spec.tag, run.spec.job_id)
            run.state = ReplicaState.FAILED
            reason = self._with_disk_reason(str(exc) or type(exc).__name__, exc)
        self._stop(run)
        # Read once every process is gone, then the group goes (one left with a process in
        # it, which only a stuck process makes, goes at the agent's next start: sweep()).
        usage = self._usage(run)
        if run.container_group is not None:
            # conmon outlives its container by moments, in a group below the instance's.
            gone_by = time.monotonic() + KILL_WAIT_SECONDS
            while run.container_group.pids() and time.monotonic() < gone_by:
                time.sleep(0.05)
        for group in (run.cgroup, run.container_group):
            if group is not None:
                group.remove()
        if run.state == ReplicaState.STOPPED and run.keeper is not None:
            # How its processes ended, as they did: -15 for one that obeyed the SIGTERM.
            codes = [self._exit_code(run, e["code"]) for e in run.keeper.exits() if e]
            exit_code = next((c for c in codes if c != 0), 0 if codes else None)
        if run.ended_at is None:
            run.ended_at = time.time()
        self._finish(run, exit_code, reason, usage)
        for rank in range(len(run.readers)):
            self._shipper.unwatch(self._writer(run, "output", rank))
        if run.keeper is not None:
            run.keeper.release()
            if not any(r.is_alive() for r in run.readers):
                # Every line is read (and in Redis, or in the spool): the files go once the
                # database has them too.
                self._remove_files_once_archived(run)

    def _log_ends(self, run: _ReplicaRun) -> dict[str, int]:
        """Per output file writer of the replica, the sequence number its last lines end at."""
        ends = {}
        for rank in range(len(run.readers)):
            writer = self._writer(run, "output", rank)
            if (seq := self._shipper.last_seq(writer)) >= 0:
                ends[writer] = seq
        return ends

    def _remove_files_once_archived(self, run: _ReplicaRun) -> None:
        """Remove the ended replica's files once the log keeper has every line of them in the
        database, sending lines again from them meanwhile if Redis loses them (in the
        background: the replica's end is reported already). During a shutdown they go at once,
        as before acknowledgements: the spool has what is not in Redis, and a next agent would
        take a folder left behind for a replica to adopt."""
        assert run.keeper is not None
        folder = run.keeper.folder
        ends = self._log_ends(run)
        if not ends or self._closing is not None:
            shutil.rmtree(folder, ignore_errors=True)
            return

        def keep() -> None:
            try:
                self._send_until_archived(run, ends)
            finally:
                for writer in ends:
                    self._shipper.forget(writer)
                shutil.rmtree(folder, ignore_errors=True)

        _in_background(keep, f"archive-{run.spec.job_id}-{run.spec.tag}")

    def _send_until_archived(self, run: _ReplicaRun, ends: dict[str, int]) -> None:
        """Wait until the database has each writer's lines up to its end; whenever Redis has
        fewer of them than were sent (it lost its last writes), read the file again from what
        Redis and the database hold. Bounded: FILES_KEPT_FOR_ARCHIVE_SECONDS after the
        replica's end (its keeper's record of it, so an agent that restarts meanwhile and
        takes the ended replica over again waits no longer), and no longer than until its job
        is deleted."""
        # Wall-clock time, as the keeper records the end.
        give_up_at = (run.ended_at or time.time()) + FILES_KEPT_FOR_ARCHIVE_SECONDS
        ranks = {self._writer(run, "output", rank): rank for rank in range(len(run.readers))}
        owed = dict(ends)
        while owed:
            for writer, end in list(owed.items()):
                ledger = self._shipper.ledger(run.spec.job_id, writer)
                try:
                    if ledger.acked() >= end:
                        del owed[writer]
                    elif ledger.seen() < end:
                        self._send_again(run, writer, ranks[writer], ledger)
                except redis.RedisError as exc:  # Redis away: its answers come when it is back
                    log.debug("job %s %s: waiting for Redis: %s", run.spec.job_id, writer, exc)
            if not owed or self._closing is not None:
                return
            if run.spec.job_id in self._deleted_jobs:
                log.info(
                    "job %s %s: the job is deleted; its files go without its last lines "
                    "archived", run.spec.job_id, run.spec.tag,
                )  # fmt: skip
                return
            if time.time() > give_up_at:
                log.warning(
                    "job %s %s: the log keeper did not acknowledge the last lines of %s within "
                    "%.0f s; their files are removed",
                    run.spec.job_id, run.spec.tag, sorted(owed), FILES_KEPT_FOR_ARCHIVE_SECONDS,
                )  # fmt: skip
                return
            time.sleep(ARCHIVE_POLL_SECONDS)

    def _send_again(self, run: _ReplicaRun, writer: str, rank: int, ledger: Ledger) -> None:
        """Read an ended replica's output file again from where Redis and the database have
        its lines, to its end (a gap Redis answers is filled as while it ran)."""
        assert run.keeper is not None
        # Never before what the database had when the file was read (its blocks there may be
        # freed): Redis may have lost its acknowledgement too, until the keeper realigns.
        offset = max(ledger.seen(), ledger.acked(), run.readers[rank].acked, 0)
        log.warning(
            "job %s %s: Redis lost lines of %s after offset %s, after the replica ended: "
            "reading them again",
            run.spec.job_id, run.spec.tag, writer, offset,
        )  # fmt: skip
        holder: list[FileTail] = []
        tail = FileTail(
            run.keeper.output(rank),
            offset,
            self._emitter(run, writer, holder, scan=False),
            lambda: True,
            name=f"{run.spec.job_id}-{run.spec.tag}-again{rank}",
            ledger=ledger,
            drained=lambda: self._shipper.flush(DRAIN_WAIT_SECONDS),
        )
        holder.append(tail)
        self._shipper.watch(writer, tail.rewind)
        try:
            tail.start()
            tail.join()
        finally:
            self._shipper.unwatch(writer)

    def _let_go(self, run: _ReplicaRun) -> None:
        """Hand the replica over: ship what was read, and leave the rest in its keeper's files."""
        for reader in run.readers:
            reader.stop()
        for tail in run.tails:
            tail.stop()
        closing = self._closing
        for thread in [*run.readers, *run.tails]:
            thread.join(max(0.0, self._bounded(time.monotonic() + 1.0, lambda c: c.flush_until)))
        if closing is not None:
            self._shipper.flush(max(0.0, closing.flush_until - time.monotonic()))
        for rank in range(len(run.readers)):
            self._shipper.unwatch(self._writer(run, "output", rank))
        assert run.keeper is not None
        run.keeper.detach()
        with self._lock:
            self._runs.pop(run.ident, None)
        log.info("job %s %s left to its keeper", run.spec.job_id, run.spec.tag)

    def _rendezvous(self, run: _ReplicaRun) -> int:
        key = contract.rendezvous_key(run.spec.job_id, run.spec.attempt)
        if run.spec.hosts_rendezvous:
            port = _free_port(run.spec.master_addr)
            self._redis.set(key, port, ex=7 * 24 * 3600)
            return port
        deadline = time.monotonic() + RENDEZVOUS_TIMEOUT_SECONDS
        told = False
        while time.monotonic() < deadline:
            try:
                value = self._redis.get(key)
            except redis.RedisError as exc:
                # Redis may be restarting: keep waiting, as for a master that is late.
                if not told:
                    log.warning(
                        "job %s %s: rendezvous not readable: %s", run.spec.job_id, run.spec.tag, exc
                    )
                    told = True
                value = None
            if value is not None:
                return int(value)
            # The master's agent publishes its port as its first step: this wait is short,
            # and every moment of it delays this instance's trainers.
            if run.stop_requested.wait(RENDEZVOUS_POLL_SECONDS):
                raise _StopRequested
        raise TimeoutError(
            f"the master did not publish its port within {RENDEZVOUS_TIMEOUT_SECONDS:.0f} s"
        )

    def _start(self, run: _ReplicaRun, master_port: int) -> None:
        spec = run.spec
        job_dir = self._workdir / "jobs" / str(spec.job_id) / f"attempt-{spec.attempt}" / spec.tag
        job_dir.mkdir(parents=True, exist_ok=True)
        run.instance_dir = job_dir
        # First: a restart where the shared root is not shared must not start afresh.
        checkpoint_dir = self._checkpoint_dir(spec)
        # Every trainer of the job starts in the job's one working folder (workers/workfolder.py)
        # on the shared root, so what a script saves where it stands is found on any node.
        cwd = workfolder.folder_of(self.checkpoint_root, spec.job_id, spec.checkpoint_key)
        cwd.mkdir(parents=True, exist_ok=True)
        try:
            script, code = self._program(run, cwd)
        except (ProgramError, SnapshotError, workfolder.WorkFolderError) as exc:
            raise RuntimeError(f"cannot run the program on {self.node}: {exc}") from None
        user = self._user_of(run)
        run.named = self._named_folders(spec, user)
        if spec.container_image:
            self._ensure_image(run)
        # The folders the trainer writes to become its own; nobody else's trainers enter.
        sandbox.prepare_scratch(job_dir)
        for folder in (*sandbox.scratch_folders(job_dir), checkpoint_dir, cwd):
            self.sandbox.hand_over(folder, user)
        joined = self._make_cgroup(run)
        kept: list[KeptProcess] = []
        metrics_files: list[str] = []
        for local in build_processes(
            spec,
            script,
            master_port,
            job_dir,
            checkpoint_dir,
            run.gpu_ids,
            python=self._python_for(spec),
            network=self._network,
        ):
            argv, env = local.argv, local.env
            if spec.container_image:
                run_container = self._in_container(
                    run, local, cwd, script, code, job_dir, checkpoint_dir
                )
                # The runtime's environment is its own (workers/containers.py Runtime.env), set
                # by the same shim as a trainer's; the container's come from its env file.
                argv = jobenv.command(run_container, cwd)
                env = self._runtime(spec).env()
            else:
                if "example" in spec.program and self.sandbox.isolation.isolated:
                    # A built-in example imports the agent's own `workers` package, whatever
                    # the trainer's Python holds; in the sandbox its folder shows nothing else.
                    env = dict(env, PYTHONPATH=f"{env['PYTHONPATH']}:{WORKERS_PACKAGE.parent}")
                argv, env = self.sandbox.wrap(
                    argv,
                    sandbox.Folders(
                        cwd=cwd,
                        # The trainer library and the built-in examples; the user's code
                        # (in the working folder, bound read-only over it, or the code root).
                        read_only=[WORKERS_PACKAGE, TRAINER_LIB, script.parent, code],
                        writable=[job_dir, checkpoint_dir, cwd],
                        gpu_ids=run.gpu_ids,
                        scratch=job_dir,
                        named=run.named,
                    ),
                    env,
                    user,
                )
            kept.append(KeptProcess(argv, env, cwd, joined, self._trainer_oom_score))
            metrics_files.append(local.env[contract.TRAINYARD_METRICS_FILE])
        run.nonce = f"{os.getpid():x}{time.time_ns():x}"
        replica = {
            "spec": spec.to_dict(),
            "nonce": run.nonce,
            "gpu_ids": run.gpu_ids,
            "cores": run.cores,
            "instance_dir": str(job_dir),
            "containers": run.containers,
            "metrics_files": metrics_files,
        }
        if run.stop_requested.is_set():
            raise _StopRequested
        folder = self.keepers_dir / folder_name(spec.job_id, spec.attempt, spec.tag)
        link = KeeperLink.start(
            folder, kept, replica, self.records.directory, self.keeper_grace, run.stop_grace,
            spares=self._spare_keepers,
        )  # fmt: skip
        with self._lock:
            run.keeper = link
        # A stop that arrived while the keeper was starting: _stop (after this) ends them.
        if run.stop_requested.is_set():
            raise _StopRequested
        self._follow(run, {}, metrics_files)
        run.state = ReplicaState.RUNNING
        self._send_report(contract.TASK_REPLICA_STARTED, self._started(run))

    def _make_cgroup(self, run: _ReplicaRun) -> list[str]:
        """The instance's cgroup, made with its package's limits where this node enforces
        them; the cgroup.procs files its processes join (none where it does not)."""
        if not self.limits.enforced:
            return []
        spec = run.spec
        gpu_devices = [f"/dev/nvidia{g}" for g in run.gpu_ids]
        if run.gpu_ids:
            gpu_devices += list(sandbox.GPU_CONTROL_DEVICES)
        name = folder_name(spec.job_id, spec.attempt, spec.tag)
        request = dataclasses.replace(limits.request_for(spec, gpu_devices), cores=tuple(run.cores))
        try:
            run.cgroup = self.limits.create(name, request)
            if spec.container_image and self.limits.containers is not None:
                # The whole package for all of the instance's containers together, as the
                # instance's group holds a sandboxed instance's processes; the runtime keeps
                # each container's devices (GPUs through CDI), so none are limited here.
                run.container_group = self.limits.containers.create(
                    name, dataclasses.replace(request, devices=())
                )
        except cgroups.CgroupError as exc:
            raise RuntimeError(
                f"cannot hold the instance to its package on {self.node}: {exc}"
            ) from None
        return run.cgroup.procs_files()

    def _usage(self, run: _ReplicaRun) -> cgroups.Usage | None:
        """The instance's counters; None without a group. A job in containers: its
        containers' group (None where the runtime's own flags held them, uncounted)."""
        group = run.container_group if run.spec.container_image else run.cgroup
        return group.usage() if group is not None else None

    def _check_limits(self, run: _ReplicaRun) -> None:
        """Now and then: a line in the job's log once its process limit is hit (forks fail
        from then on, which a trainer may report obscurely or not at all), and the disk."""
        now = time.monotonic()
        if run.limit_reason or now < run.limits_checked_at:
            return
        run.limits_checked_at = now + limits.LIMITS_CHECK_SECONDS
        usage = self._usage(run)
        if usage is not None and usage.process_limit_hits and not run.process_limit_told:
            run.process_limit_told = True
            self._note(run, f"{limits.process_limit_note(run.spec)}: forks fail from now on")
        self._check_disk(run, now)

    def _check_disk(self, run: _ReplicaRun, now: float) -> None:
        """Measure the job's folders on this node against its disk limit: a warning line near
        it, a stop with its reason past it."""
        spec = run.spec
        if spec.disk_gb <= 0:
            return
        with self._lock:
            # Instances of the job on this node share its working and checkpoint folders:
            # they are measured against the sum of their limits.
            mine = [r for r in self._runs.values() if r.spec.job_id == spec.job_id]
        folders = [
            workfolder.folder_of(self.checkpoint_root, spec.job_id, spec.checkpoint_key),
            self._checkpoint_folder(spec),
            # Each instance's folder and its /dev/shm folder (on disk, beside it).
            *(
                folder
                for r in mine
                if r.instance_dir is not None
                for folder in (r.instance_dir, sandbox.shm_folder(r.instance_dir))
            ),
        ]
        use = limits.disk_use(folders, sum(r.spec.disk_gb for r in mine), self._file_owner(run))
        if use is None:
            return
        # Files removed but held open count too (du cannot see them).
        held = sum(
            limits.unlinked_bytes(group.pids())
            for r in mine
            for group in (r.cgroup, r.container_group)
            if group is not None
        )
        use = dataclasses.replace(use, used_bytes=use.used_bytes + held)
        if use.over:
            run.limit_reason = limits.disk_reason(spec, use)
            run.limit_stop_at = now
            self._note(run, f"stopped: {run.limit_reason}")
            if run.keeper is not None:
                run.keeper.terminate()
        elif use.near and not run.disk_warned:
            run.disk_warned = True
            self._note(run, limits.disk_warning(spec, use))

    def _resume(self, run: _ReplicaRun) -> None:
        """Follow an adopted replica's files from where the lines that left an earlier agent
        end: in Redis, or in this node's spool (its shipper sends those first)."""
        link = run.keeper
        assert link is not None
        metrics_files = [str(f) for f in link.replica().get("metrics_files", [])]
        writers = [self._writer(run, "output", r) for r in range(link.ranks())]
        writers += [self._writer(run, "metrics", r) for r in range(len(metrics_files))]
        offsets: dict[str, int] = {}
        told = False
        while len(offsets) < len(writers):
            if run.handed_over.is_set():
                raise _HandedOver
            try:
                for writer in writers[len(offsets) :]:
                    offsets[writer] = self._shipper.shipped_offset(run.spec.job_id, writer)
            except redis.RedisError as exc:
                if not told:
                    log.warning("job %s %s: waiting for Redis to resume its lines: %s",
                                run.spec.job_id, run.spec.tag, exc)  # fmt: skip
                    told = True
                time.sleep(RESUME_RETRY_SECONDS)
        self._follow(run, offsets, metrics_files)
        log.info("took over job %s %s from an earlier agent", run.spec.job_id, run.spec.tag)
        self._started(run)

    def _writer(self, run: _ReplicaRun, stream: str, rank: int) -> str:
        """The writer name of one of a replica's files in its job's log stream."""
        return f"{FILE_WRITER_PREFIX}{run.nonce}:{stream}{rank}"

    def _follow(self, run: _ReplicaRun, offsets: dict[str, int], metrics_files: list[str]) -> None:
        """Ship the keeper's output files and the metrics files, each from its offset."""
        link = run.keeper
        assert link is not None
        definitions, problems = compile_definitions(run.spec.metric_definitions)
        run.regex_metrics = RegexScanner(definitions) if definitions else None
        if not run.adopted:
            for problem in problems:
                self._note(run, problem)
        for rank in range(link.ranks()):
            # One file per rank, both its streams in the order the keeper read them, under one
            # writer: a takeover resumes it from one offset.
            writer = self._writer(run, "output", rank)
            holder: list[FileTail] = []  # the tail, for the emitter to read where lines start
            reader = FileTail(
                link.output(rank),
                offsets.get(writer, 0),
                self._emitter(run, writer, holder),
                link.done,
                name=f"{run.spec.job_id}-{run.spec.tag}-output{rank}",
                ledger=self._shipper.ledger(run.spec.job_id, writer),
                drained=lambda: self._shipper.flush(DRAIN_WAIT_SECONDS),
            )
            holder.append(reader)
            self._shipper.watch(writer, reader.rewind)
            reader.start()
            run.readers.append(reader)
            run.stderr_readers[rank] = reader
        for rank, path in enumerate(metrics_files):
            writer = self._writer(run, "metrics", rank)
            metric_holder: list[MetricTail] = []  # the tail, for the emitter to read its offset
            tail = MetricTail(
                Path(path),
                self._points_emitter(run, writer, metric_holder),
                lambda ts, notes: self._shipper.put_system(run.key, ts, notes),
                offset=offsets.get(writer, 0),
                below=self._workdir,
                uid=self._file_owner(run),
            )
            metric_holder.append(tail)
            tail.start()
            run.tails.append(tail)
        run.sampled = SampledInstance(
            link.pids(),
            run.gpu_ids,
            lambda ts, points: self._ship_points(run, ts, points),
            group=run.container_group,
        )

    def _points_emitter(
        self, run: _ReplicaRun, writer: str, tail: list[MetricTail]
    ) -> Callable[[float, list[Point]], None]:
        """A metrics file's points, under the file's writer, numbered by where they end in it."""

        def emit(ts: float, points: list[Point]) -> None:
            self._ship_points(run, ts, points, (writer, tail[0].consumed))

        return emit

    def _emitter(
        self, run: _ReplicaRun, writer: str, tail: list[FileTail], scan: bool = True
    ) -> Callable[[float, str, list[str], int], None]:
        """Ships a file's lines; `scan`: they are new (their metrics and stderr are taken),
        not ones sent again after the replica ended."""

        def emit(ts: float, stream: str, lines: list[str], offset: int) -> None:
            name = contract.STREAM_STDOUT if stream == "out" else contract.STREAM_STDERR
            if name == contract.STREAM_STDERR and scan:
                run.stderr_tail.extend(lines[-STDERR_TAIL_LINES:])
            # Called from the tail's thread: its offset is where these lines start.
            reading = tail[0]
            self._shipper.put(
                run.key, name, ts, lines, source=(writer, offset), start=reading.offset,
                generation=reading.generation,
            )  # fmt: skip
            if scan:
                self._scan(run, ts, lines)

        return emit

    def _started(self, run: _ReplicaRun) -> dict[str, Any]:
        """What a start that comes again is answered with."""
        spec = run.spec
        run.started_report = {
            "job_id": spec.job_id,
            "attempt": spec.attempt,
            "role": spec.role,
            "index": spec.index,
            "node": self.node,
            "pids": _pids(run),
            "incarnation": self.incarnation,
        }
        return run.started_report

    def _program(self, run: _ReplicaRun, work: Path) -> tuple[Path, Path]:
        """The script to run, by its absolute path, and the folder of code it belongs to.

        A snapshot is unpacked once per job into the working folder's `.code` and a script
        under the code root stays there; either way the code's top-level entries are linked
        into the working folder, so that the script finds its files relative to where it
        starts, as in its project's folder (workers/workfolder.py says why). A built-in
        example has no project: nothing is linked."""
        program = run.spec.program
        if "snapshot" not in program:
            script = resolve_program(program, self._code_root)
            if "path" not in program:
                return script, script.parent
            workfolder.link_entries(work, self._code_root.resolve(), relative=False)
            return script, self._code_root.resolve()
        code = workfolder.install_code(
            work,
            functools.partial(
                self.snapshots.unpack_into,
                program["snapshot"],
                should_stop=run.stop_requested.is_set,
            ),
        )
        workfolder.link_entries(work, code, relative=True)
        return resolve_under_root(code, program["path"]), code

    def _python_for(self, spec: ReplicaSpec) -> str:
        """The image's interpreter on this node, checked before anything starts; else ours."""
        if not spec.python or spec.container_image:
            return self._trainer_python
        found = shutil.which(spec.python)
        if found is None:
            raise RuntimeError(
                f"the job's image runs its trainers with {spec.python}, which {self.node} does "
                "not have (see docs/deploy.md: images that name their Python)"
            )
        return found

    def _runtime(self, spec: ReplicaSpec) -> containers.Runtime:
        if self._container_runtime is None:
            raise RuntimeError(
                f"image {spec.container_image} runs in containers, but {self.node} has no "
                "container runtime (podman or docker; the agent's --container-runtime)"
            )
        return self._container_runtime

    def _ensure_image(self, run: _ReplicaRun) -> None:
        """The job's image on this node before anything of it starts: pulled if missing (the
        log says so), or the instance fails with the runtime's words."""
        self._runtime(run.spec)
        assert self._images is not None
        note = functools.partial(self._note, run)
        try:
            self._images.ensure(run.spec.container_image, note, run.stop_requested.is_set)
        except images.ImageMissing as exc:
            raise RuntimeError(str(exc)) from None
        if run.stop_requested.is_set():
            raise _StopRequested

    def _in_container(
        self,
        run: _ReplicaRun,
        local: LocalProcess,
        cwd: Path,
        script: Path,
        code: Path,
        instance_dir: Path,
        checkpoint_dir: Path,
    ) -> list[str]:
        """The argv that runs this process in the job's container image."""
        spec = run.spec
        runtime = self._runtime(spec)
        # Beside the instance's folder, in the attempt's, which is the agent's alone: the
        # runtime (root) opens it by name when this process starts, maybe after another
        # process of the instance is already running and could put a link in its own folder.
        env_file = instance_dir.with_name(f".{instance_dir.name}.env-{local.local_rank}")
        mounts = [containers.Mount(TRAINER_LIB, read_only=True)]
        if not code.is_relative_to(cwd):
            # The code root, read-only as in the sandbox; a snapshot is in the working folder.
            mounts.append(containers.Mount(code, read_only=True))
        script_inside = None
        if "example" in spec.program:
            library, script_inside = containers.example_layout(script)
            mounts.append(library)
        # The processes start in the job's working folder; these three are theirs to write.
        mounts += [containers.Mount(f) for f in sorted({cwd, instance_dir, checkpoint_dir})]
        # The folders it named, where it named them, checked as its user (_named_folders).
        mounts += [
            containers.Mount(n.real, Path(n.path), read_only=not n.writable) for n in run.named
        ]
        env = containers.container_env(local, run.gpu_ids, library=script_inside is not None)
        containers.write_env_file(env_file, env)
        name = containers.container_name(
            spec.job_id, spec.attempt, spec.tag, local.local_rank, self._workdir
        )
        run.containers.append(name)
        cores = limits.cores_of_process(run.cores, local.local_rank, spec.local_world_size)
        return containers.run_argv(
            runtime.path,
            spec.container_image,
            name,
            self.node,
            local,
            cwd,
            mounts,
            env_file,
            run.gpu_ids,
            script=script_inside,
            user=self.sandbox.container_user(self.sandbox.user_for(spec)),
            shared_ipc=spec.local_world_size > 1,
            limits=dataclasses.replace(
                limits.share_of(limits.request_for(spec, []), spec.local_world_size), cores=cores
            ),
            agent=self._workdir,
            cgroup_parent=(
                self.limits.containers.path_of(folder_name(spec.job_id, spec.attempt, spec.tag))
                if run.container_group is not None and self.limits.containers is not None
                else None
            ),
        )

    def _remove_containers(self, names: list[str]) -> None:
        """A container outlives its `run` process when that dies of SIGKILL: remove it."""
        if self._container_runtime is None:
            return
        for name in names:
            try:
                subprocess.run(
                    containers.remove_argv(self._container_runtime.path, name),
                    env=self._container_runtime.env(),
                    capture_output=True,
                    timeout=KILL_WAIT_SECONDS * 4,
                    check=False,
                )
            except (OSError, subprocess.TimeoutExpired) as exc:
                log.warning("could not remove container %s: %s", name, exc)

    def _prune_images_later(self) -> None:
        """Off the exit's path (the report waits for no `image inspect`), one prune at a time:
        one that finds another under way leaves the cache to it."""
        if self._images is None or not self._pruning.acquire(blocking=False):
            return

        def prune() -> None:
            try:
                self._prune_images()
            finally:
                self._pruning.release()

        threading.Thread(target=prune, name="image-prune", daemon=True).start()

    def _prune_images(self) -> None:
        """Once an instance's containers are gone: the image cache back within its limit,
        sparing what the node's other instances run."""
        assert self._images is not None
        with self._lock:
            in_use = {r.spec.container_image for r in self._runs.values() if r.spec.container_image}
        try:
            self._images.prune(in_use)
        except (OSError, subprocess.TimeoutExpired) as exc:
            log.warning("could not prune the image cache: %s", exc)

    def _checkpoint_folder(self, spec: ReplicaSpec) -> Path:
        """Where the job's checkpoints are (it may not exist yet)."""
        name = (
            f"job-{spec.job_id}-{spec.checkpoint_key}"
            if spec.checkpoint_key
            else f"job-{spec.job_id}"
        )
        return self.checkpoint_root / name

    def _checkpoint_dir(self, spec: ReplicaSpec) -> Path:
        """The job's checkpoint folder on the shared root: the same for every instance and
        every attempt. A restart refuses to start where the first attempt's folder cannot be
        seen: its trainers would silently start from scratch."""
        folder = self._checkpoint_folder(spec)
        name = folder.name
        marker = folder / CHECKPOINT_MARKER
        if spec.attempt > 0 and not marker.is_file():
            raise RuntimeError(
                f"cannot restart on {self.node}: the checkpoint root {self.checkpoint_root} "
                f"there does not hold job {spec.job_id}'s folder {name}; a restart needs a "
                "checkpoint root that every node shares (see docs/checkpoints.md)"
            )
        folder.mkdir(parents=True, exist_ok=True)
        if not marker.exists():
            # The folder is the job's to write (another instance may already run): the
            # temporary is made anew, never opened through a link planted at its name, and
            # the rename replaces whatever is at the marker's name without following it.
            temporary = folder / f".{CHECKPOINT_MARKER}.{os.getpid()}.{threading.get_ident()}"
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            with os.fdopen(os.open(temporary, flags, 0o644), "w") as out:
                out.write(f"{spec.job_id}\n")
            os.replace(temporary, marker)
        return folder

    def _scan(self, run: _ReplicaRun, ts: float, lines: list[str]) -> None:
        """Regex metrics from the lines; a definition over its budget is switched off, and the
        instance's log says so."""
        if run.regex_metrics is None:
            return
        points, notes = run.regex_metrics.scan(lines, ts)
        self._ship_points(run, ts, points)
        for note in notes:
            self._note(run, note)

    def _ship_points(
        self,
        run: _ReplicaRun,
        ts: float,
        points: list[Point],
        source: tuple[str, int] | None = None,
    ) -> None:
        if points:
            lines = [p.to_json() for p in points]
            self._shipper.put(run.key, contract.STREAM_METRIC, ts, lines, source=source)

    def _note(self, run: _ReplicaRun, message: str) -> None:
        """A message from the agent about this instance, in the instance's own log."""
        self._shipper.put_system(run.key, time.time(), [f"[trainyard] {message}"])

    def _sampled_instances(self) -> list[SampledInstance]:
        with self._lock:
            runs = list(self._runs.values())
        return [
            r.sampled for r in runs if r.state == ReplicaState.RUNNING and r.sampled is not None
        ]

    def _monitor(self, run: _ReplicaRun) -> int | None:
        """Wait for the replica's processes: the exit code (0 when all succeeded, else the first
        failure's), or None when a stop was requested. A failure takes the others down."""
        link = run.keeper
        assert link is not None
        while not run.stop_requested.is_set():
            if run.handed_over.is_set():
                raise _HandedOver
            exits = link.exits()
            codes = [self._exit_code(run, e["code"]) if e else None for e in exits]
            failed = next((c for c in codes if c not in (None, 0)), None)
            if run.limit_reason and failed is None and all(c is not None for c in codes):
                # Stopped for a limit, and it ended cleanly on the SIGTERM: still a failure.
                failed = -signal.SIGTERM
                run.failed_local_rank = 0
                run.ended_at = time.time()
                return failed
            if run.limit_reason and time.monotonic() > run.limit_stop_at + run.stop_grace:
                link.kill()
            if failed is not None:
                if run.stop_requested.is_set():
                    break  # of our SIGTERM, unless it had failed before: told below
                run.failed_local_rank = codes.index(failed)
                run.ended_at = float(exits[run.failed_local_rank]["at"])  # type: ignore[index]
                link.terminate()
                return failed
            if all(c == 0 for c in codes):
                run.ended_at = max(float(e["at"]) for e in exits if e)
                return 0
            self._check_limits(run)
            if not link.alive() and not link.done():
                raise RuntimeError(
                    f"its keeper process on {self.node} died, and its processes with it"
                )
            # The keeper says when an exit is recorded: the end is read at once, not at the
            # next poll. A stop request is seen within the interval (its SIGTERM, sent by
            # _request_stop, ends the processes, whose exits wake this too).
            link.wait_for_news(MONITOR_INTERVAL_SECONDS)
        exits = link.exits()
        own = self._failed_before_stop(run, exits)
        if own is None:
            return None
        # It had failed by itself before the stop came (a peer's failure and its own are
        # told apart by the exit's time): its own failure, reported as one.
        run.failed_local_rank = own
        run.ended_at = float(exits[own]["at"])  # type: ignore[index]
        return self._exit_code(run, exits[own]["code"])  # type: ignore[index]

    def _exit_code(self, run: _ReplicaRun, code: int | None) -> int | None:
        return sandbox.exit_code(code, self.sandbox, in_container=bool(run.spec.container_image))

    def _failed_before_stop(self, run: _ReplicaRun, exits: list[Any]) -> int | None:
        """The local rank of a process that exited with a failure before the stop was asked
        for (so not of its SIGTERM), or None."""
        for rank, ended in enumerate(exits):
            if not ended or float(ended["at"]) >= run.stop_requested_at:
                continue
            if self._exit_code(run, ended["code"]) != 0:
                return rank
        return None

    def _failure_reason(self, run: _ReplicaRun, exit_code: int) -> str:
        """How the first failed process ended; with the exception it recorded (torch's @record
        writes it to TORCHELASTIC_ERROR_FILE), that exception and its rank."""
        how = describe_exit(exit_code)
        if run.limit_reason:
            return run.limit_reason
        usage = self._usage(run)
        limited = limits.end_reason(run.spec, usage) if usage is not None else None
        if limited is not None and limits.killed_by_the_kernel(exit_code):
            return limited  # the OOM killer's SIGKILL: nothing the trainer said matters more
        if run.keeper is not None and any(e and e.get("unclaimed") for e in run.keeper.exits()):
            return (
                f"stopped by its keeper ({how}): no agent on {self.node} took it over within "
                "the keeper grace"
            )
        recorded = None
        if run.failed_local_rank is not None and run.instance_dir is not None:
            recorded = recorded_error(
                error_file(run.instance_dir, run.failed_local_rank),
                self._workdir,
                self._file_owner(run),
            )
        if recorded is not None:
            assert run.failed_local_rank is not None
            said = f"{recorded} (rank {run.spec.rank_offset + run.failed_local_rank}, {how})"
            return f"{limited}: {said}" if limited else said
        # No @record: the exception its traceback ended with, if it printed one.
        self._read_stderr_to_its_end(run)
        tail = list(run.stderr_tail)
        printed = own_error(tail)
        said = f"{printed} ({how})" if printed else how
        # A limit reached on the way (a child killed for memory, a fork refused) comes first:
        # the trainer's own error is what followed from it.
        return self._with_disk_reason(f"{limited}: {said}" if limited else said)

    def _file_owner(self, run: _ReplicaRun) -> int:
        """The uid the replica's metrics and error files must belong to (workers/jobfiles.py)."""
        return self.sandbox.file_owner(
            self.sandbox.user_for(run.spec), bool(run.spec.container_image)
        )

    def _user_of(self, run: _ReplicaRun) -> JobUser:
        """Who the replica's trainers run as here; never root nor a system account, whatever
        the console sent (it refuses them too)."""
        user = self.sandbox.user_for(run.spec)
        if run.spec.user_known:
            refusal = unixids.system_account_refusal(
                user.uid, unixids.uid_min(), f"the owner of job {run.spec.job_id}"
            )
            if refusal is not None:
                raise RuntimeError(f"{self.node} refuses to run it: {refusal}")
        return user

    def _named_folders(self, spec: ReplicaSpec, user: JobUser) -> tuple[NamedFolder, ...]:
        """The folders the job named, resolved here, each checked as its user by the kernel
        (workers/folderaccess.py) before anything of the replica starts."""
        wanted = folderaccess.requests(spec.data_folders, spec.results_folder)
        if not wanted:
            return ()
        if not (spec.user_known and os.geteuid() == 0 and self.sandbox.isolation.isolated):
            raise RuntimeError(
                f"{self.node} cannot give the job its folders: they are read as the owner's own "
                "Unix identity, which takes an agent that runs as root with its sandbox"
            )
        named = []
        for path, writable in wanted:
            try:
                named.append(
                    folderaccess.check(
                        path, user, writable, guarded=(self._workdir, self.checkpoint_root)
                    )
                )
            except folderaccess.FolderRefused as exc:
                kind = "results" if writable else "data"
                raise RuntimeError(f"{kind} folder refused on {self.node}: {exc}") from None
        return tuple(named)

    def _stopped_reason(self, run: _ReplicaRun) -> str:
        """Why it was stopped, and the error its own stderr ended with, if it did: peers of a
        failed instance often fail the same way (the same bad argument) or of its loss, and the
        stop may reach them while they are ending of it."""
        self._read_stderr_to_its_end(run)
        own = ended_with_error(list(run.stderr_tail))
        return f"{run.stop_reason}; its own stderr ended with: {own}" if own else run.stop_reason

    def _read_stderr_to_its_end(self, run: _ReplicaRun) -> None:
        """Let the failed rank's reader reach the end of its output file: the keeper records an
        exit only once the rank's output is in the file, but the reader polls, and a reason
        worked out before it has read the traceback would miss the exception."""
        reader = run.stderr_readers.get(run.failed_local_rank or 0)
        if reader is None:
            return
        try:
            size = reader.path.stat().st_size
        except FileNotFoundError:
            return
        deadline = time.monotonic() + STDERR_CATCH_UP_SECONDS
        while reader.read_to < size and reader.is_alive() and time.monotonic() < deadline:
            time.sleep(MONITOR_INTERVAL_SECONDS / 5)

    # --- a full work disk (workers/diskspace.py) ---

    def _refuse_on_full_disk(self) -> None:
        """A start on a full disk would fail half way (job folder, code, records): refused
        before anything is written, with the reason the console shows."""
        full = self.disk.full_reason() if self.disk is not None else None
        if full is not None:
            raise RuntimeError(f"{full}: not started")

    def _with_disk_reason(self, reason: str, exc: BaseException | None = None) -> str:
        """A failure while the work disk is full (or of an ENOSPC) names the disk first: it is
        the root cause, whatever the trainer's own traceback says."""
        if self.disk is None or self.disk.reason in reason:
            return reason
        if self.disk.full_reason() is not None or is_no_room(exc):
            return f"{self.disk.reason}: {reason}"
        return reason

    def _request_stop(
        self, run: _ReplicaRun, reason: str, grace_seconds: float | None = None
    ) -> None:
        """Ask a replica to stop: SIGTERM now, and its own thread does the rest (SIGKILL after
        the grace, the exit report), so the caller does not wait."""
        with self._lock:
            if not run.stop_requested.is_set():
                run.stop_reason = reason
                run.stop_requested_at = time.time()
                if grace_seconds is not None:
                    run.stop_grace = max(0.0, grace_seconds)
                run.stop_requested.set()
            link = run.keeper
        if link is not None:
            link.terminate()

    def _stop(self, run: _ReplicaRun) -> None:
        """Make sure nothing of the replica survives, even children that left the trainer: its
        keeper signals the groups it holds, and kills what is left in each."""
        link = run.keeper
        if link is not None:
            link.terminate()
            ended = lambda: link.done() or not link.alive()  # noqa: E731
            grace_ends = time.monotonic() + run.stop_grace
            self._wait(ended, until=lambda c: min(grace_ends, c.kill_by) if c else grace_ends)
            link.kill()
            kill_wait_ends = time.monotonic() + KILL_WAIT_SECONDS
            if not self._wait(
                ended,
                until=lambda c: min(kill_wait_ends, c.flush_until) if c else kill_wait_ends,
            ):
                log.warning(
                    "job %s %s: process group still there after SIGKILL; left for the next reap",
                    run.spec.job_id, run.spec.tag,
                )  # fmt: skip
        readers_end = time.monotonic() + STOP_GRACE_SECONDS
        for reader in run.readers:
            # They end once the keeper says every byte is in the files, and they have read them.
            reader.join(max(0.0, self._bounded(readers_end, lambda c: c.flush_until)))
            # One reading again what Redis lost (it waits for the log keeper to realign the
            # stream first) ends once those lines are on their way: the exit is reported
            # after every line, as ever. Only a shutdown stops waiting (the files stay).
            while reader.is_alive() and reader.rewound and self._closing is None:
                reader.join(0.2)
        for tail in run.tails:
            tail.stop()
        for tail in run.tails:
            tail.join(max(0.0, self._bounded(readers_end, lambda c: c.flush_until)))
        self._remove_containers(run.containers)
        if run.containers:
            self._prune_images_later()

    def _finish(
        self,
        run: _ReplicaRun,
        exit_code: int | None,
        reason: str,
        usage: cgroups.Usage | None = None,
    ) -> None:
        spec = run.spec
        # Drops not yet told go in before the flush, so the console sees them with the rest.
        self._shipper.release(run.key)
        # The exit is reported only once every line is in Redis, so the console can close the
        # job's log knowing nothing more will come. While Redis is away the lines wait in the
        # spool, and the report could not reach the console through Redis anyway. Only a
        # shutdown stops waiting: the spool keeps the lines for the next agent.
        flushing = _in_background(self._shipper.flush, "flush")
        if not self._wait(
            lambda: not flushing.is_alive(),
            until=lambda c: c.flush_until if c else None,
            waiting_for=f"log lines of {spec.job_id}/{spec.tag} to reach Redis",
        ):
            log.warning("log lines of %s/%s left in the spool", spec.job_id, spec.tag)
        report = contract.exit_report(
            job_id=spec.job_id,
            attempt=spec.attempt,
            role=spec.role,
            index=spec.index,
            node=self.node,
            state=run.state.value,
            exit_code=exit_code,
            reason=reason,
            stderr_tail=list(run.stderr_tail),
            ended_at=run.ended_at,
            incarnation=self.incarnation,
            log_ends=self._log_ends(run),
            usage=usage.to_dict() if usage is not None else None,
        )
        with self._lock:
            self._runs.pop(run.ident, None)
            self._free_gpus |= set(run.gpu_ids)
            self._free_cores |= set(run.cores)
            self._finished[run.ident] = _Outcome(report, time.monotonic() + FINISHED_KEEP_SECONDS)
            self._finished.move_to_end(run.ident)
            self._forget_old_outcomes()
        self._send_report(contract.TASK_REPLICA_EXITED, report)
        self._remove_ended_job_folders()
        self._prune_checkpoints(spec)

    def remove_checkpoints(self, job_id: int, checkpoint_key: str) -> bool:
        """Remove a deleted job's checkpoint folder; safe to call twice, and on every node
        that shares the folder. Never while a replica of the job runs here."""
        if not checkpoint_retention.is_key(checkpoint_key):
            log.warning("refused to remove checkpoints of job %s: bad key", job_id)
            return False
        with self._lock:
            if any(j == job_id for j, *_ in self._runs):
                log.warning("job %s runs here: its checkpoints stay", job_id)
                return False
            # Its ended replicas' log files need not wait for the log keeper any more.
            self._deleted_jobs.add(job_id)
        folder = self.checkpoint_root / f"job-{job_id}-{checkpoint_key}"
        removed = checkpoint_retention.remove_folder(folder)
        # The job's working folder holds what its scripts saved where they stood: the same.
        return self.remove_working_folder(job_id, checkpoint_key) or removed

    def remove_working_folder(self, job_id: int, checkpoint_key: str) -> bool:
        """Remove an ended job's working folder (its retention ended, or it was deleted); safe
        to call twice, and on every node. Never while a replica of the job runs here."""
        if not checkpoint_retention.is_key(checkpoint_key):
            log.warning("refused to remove the working folder of job %s: bad key", job_id)
            return False
        with self._lock:
            if any(j == job_id for j, *_ in self._runs):
                log.warning("job %s runs here: its working folder stays", job_id)
                return False
        work = workfolder.folder_of(self.checkpoint_root, job_id, checkpoint_key)
        return workfolder.remove(work)

    def _prune_checkpoints(self, spec: ReplicaSpec) -> None:
        """Once the job no longer runs here, its checkpoints beyond the newest K go."""
        if self.keep_checkpoints <= 0:
            return
        with self._lock:
            if any(job_id == spec.job_id for job_id, *_ in self._runs):
                return
        try:
            checkpoint_retention.prune(self._checkpoint_folder(spec), self.keep_checkpoints)
        except OSError:  # a shared file system that fails must not stop the agent
            log.exception("pruning the checkpoints of job %s failed", spec.job_id)

    def _remove_ended_job_folders(self) -> None:
        if self.keep_job_folders is None:
            return
        try:
            jobfolders.remove_ended(
                self._workdir / "jobs",
                self.keep_job_folders,
                busy_jobs=lambda: {job_id for job_id, *_ in self._runs},
                lock=self._lock,
            )
        except OSError:  # a full or failing disk must not stop the agent; the next end retries
            log.exception("removing ended jobs' folders failed")

    # --- helpers ---

    def _send_report(self, task_name: str, payload: dict[str, Any]) -> None:
        """Report to the console; during a shutdown, give up at its deadline."""
        closing = self._closing
        deadline = closing.give_up_at if closing else None
        sent = threading.Event()

        def send() -> None:
            try:
                self._report(task_name, payload, deadline=deadline)
                sent.set()
            except Exception as exc:  # the broker is unreachable, and stayed so while we retried
                log.warning("%s for job %s not sent: %s", task_name, payload.get("job_id"), exc)

        # In a thread of its own, so that a shutdown that begins while it retries does not wait
        # for the broker: the thread is a daemon, left behind if it is still trying.
        thread = _in_background(send, "report")
        self._wait(
            lambda: not thread.is_alive(),
            until=lambda c: c.give_up_at if c else None,
            waiting_for=f"{task_name} of job {payload.get('job_id')} to reach the broker",
        )
        if not sent.is_set() and thread.is_alive():
            log.warning(
                "%s for job %s %s/%s not sent before shutdown",
                task_name, payload.get("job_id"), payload.get("role"), payload.get("index"),
            )  # fmt: skip

    def _wait(
        self,
        done: Callable[[], bool],
        until: Callable[[_Closing | None], float | None],
        waiting_for: str = "",
    ) -> bool:
        """Poll `done` until it holds or the deadline `until(closing)` passes; recomputed each
        time, so a shutdown that begins meanwhile shortens a wait already under way. A wait with
        no deadline (None) says what it waits for each minute."""
        warn_at = time.monotonic() + STILL_WAITING_WARNING_SECONDS
        # Short slices first: most of these waits (a flush, a report handed to the broker)
        # end within milliseconds, and each one sits between a trainer's exit and the exit
        # report the user waits for; a long wait polls at WAIT_SLICE_SECONDS.
        pause = FIRST_WAIT_SLICE_SECONDS
        while not done():
            now = time.monotonic()
            deadline = until(self._closing)
            if deadline is not None and now >= deadline:
                return done()
            if waiting_for and now >= warn_at:
                log.warning("still waiting for %s", waiting_for)
                warn_at = now + STILL_WAITING_WARNING_SECONDS
            time.sleep(pause)
            pause = min(pause * 2, WAIT_SLICE_SECONDS)
        return True

    def _bounded(self, deadline: float, closing_limit: Callable[[_Closing], float]) -> float:
        """Seconds left until `deadline`, or until the shutdown's limit if that comes first."""
        closing = self._closing
        if closing is not None:
            deadline = min(deadline, closing_limit(closing))
        return deadline - time.monotonic()

    def _reap_recorded(self, job_id: int, spare: frozenset[int]) -> None:
        for reaped in reap_all(self.records, job_id=job_id, spare=spare):
            if reaped.killed:
                log.warning(
                    "stopped job %s %s: killed pids %s that this agent did not start",
                    job_id, reaped.record.tag, reaped.killed,
                )  # fmt: skip

    def _recent_outcome(self, ident: Ident) -> _Outcome | None:
        """Call with the lock held."""
        self._forget_old_outcomes()
        return self._finished.get(ident)

    def _forget_old_outcomes(self) -> None:
        """Call with the lock held; outcomes are kept in the order they were reached."""
        now = time.monotonic()
        while self._finished:
            oldest = next(iter(self._finished.values()))
            if len(self._finished) <= FINISHED_KEEP_MAX and oldest.kept_until > now:
                break
            self._finished.popitem(last=False)

    def _unknown_report(self, job_id: int, attempt: int, role: str, index: int) -> dict[str, Any]:
        return contract.exit_report(
            job_id=job_id,
            attempt=attempt,
            role=role,
            index=index,
            node=self.node,
            state=ReplicaState.UNKNOWN.value,
            exit_code=None,
            reason=f"not running on {self.node}",
            stderr_tail=[],
            ended_at=time.time(),
            incarnation=self.incarnation,
        )


def _replica_idents(replicas: list[dict[str, Any]]) -> list[tuple[int, str, int]]:
    """(attempt, role, index) of each replica a stop message names."""
    idents = []
    for replica in replicas:
        try:
            idents.append(
                (int(replica.get("attempt", 0)), str(replica["role"]), int(replica["index"]))
            )
        except (KeyError, TypeError, ValueError):
            log.warning("ignoring a malformed replica in a stop message: %r", replica)
    return idents


def _pids(run: _ReplicaRun) -> list[int]:
    """The replica's processes, as its keeper started them ([] before)."""
    return run.keeper.pids() if run.keeper is not None else []


def _in_background(target: Callable[[], object], what: str) -> threading.Thread:
    thread = threading.Thread(target=target, name=what, daemon=True)
    thread.start()
    return thread


def _free_port(address: str) -> int:
    """A port that is free on this host now; the trainer binds it a moment later."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((address, 0))
        except OSError:
            sock.bind(("", 0))
        return int(sock.getsockname()[1])
