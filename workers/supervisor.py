"""The agent's supervisor: owns every trainer process on this node, from start to reported exit.

Shaped like torch's elastic agent: each replica goes through `_rendezvous`, `_start`,
`_monitor` and, always, `_stop` in one thread of its own, and its outcome is reported to the
console only after every line it printed is in Redis. Celery only hands it short messages
("start this replica", "stop that job"); the processes belong to the supervisor, not to Celery.

No trainer outlives the agent:
- each trainer starts through workers/deathsig.py, so the kernel SIGKILLs it when the thread
  that started it ends. That thread is the replica's own, and it keeps running until every
  process of the replica has ended, so the signal fires only when the agent itself dies;
- each trainer leads its own process group, recorded in `<workdir>/procs` for as long as the
  group lives (workers/procrecords.py). The agent's guardian (workers/guardian.py) or the next
  agent on this work dir kills what a dead agent left in those groups. A process that leaves
  its group (setsid) escapes all of this; only a cgroup per replica would hold it.

Messages are idempotent: a start of a replica that runs, or ended lately, starts nothing and
re-sends what was already reported; a stop of a replica this node does not run says so.
"""

import enum
import json
import logging
import os
import re
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
    checkpoint_retention,
    containers,
    contract,
    deathsig,
    inventory,
    jobfolders,
    sandbox,
)
from workers.launcher import (
    TRAINER_LIB,
    WORKERS_PACKAGE,
    LocalProcess,
    NodeNetwork,
    build_processes,
    error_file,
)
from workers.logquota import LogLimits
from workers.logship import LogShipper, ReplicaKey, pump_pipe
from workers.metricfeed import MetricTail, SystemSampler, Watched
from workers.metricparse import Point, RegexScanner, compile_definitions
from workers.procrecords import (
    ProcRecord,
    ProcRecords,
    Reaped,
    group_members,
    reap_all,
    record_of,
)
from workers.programs import ProgramError, resolve_program, resolve_under_root
from workers.snapshot import SnapshotCache, SnapshotError
from workers.spec import ReplicaSpec

log = logging.getLogger(__name__)

# How long a non-master replica waits for the master's agent to publish MASTER_PORT.
RENDEZVOUS_TIMEOUT_SECONDS = 600.0
# Between SIGTERM and SIGKILL when stopping a process group.
STOP_GRACE_SECONDS = 5.0
# After SIGKILL, how long to wait for a group to be gone; a group still there after that (a
# process stuck in the kernel) keeps its record, for the guardian or the next agent.
KILL_WAIT_SECONDS = 5.0
MONITOR_INTERVAL_SECONDS = 0.1
STDERR_TAIL_LINES = 20
# Outcomes remembered, so that a start or stop that comes again gets the same answer.
FINISHED_KEEP_SECONDS = 600.0
FINISHED_KEEP_MAX = 1000
# Outside a shutdown, waits on Redis (log flush, reports) are unbounded; they say so this often.
STILL_WAITING_WARNING_SECONDS = 60.0
WAIT_SLICE_SECONDS = 0.1
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
    UNKNOWN = "unknown"


# What heartbeats call a replica that is ending: a stop was requested, or its processes ended
# and it is shipping their last lines before it reports the exit.
STOPPING = "stopping"


class _StopRequested(Exception):
    pass


@dataclass
class _ReplicaRun:
    spec: ReplicaSpec
    key: ReplicaKey
    state: ReplicaState = ReplicaState.WAITING
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    records: list[ProcRecord] = field(default_factory=list)
    readers: list[threading.Thread] = field(default_factory=list)
    stop_requested: threading.Event = field(default_factory=threading.Event)
    stop_reason: str = ""
    stop_grace: float = STOP_GRACE_SECONDS
    # Set (under the supervisor's lock) before the group leaders are reaped: from then on their
    # pids, and so the group ids, may be reused by strangers and must not be signalled.
    leaders_released: bool = False
    stderr_tail: deque[str] = field(default_factory=lambda: deque(maxlen=STDERR_TAIL_LINES))
    gpu_ids: list[int] = field(default_factory=list)
    thread: threading.Thread | None = None
    tails: list[MetricTail] = field(default_factory=list)
    # Its regex metrics, matched on the pipe readers' threads (never the heartbeat's), under
    # a CPU budget of their own.
    regex_metrics: RegexScanner | None = None
    watched: Watched | None = None
    started_report: dict[str, Any] | None = None
    ended_at: float | None = None  # unix time the outcome was decided (first failure seen)
    containers: list[str] = field(default_factory=list)  # names, for jobs on container images
    instance_dir: Path | None = None  # this attempt's folder of the instance, once started
    failed_local_rank: int | None = None  # the process whose failure ended the replica

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


