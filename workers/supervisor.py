"""The agent's supervisor: owns every trainer process on this node, from start to reported exit.

Shaped like torch's elastic agent: each replica goes through `_rendezvous`, `_start`,
`_monitor` and, always, `_stop` in one thread of its own, and its outcome is reported to the
console only after every line it printed is in Redis. Celery only hands it short messages
("start this replica", "stop that job"); the processes belong to the supervisor, not to Celery.
"""

import enum
import logging
import os
import signal
import socket
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from workers import contract, inventory
from workers.launcher import build_processes
from workers.logship import LogShipper, ReplicaKey, pump_pipe
from workers.metricfeed import MetricTail, SystemSampler, Watched
from workers.metricparse import BadMetric, Point, RegexMetric, compile_definitions, scan_lines
from workers.programs import ProgramError, resolve_program
from workers.spec import ReplicaSpec

log = logging.getLogger(__name__)

# How long a non-master replica waits for the master's agent to publish MASTER_PORT.
RENDEZVOUS_TIMEOUT_SECONDS = 600.0
# Between SIGTERM and SIGKILL when stopping a process group.
STOP_GRACE_SECONDS = 5.0
MONITOR_INTERVAL_SECONDS = 0.1
STDERR_TAIL_LINES = 20

Report = Callable[[str, dict[str, Any]], None]


class ReplicaState(enum.Enum):
    """Lifecycle of one replica on this node.

    WAITING -> RUNNING -> SUCCEEDED | FAILED | STOPPED; WAITING -> FAILED | STOPPED when the
    rendezvous times out or the job is stopped before the processes start.
    """

    WAITING = "waiting"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"


class _StopRequested(Exception):
    pass