def recorded_error(path: Path) -> str | None:
    """The exception a process recorded before it died (torch.distributed.elastic's @record:
    {"message": {"message": "RuntimeError: ...", "extraInfo": {...}}}), or None."""
    try:
        if path.stat().st_size > MAX_ERROR_FILE_BYTES:
            return None
        data = json.loads(path.read_text(errors="replace"))
    except (OSError, ValueError):
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


TRACEBACK_START = "Traceback (most recent call last):"
EXCEPTION_LINE = re.compile(
    r"^(?:[A-Za-z_]\w*\.)*(?:[A-Za-z_]\w*(?:Error|Exception)|KeyboardInterrupt|SystemExit)"
    r"(?::\s.*)?$"
)


# torch.distributed (2.4 and later) prefixes what a rank prints to stderr with "[rank1]: "
# (or "[default1]:" under some launchers): the traceback is under it.
RANK_PREFIX = re.compile(r"^\[(?:rank|default)\d+\]:\s?")


def last_exception(lines: list[str]) -> str | None:
    """The last line of the last Python traceback in `lines` ("ValueError: ..."), or None;
    lines prefixed with torch's "[rankN]: " are read without it."""
    lines = [RANK_PREFIX.sub("", line) for line in lines]
    for i in range(len(lines) - 1, -1, -1):
        line = lines[i].rstrip()
        if EXCEPTION_LINE.match(line) and any(x.startswith(TRACEBACK_START) for x in lines[:i]):
            return line[:MAX_RECORDED_MESSAGE]
    return None


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
        container_runtime: str | None = None,
        trainer_sandbox: sandbox.Sandbox | None = None,
        keep_job_folders: int | None = None,
        keep_checkpoints: int = 0,
    ) -> None:
        self.node = node
        # How many of a job's newest checkpoints stay once it ends here (0: all).
        self.keep_checkpoints = keep_checkpoints
        # How many ended jobs' folders stay for inspection (workers/jobfolders.py); None: all.
        self.keep_job_folders = keep_job_folders
        # How trainers are held apart (workers/sandbox.py); None: not at all, as in unit tests
        # of the supervisor's other concerns.
        self.sandbox = trainer_sandbox or sandbox.Sandbox(
            sandbox.Isolation.NONE, reason="no sandbox was asked for"
        )
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
        # Shared by every node in a cluster: a restart on another node resumes from it.
        self.checkpoint_root = checkpoint_root or workdir / "checkpoints"
        self.records = ProcRecords(workdir / "procs")
        self.snapshots = SnapshotCache(client, workdir / "snapshots")
        self._free_gpus = set(range(gpus))
        self._runs: dict[Ident, _ReplicaRun] = {}
        self._finished: OrderedDict[Ident, _Outcome] = OrderedDict()
        self._lock = threading.Lock()
        self._closing: _Closing | None = None
        self._sampler = SystemSampler(self._watched, gpu_usage=inventory.gpu_usage)
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
        self._runs[run.ident] = run
        # A daemon only so that a thread stuck on an unreachable Redis cannot keep a dying
        # agent alive: shutdown() waits for these threads up to its deadline, and whatever
        # still runs after the agent exits dies of its death signal or by the guardian.
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
            supervised = frozenset(p.pid for r in self._runs.values() for p in r.procs)
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
                "pids": [p.pid for p in r.procs],
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
        and remove the containers it ran."""
        if self._container_runtime is not None:
            try:
                listed = subprocess.run(
                    containers.leftovers_argv(self._container_runtime, self.node),
                    capture_output=True, text=True, timeout=30, check=False,
                )  # fmt: skip
                self._remove_containers(listed.stdout.split())
            except (OSError, subprocess.TimeoutExpired) as exc:
                log.warning("could not list this node's leftover containers: %s", exc)
        return reap_all(self.records)

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop everything and report the exits, returning within `timeout` seconds even when
        Redis is unreachable: an agent leaves no orphan behind, and does not hang."""
        with self._lock:
            self._closing = _Closing.within(timeout)
            closing = self._closing
            runs = list(self._runs.values())
        self._sampler.stop()
        for run in runs:
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
            port = self._rendezvous(run)
            self._start(run, port)
            exit_code = self._monitor(run)
            if exit_code is None:
                raise _StopRequested
            run.state = ReplicaState.SUCCEEDED if exit_code == 0 else ReplicaState.FAILED
            reason = "" if exit_code == 0 else self._failure_reason(run, exit_code)
        except _StopRequested:
            run.state = ReplicaState.STOPPED
            reason = run.stop_reason
        except Exception as exc:  # anything else is a failure of this replica, reported below
            log.exception("replica %s of job %s failed to run", run.spec.tag, run.spec.job_id)
            run.state = ReplicaState.FAILED
            reason = str(exc) or type(exc).__name__
        finally:
            self._stop(run)
            if run.state == ReplicaState.STOPPED and run.procs:
                # How its processes ended, as they did: -15 for one that obeyed the SIGTERM.
                codes = [
                    sandbox.exit_code(p.returncode, self.sandbox)
                    for p in run.procs
                    if p.returncode is not None
                ]
                exit_code = next((c for c in codes if c != 0), 0 if codes else None)
            if run.ended_at is None:
                run.ended_at = time.time()
            self._finish(run, exit_code, reason)

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
            if run.stop_requested.wait(0.1):
                raise _StopRequested
        raise TimeoutError(
            f"the master did not publish its port within {RENDEZVOUS_TIMEOUT_SECONDS:.0f} s"
        )

    def _start(self, run: _ReplicaRun, master_port: int) -> None:
        spec = run.spec
        job_dir = self._workdir / "jobs" / str(spec.job_id) / f"attempt-{spec.attempt}" / spec.tag
        job_dir.mkdir(parents=True, exist_ok=True)
        run.instance_dir = job_dir
        try:
            script, cwd = self._program(run, job_dir)
        except (ProgramError, SnapshotError) as exc:
            raise RuntimeError(f"cannot run the program on {self.node}: {exc}") from None
        checkpoint_dir = self._checkpoint_dir(spec)
        # The two folders the trainer writes to become its own; nobody else's trainers enter.
        sandbox.prepare_scratch(job_dir)
        for folder in (job_dir, job_dir / "tmp", job_dir / "shm", checkpoint_dir):
            self.sandbox.hand_over(folder, spec.owner)
        definitions, problems = compile_definitions(spec.metric_definitions)
        run.regex_metrics = RegexScanner(definitions) if definitions else None
        for problem in problems:
            self._note(run, problem)
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
                argv = self._in_container(run, local, cwd, script, job_dir, checkpoint_dir)
            else:
                if "example" in spec.program and self.sandbox.isolation.isolated:
                    # A built-in example imports the agent's own `workers` package, whatever
                    # the trainer's Python holds; in the sandbox its folder shows nothing else.
                    env = dict(env, PYTHONPATH=f"{env['PYTHONPATH']}:{WORKERS_PACKAGE.parent}")
                argv, env = self.sandbox.wrap(
                    argv,
                    sandbox.Folders(
                        cwd=cwd,
                        # The trainer library and the built-in examples; the user's script.
                        read_only=[WORKERS_PACKAGE, TRAINER_LIB, script.parent],
                        writable=[job_dir, checkpoint_dir],
                        gpu_ids=run.gpu_ids,
                        scratch=job_dir,
                    ),
                    env,
                    spec.owner,
                )
            with self._lock:
                # A stop that arrived while we were starting must not miss this process.
                if run.stop_requested.is_set():
                    raise _StopRequested
                # This thread forks the trainer, and the death signal set by the shim fires
                # when this thread ends: it must (and does) outlive the processes it starts.
                proc = subprocess.Popen(
                    deathsig.command(argv),
                    env=env,
                    cwd=cwd,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    start_new_session=True,  # its own process group, so a stop reaches children
                )
                run.procs.append(proc)
                # Recorded before anyone can learn of it, and while it is our unreaped child.
                record = record_of(spec.job_id, spec.role, spec.index, proc.pid)
                self.records.write(record)
                run.records.append(record)
            self._pump(run, proc)
            tail = MetricTail(
                Path(local.env[contract.TRAINYARD_METRICS_FILE]),
                lambda ts, points: self._ship_points(run, ts, points),
                lambda ts, notes: self._shipper.put_system(run.key, ts, notes),
            )
            tail.start()
            run.tails.append(tail)
        run.watched = Watched(
            [p.pid for p in run.procs],
            run.gpu_ids,
            lambda ts, points: self._ship_points(run, ts, points),
        )
        run.started_report = {
            "job_id": spec.job_id,
            "attempt": spec.attempt,
            "role": spec.role,
            "index": spec.index,
            "node": self.node,
            "pids": [p.pid for p in run.procs],
            "incarnation": self.incarnation,
        }
        run.state = ReplicaState.RUNNING
        self._send_report(contract.TASK_REPLICA_STARTED, run.started_report)

    def _program(self, run: _ReplicaRun, instance_dir: Path) -> tuple[Path, Path]:
        """The script to run, and the folder its processes start in, as under torchrun launched
        in the project's folder: the job's code snapshot (unpacked once per job on this node),
        or the code root. A built-in example, which has no project, starts in the instance's
        own folder (TRAINYARD_SCRATCH_DIR, which every process gets)."""
        program = run.spec.program
        if "path" in program and "snapshot" not in program:
            return resolve_program(program, self._code_root), self._code_root
        if "snapshot" not in program:
            return resolve_program(program, self._code_root), instance_dir
        fetched = self.snapshots.fetches
        code = self.snapshots.checkout(
            program["snapshot"],
            self._workdir / "jobs" / str(run.spec.job_id) / "code",
            should_stop=run.stop_requested.is_set,
        )
        if self.snapshots.fetches > fetched:
            log.info("job %s: fetched code snapshot %s", run.spec.job_id, program["snapshot"])
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

    def _in_container(
        self,
        run: _ReplicaRun,
        local: LocalProcess,
        cwd: Path,
        script: Path,
        instance_dir: Path,
        checkpoint_dir: Path,
    ) -> list[str]:
        """The argv that runs this process in the job's container image."""
        spec = run.spec
        if self._container_runtime is None:
            raise RuntimeError(
                f"image {spec.container_image} runs in containers, but {self.node} has no "
                "container runtime (docker or podman; the agent's --container-runtime)"
            )
        env_file = instance_dir / f"env-{local.local_rank}"
        folders = {cwd, instance_dir, checkpoint_dir}
        mounts = [containers.Mount(TRAINER_LIB, read_only=True)]
        script_inside = None
        if "example" in spec.program:
            library, script_inside = containers.example_layout(script)
            mounts.append(library)
        # The code's folder is where the processes start: the snapshot, or the code root.
        mounts += [containers.Mount(folder) for folder in sorted(folders)]
        env = containers.container_env(local, run.gpu_ids, library=script_inside is not None)
        containers.write_env_file(env_file, env)
        name = containers.container_name(spec.job_id, spec.attempt, spec.tag, local.local_rank)
        run.containers.append(name)
        return containers.run_argv(
            self._container_runtime,
            spec.container_image,
            name,
            self.node,
            local,
            cwd,
            mounts,
            env_file,
            run.gpu_ids,
            script=script_inside,
            user=self.sandbox.container_user(spec.owner),
            shared_ipc=spec.local_world_size > 1,
        )

    def _remove_containers(self, names: list[str]) -> None:
        """A container outlives its `run` process when that dies of SIGKILL: remove it."""
        if self._container_runtime is None:
            return
        for name in names:
            try:
                subprocess.run(
                    containers.remove_argv(self._container_runtime, name),
                    capture_output=True,
                    timeout=KILL_WAIT_SECONDS * 4,
                    check=False,
                )
            except (OSError, subprocess.TimeoutExpired) as exc:
                log.warning("could not remove container %s: %s", name, exc)

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
            temporary = folder / f".{CHECKPOINT_MARKER}.{os.getpid()}.{threading.get_ident()}"
            temporary.write_text(f"{spec.job_id}\n")
            os.replace(temporary, marker)
        return folder

    def _pump(self, run: _ReplicaRun, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None and proc.stderr is not None
        key = run.key

        def out(ts: float, lines: list[str]) -> None:
            self._shipper.put(key, contract.STREAM_STDOUT, ts, lines)
            self._scan(run, ts, lines)

        def err(ts: float, lines: list[str]) -> None:
            run.stderr_tail.extend(lines[-STDERR_TAIL_LINES:])
            self._shipper.put(key, contract.STREAM_STDERR, ts, lines)
            self._scan(run, ts, lines)

        for pipe, emit, name in ((proc.stdout, out, "out"), (proc.stderr, err, "err")):
            reader = threading.Thread(
                target=pump_pipe, args=(pipe, emit), name=f"pipe-{proc.pid}-{name}", daemon=True
            )
            reader.start()
            run.readers.append(reader)

    def _scan(self, run: _ReplicaRun, ts: float, lines: list[str]) -> None:
        """Regex metrics from the lines; a definition over its budget is switched off, and the
        instance's log says so."""
        if run.regex_metrics is None:
            return
        points, notes = run.regex_metrics.scan(lines, ts)
        self._ship_points(run, ts, points)
        for note in notes:
            self._note(run, note)

    def _ship_points(self, run: _ReplicaRun, ts: float, points: list[Point]) -> None:
        if points:
            self._shipper.put(run.key, contract.STREAM_METRIC, ts, [p.to_json() for p in points])

    def _note(self, run: _ReplicaRun, message: str) -> None:
        """A message from the agent about this instance, in the instance's own log."""
        self._shipper.put_system(run.key, time.time(), [f"[trainyard] {message}"])

    def _watched(self) -> list[Watched]:
        with self._lock:
            runs = list(self._runs.values())
        return [
            r.watched for r in runs if r.state == ReplicaState.RUNNING and r.watched is not None
        ]

    def _monitor(self, run: _ReplicaRun) -> int | None:
        """Wait for the replica's processes: the exit code (0 when all succeeded, else the first
        failure's), or None when a stop was requested. A failure takes the others down."""
        while not run.stop_requested.is_set():
            codes = [sandbox.exit_code(_exit_code(p), self.sandbox) for p in run.procs]
            failed = next((c for c in codes if c not in (None, 0)), None)
            if failed is not None:
                if run.stop_requested.is_set():
                    return None  # it died of our SIGTERM: a stop, not a failure
                run.ended_at = time.time()
                run.failed_local_rank = codes.index(failed)
                with self._lock:
                    for proc in run.procs:
                        _signal_group(proc, signal.SIGTERM)
                return failed
            if all(c == 0 for c in codes):
                run.ended_at = time.time()
                return 0
            run.stop_requested.wait(MONITOR_INTERVAL_SECONDS)
        return None

    def _failure_reason(self, run: _ReplicaRun, exit_code: int) -> str:
        """How the first failed process ended; with the exception it recorded (torch's @record
        writes it to TORCHELASTIC_ERROR_FILE), that exception and its rank."""
        how = describe_exit(exit_code)
        recorded = None
        if run.failed_local_rank is not None and run.instance_dir is not None:
            recorded = recorded_error(error_file(run.instance_dir, run.failed_local_rank))
        if recorded is not None:
            assert run.failed_local_rank is not None
            return f"{recorded} (rank {run.spec.rank_offset + run.failed_local_rank}, {how})"
        # No @record: the exception its traceback ended with, if it printed one.
        printed = last_exception(list(run.stderr_tail))
        return f"{printed} ({how})" if printed else how

    def _request_stop(
        self, run: _ReplicaRun, reason: str, grace_seconds: float | None = None
    ) -> None:
        """Ask a replica to stop: SIGTERM now, and its own thread does the rest (SIGKILL after
        the grace, the exit report), so the caller does not wait."""
        with self._lock:
            if not run.stop_requested.is_set():
                run.stop_reason = reason
                if grace_seconds is not None:
                    run.stop_grace = max(0.0, grace_seconds)
                run.stop_requested.set()
            if not run.leaders_released:
                for proc in run.procs:
                    _signal_group(proc, signal.SIGTERM)

    def _stop(self, run: _ReplicaRun) -> None:
        """Make sure nothing of the replica survives, even children that left the trainer."""
        with self._lock:
            for proc in run.procs:
                _signal_group(proc, signal.SIGTERM)
        grace_ends = time.monotonic() + run.stop_grace
        self._wait(
            lambda: all(_exit_code(p) is not None for p in run.procs),
            until=lambda c: min(grace_ends, c.kill_by) if c else grace_ends,
        )
        with self._lock:
            for proc in run.procs:
                # Also reaches grandchildren that outlived the trainer in its group.
                _signal_group(proc, signal.SIGKILL)
        kill_wait_ends = time.monotonic() + KILL_WAIT_SECONDS
        gone = self._wait(
            lambda: not any(group_members(r.pgid) for r in run.records),
            until=lambda c: min(kill_wait_ends, c.flush_until) if c else kill_wait_ends,
        )
        with self._lock:
            run.leaders_released = True
        reaped_by = time.monotonic() + KILL_WAIT_SECONDS
        for proc in run.procs:
            try:
                proc.wait(max(0.0, self._bounded(reaped_by, lambda c: c.flush_until)))
            except subprocess.TimeoutExpired:
                log.warning("process %s of job %s did not die", proc.pid, run.spec.job_id)
        if gone:
            for record in run.records:
                self.records.remove(record)
        else:
            log.warning(
                "job %s %s: process group still there after SIGKILL; left for the next reap",
                run.spec.job_id, run.spec.tag,
            )  # fmt: skip
        readers_end = time.monotonic() + STOP_GRACE_SECONDS
        for reader in run.readers:
            # A child that left the group may still hold the pipe: do not wait for it forever.
            reader.join(max(0.0, self._bounded(readers_end, lambda c: c.flush_until)))
        for tail in run.tails:
            tail.stop()
        for tail in run.tails:
            tail.join(max(0.0, self._bounded(readers_end, lambda c: c.flush_until)))
        self._remove_containers(run.containers)

    def _finish(self, run: _ReplicaRun, exit_code: int | None, reason: str) -> None:
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
        report = {
            "job_id": spec.job_id,
            "attempt": spec.attempt,
            "role": spec.role,
            "index": spec.index,
            "node": self.node,
            "state": run.state.value,
            "exit_code": exit_code,
            "reason": reason,
            "stderr_tail": list(run.stderr_tail),
            "ended_at": run.ended_at,
            "incarnation": self.incarnation,
        }
        with self._lock:
            self._runs.pop(run.ident, None)
            self._free_gpus |= set(run.gpu_ids)
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
        folder = self.checkpoint_root / f"job-{job_id}-{checkpoint_key}"
        return checkpoint_retention.remove_folder(folder)

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
        while not done():
            now = time.monotonic()
            deadline = until(self._closing)
            if deadline is not None and now >= deadline:
                return done()
            if waiting_for and now >= warn_at:
                log.warning("still waiting for %s", waiting_for)
                warn_at = now + STILL_WAITING_WARNING_SECONDS
            time.sleep(WAIT_SLICE_SECONDS)
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
        return {
            "job_id": job_id,
            "attempt": attempt,
            "role": role,
            "index": index,
            "node": self.node,
            "state": ReplicaState.UNKNOWN.value,
            "exit_code": None,
            "reason": f"not running on {self.node}",
            "stderr_tail": [],
            "ended_at": time.time(),
            "incarnation": self.incarnation,
        }


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


def _exit_code(proc: subprocess.Popen[bytes]) -> int | None:
    """The process's exit code (negative: killed by that signal), None while it runs.

    Read without reaping it (WNOWAIT): while the leader stays our unreaped child its pid, the
    group id, cannot be reused, so signalling the group cannot reach a stranger.
    """
    if proc.returncode is not None:
        return proc.returncode
    try:
        status = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return proc.poll()
    if status is None:
        return None
    if status.si_code == os.CLD_EXITED:
        return status.si_status
    return -status.si_status  # CLD_KILLED or CLD_DUMPED


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    """Signal the process group the process leads. Call with the supervisor's lock held, and
    only before the leader is reaped (see _ReplicaRun.leaders_released)."""
    if proc.returncode is not None:
        return  # reaped: the id may already belong to someone else
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


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