@dataclass
class _ReplicaRun:
    spec: ReplicaSpec
    key: ReplicaKey
    state: ReplicaState = ReplicaState.WAITING
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    readers: list[threading.Thread] = field(default_factory=list)
    stop_requested: threading.Event = field(default_factory=threading.Event)
    stop_reason: str = ""
    stderr_tail: deque[str] = field(default_factory=lambda: deque(maxlen=STDERR_TAIL_LINES))
    gpu_ids: list[int] = field(default_factory=list)
    thread: threading.Thread | None = None
    tails: list[MetricTail] = field(default_factory=list)
    regex_metrics: list[RegexMetric] = field(default_factory=list)
    watched: Watched | None = None


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
    ) -> None:
        self.node = node
        self._redis = client
        self._shipper = shipper
        self._report = report
        self._workdir = workdir
        self._code_root = code_root
        self._free_gpus = set(range(gpus))
        self._runs: dict[tuple[int, str, int], _ReplicaRun] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._sampler = SystemSampler(self._watched, gpu_usage=inventory.gpu_usage)
        self._sampler.start()

    # --- what Celery tasks call ---

    def start(self, spec: ReplicaSpec) -> bool:
        """Start a replica unless this node already has it; safe to call twice."""
        with self._lock:
            if self._closed:
                raise RuntimeError("agent is shutting down")
            ident = (spec.job_id, spec.role, spec.index)
            if ident in self._runs:
                return False
            run = _ReplicaRun(spec, ReplicaKey(spec.job_id, spec.role, spec.index, self.node))
            if spec.gpus:
                run.gpu_ids = sorted(self._free_gpus)[: spec.gpus]
                self._free_gpus -= set(run.gpu_ids)
            self._runs[ident] = run
            run.thread = threading.Thread(
                target=self._run, args=(run,), name=f"replica-{spec.job_id}-{spec.tag}"
            )
            run.thread.start()
            return True

    def stop_job(self, job_id: int, reason: str) -> int:
        """Stop every process of the job on this node; returns how many replicas it touched."""
        with self._lock:
            runs = [r for (j, _, _), r in self._runs.items() if j == job_id]
        for run in runs:
            self._request_stop(run, reason)
        return len(runs)

    def running(self) -> list[dict[str, Any]]:
        with self._lock:
            return [
                {"job_id": r.spec.job_id, "role": r.spec.role, "index": r.spec.index}
                for r in self._runs.values()
            ]

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop everything and wait for the exit reports: an agent leaves no orphan behind."""
        with self._lock:
            self._closed = True
            runs = list(self._runs.values())
        self._sampler.stop()
        for run in runs:
            self._request_stop(run, "the node agent shut down")
        deadline = time.monotonic() + timeout
        for run in runs:
            if run.thread is not None:
                run.thread.join(max(0.0, deadline - time.monotonic()))

    # --- one replica, in its own thread ---

    def _run(self, run: _ReplicaRun) -> None:
        exit_code: int | None = None
        reason = ""
        try:
            port = self._rendezvous(run)
            self._start(run, port)
            exit_code = self._monitor(run)
            if run.stop_requested.is_set():
                run.state = ReplicaState.STOPPED
                reason = run.stop_reason
            elif exit_code == 0:
                run.state = ReplicaState.SUCCEEDED
            else:
                run.state = ReplicaState.FAILED
                reason = f"exited with code {exit_code}"
        except _StopRequested:
            run.state = ReplicaState.STOPPED
            reason = run.stop_reason
        except Exception as exc:  # anything else is a failure of this replica, reported below
            log.exception("replica %s of job %s failed to run", run.spec.tag, run.spec.job_id)
            run.state = ReplicaState.FAILED
            reason = str(exc) or type(exc).__name__
        finally:
            self._stop(run)
            self._finish(run, exit_code, reason)

    def _rendezvous(self, run: _ReplicaRun) -> int:
        key = contract.rendezvous_key(run.spec.job_id)
        if run.spec.hosts_rendezvous:
            port = _free_port(run.spec.master_addr)
            self._redis.set(key, port, ex=7 * 24 * 3600)
            return port
        deadline = time.monotonic() + RENDEZVOUS_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            value = self._redis.get(key)
            if value is not None:
                return int(value)
            if run.stop_requested.wait(0.1):
                raise _StopRequested
        raise TimeoutError(
            f"the master did not publish its port within {RENDEZVOUS_TIMEOUT_SECONDS:.0f} s"
        )

    def _start(self, run: _ReplicaRun, master_port: int) -> None:
        spec = run.spec
        try:
            script = resolve_program(spec.program, self._code_root)
        except ProgramError as exc:
            raise RuntimeError(f"cannot run the program on {self.node}: {exc}") from None
        job_dir = self._workdir / "jobs" / str(spec.job_id) / spec.tag
        checkpoint_dir = job_dir / "checkpoints"
        checkpoint_dir.mkdir(parents=True, exist_ok=True)
        try:
            run.regex_metrics = compile_definitions(spec.metric_definitions)
        except BadMetric as exc:
            self._note(run, f"metric definitions ignored: {exc}")
        for local in build_processes(spec, script, master_port, checkpoint_dir, run.gpu_ids):
            with self._lock:
                # A stop that arrived while we were starting must not miss this process.
                if run.stop_requested.is_set():
                    raise _StopRequested
                proc = subprocess.Popen(
                    local.argv,
                    env=local.env,
                    cwd=job_dir,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    start_new_session=True,  # its own process group, so a stop reaches children
                )
                run.procs.append(proc)
            self._pump(run, proc)
            tail = MetricTail(
                Path(local.env[contract.TRAINYARD_METRICS_FILE]),
                lambda ts, points: self._ship_points(run, ts, points),
                lambda ts, notes: self._shipper.put(run.key, contract.STREAM_STDERR, ts, notes),
            )
            tail.start()
            run.tails.append(tail)
        run.watched = Watched(
            [p.pid for p in run.procs],
            run.gpu_ids,
            lambda ts, points: self._ship_points(run, ts, points),
        )
        run.state = ReplicaState.RUNNING
        self._report(
            contract.TASK_REPLICA_STARTED,
            {
                "job_id": spec.job_id,
                "role": spec.role,
                "index": spec.index,
                "node": self.node,
                "pids": [p.pid for p in run.procs],
            },
        )

    def _pump(self, run: _ReplicaRun, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None and proc.stderr is not None
        key = run.key

        def out(ts: float, lines: list[str]) -> None:
            self._shipper.put(key, contract.STREAM_STDOUT, ts, lines)
            if run.regex_metrics:
                self._ship_points(run, ts, scan_lines(run.regex_metrics, lines, ts))

        def err(ts: float, lines: list[str]) -> None:
            run.stderr_tail.extend(lines[-STDERR_TAIL_LINES:])
            self._shipper.put(key, contract.STREAM_STDERR, ts, lines)
            if run.regex_metrics:
                self._ship_points(run, ts, scan_lines(run.regex_metrics, lines, ts))

        for pipe, emit, name in ((proc.stdout, out, "out"), (proc.stderr, err, "err")):
            reader = threading.Thread(
                target=pump_pipe, args=(pipe, emit), name=f"pipe-{proc.pid}-{name}", daemon=True
            )
            reader.start()
            run.readers.append(reader)

    def _ship_points(self, run: _ReplicaRun, ts: float, points: list[Point]) -> None:
        if points:
            self._shipper.put(run.key, contract.STREAM_METRIC, ts, [p.to_json() for p in points])

    def _note(self, run: _ReplicaRun, message: str) -> None:
        """A message from the agent about this instance, in the instance's own log."""
        self._shipper.put(run.key, contract.STREAM_STDERR, time.time(), [f"[trainyard] {message}"])

    def _watched(self) -> list[Watched]:
        with self._lock:
            runs = list(self._runs.values())
        return [
            r.watched for r in runs if r.state == ReplicaState.RUNNING and r.watched is not None
        ]

    def _monitor(self, run: _ReplicaRun) -> int:
        """Wait for the replica's processes; the first failure takes the others down with it."""
        while True:
            codes = [p.poll() for p in run.procs]
            failed = [c for c in codes if c not in (None, 0)]
            if failed:
                for proc in run.procs:
                    _terminate_group(proc)
                for proc in run.procs:
                    proc.wait()
                return int(failed[0])
            if all(c == 0 for c in codes):
                return 0
            run.stop_requested.wait(MONITOR_INTERVAL_SECONDS)

    def _request_stop(self, run: _ReplicaRun, reason: str) -> None:
        with self._lock:
            if not run.stop_requested.is_set():
                run.stop_reason = reason
                run.stop_requested.set()
            procs = list(run.procs)
        for proc in procs:
            _terminate_group(proc)

    def _stop(self, run: _ReplicaRun) -> None:
        """Make sure nothing of the replica survives, even children that left the trainer."""
        for proc in run.procs:
            _terminate_group(proc)
        for reader in run.readers:
            reader.join(STOP_GRACE_SECONDS)
        for tail in run.tails:
            tail.stop()
        for tail in run.tails:
            tail.join(STOP_GRACE_SECONDS)

    def _finish(self, run: _ReplicaRun, exit_code: int | None, reason: str) -> None:
        spec = run.spec
        # The exit is reported only once every line is in Redis, so the console can close the
        # job's log knowing nothing more will come.
        while not self._shipper.flush(timeout=60):
            # Redis is away and the lines wait in the spool; the report could not reach the
            # console through Redis anyway, and sent before the lines it would close their log.
            log.warning("log lines of %s/%s not in Redis yet; waiting", spec.job_id, spec.tag)
        with self._lock:
            self._runs.pop((spec.job_id, spec.role, spec.index), None)
            self._free_gpus |= set(run.gpu_ids)
        self._report(
            contract.TASK_REPLICA_EXITED,
            {
                "job_id": spec.job_id,
                "role": spec.role,
                "index": spec.index,
                "node": self.node,
                "state": run.state.value,
                "exit_code": exit_code,
                "reason": reason,
                "stderr_tail": list(run.stderr_tail),
            },
        )


def _terminate_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process group, then SIGKILL what is left after a grace period."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(STOP_GRACE_SECONDS)
    except subprocess.TimeoutExpired:
        pass
    try:
        # Also reaches grandchildren that outlived the trainer in its group.
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _free_port(address: str) -> int:
    """A port that is free on this host now; the trainer binds it a moment later."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((address, 0))
        except OSError:
            sock.bind(("", 0))
        return int(sock.getsockname()[1])
