"""One instance of a Trainyard job inside a Slurm job step: the part of the agent's supervisor
that a node Slurm chose still needs.

The console's batch script (jobs/services/slurm/slurm_batch.py) runs

    srun --kill-on-bad-exit=1 [--het-group=0,1,2] python -m workers.slurmstep --plan PLAN

and Slurm starts one task per instance. PLAN, a JSON file in the attempt's folder on the
shared file system, holds every instance's spec in rank order (the console's own
jobs.services.lifecycle.dispatch.specs_in_rank_order), so task SLURM_PROCID runs spec number
SLURM_PROCID: the master (or the parameter server's scheduler) is task 0, on the first node
of the allocation, as torch's and MXNet's launchers under Slurm have it.

What Slurm does not give, this does, exactly as an agent would (workers/launcher.py builds the
processes of both):
- the rendezvous: task 0 takes a free port on its own address and writes both to
  `rendezvous.json` in the attempt folder; the others wait for it. MASTER_ADDR (or
  DMLC_PS_ROOT_URI) is therefore the first node's address, on the interface that reaches the
  node srun was launched from, whether or not the cluster's host names resolve;
- the whole torchrun or DMLC contract, Trainyard's variables and the job's own;
- every line of every process, tagged `[worker-1]`, on this task's stdout (Slurm's output),
  and, where the plan names a credentials file, to the job's log in the console's Redis as an
  agent ships it (workers/logship.py: batches, a spool on the instance's folder while Redis is
  away, the job's log limits), with the metrics the image's regexes find in it. The Redis
  user in that file may touch this job's keys and nothing else
  (jobs/services/slurm/slurm_access.py);
- how it ended: the exception the process recorded (@record) or its traceback printed, in
  `outcome-<tag>.json` beside the plan, and as a last tagged line. The exit status is the
  first failed process's, so srun's --kill-on-bad-exit ends the other instances.

Each trainer runs in the agents' sandbox (workers/sandbox.py), built the same way: its own PID
namespace, a root that holds only the system, its Python, the trainer library and the job's
code (read-only), its instance's folder and the job's checkpoint folder (writable); and, where
the step runs as root, the uid of its console user (uid base + user id), so that one user's job
cannot read another's folders on the shared file system. The plan, the job's Redis credentials,
the other instances' folders, the console's files: none of them exist in there. Where bwrap
cannot run, the instance says so in its log and runs unsandboxed.

No shell runs anywhere: the script's argv is a list. SIGTERM (scancel, a time limit) goes on to
every process of the instance, which then has Slurm's KillWait to finish.
"""

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from collections import deque
from pathlib import Path
from typing import IO

import psutil
import redis

from workers import (
    cgroups,
    contract,
    folderaccess,
    jobenv,
    launcher,
    limits,
    programs,
    sandbox,
    unixids,
)
from workers.launcher import NodeNetwork
from workers.logquota import LogLimits
from workers.logship import LogShipper, ReplicaKey
from workers.metricfeed import MetricTail
from workers.metricparse import Point, RegexScanner, compile_definitions
from workers.spec import ReplicaSpec, SpecError
from workers.supervisor import STDERR_TAIL_LINES, describe_exit, recorded_error
from workers.tracebacks import last_exception

RENDEZVOUS_FILE = "rendezvous.json"
RENDEZVOUS_POLL_SECONDS = 0.05
DEFAULT_RENDEZVOUS_TIMEOUT = 600.0
# Exit statuses of the wrapper itself, when the instance never started.
EXIT_BAD_PLAN = 2
EXIT_NO_RENDEZVOUS = 3
# At the end, how long the last lines may take to reach Redis before the wrapper exits anyway
# (they stay in the spool on the shared folder then).
SHIP_CLOSE_SECONDS = 30.0
# A stop that came while an instance's processes were starting: SIGTERM is said again every
# STOP_REPEAT_INTERVAL for STOP_REPEAT_SECONDS (a trainer still being set up missed the first).
STOP_REPEAT_SECONDS = 5.0
STOP_REPEAT_INTERVAL = 0.25
# The same when Redis has been away long enough to be said (redis-<tag>.json): a try or two
# more, not the half-minute a flush of many lines to a reachable Redis may need.
SHIP_CLOSE_UNREACHABLE_SECONDS = 5.0
# How long lines may wait in the spool, Redis unreachable, before the wrapper says so in its
# redis-<tag>.json (the console's page then does: a pool whose nodes cannot reach the console's
# Redis ran jobs to "succeeded" with no line in their log, and nothing said why).
REDIS_SILENT_SECONDS = 10.0
# Also how often the wrapper beats (contract.alive_key): the console says an instance is
# silent after a few missed beats, and lost after the plan's lost_seconds.
REDIS_WATCH_SECONDS = 2.0
HEARTBEAT_TIMEOUT = 2.0
DEFAULT_LOST_SECONDS = 45.0
HEARD_KEEP_SECONDS = 7 * 24 * 3600


class StepError(RuntimeError):
    """The instance cannot start; the message says why, in the user's words."""


def outcome_file(attempt_dir: Path, tag: str) -> Path:
    return attempt_dir / f"outcome-{tag}.json"


def where_file(attempt_dir: Path, tag: str) -> Path:
    return attempt_dir / f"where-{tag}.json"


def redis_file(attempt_dir: Path, tag: str) -> Path:
    """There while the instance's lines cannot reach Redis: since when, and where it tries."""
    return attempt_dir / f"redis-{tag}.json"


def spec_for_task(plan: dict[str, object], task: int) -> dict[str, object]:
    specs = plan.get("specs")
    if not isinstance(specs, list) or not 0 <= task < len(specs):
        raise StepError(f"the plan has no instance for Slurm task {task}")
    spec = specs[task]
    if not isinstance(spec, dict):
        raise StepError(f"the plan's instance {task} is not a spec")
    return spec


def own_network(peer: str | None) -> NodeNetwork:
    """This host's address on the interface that reaches `peer` (the node srun ran on), and
    that interface's name. A UDP connect sends nothing: it only asks the kernel for a route."""
    address = "127.0.0.1"
    if peer:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            try:
                probe.connect((peer, 9))
                address = probe.getsockname()[0]
            except OSError:
                pass
    interface = None
    for name, addresses in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == address for a in addresses):
            interface = name
            break
    return NodeNetwork(address=address, interface=interface)


def free_port(address: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


def publish_rendezvous(attempt_dir: Path, address: str, port: int) -> None:
    """Atomically: a reader sees the whole file or none (rename on one file system)."""
    temporary = attempt_dir / f".{RENDEZVOUS_FILE}.{os.getpid()}"
    temporary.write_text(json.dumps({"address": address, "port": port}))
    temporary.replace(attempt_dir / RENDEZVOUS_FILE)


def wait_for_rendezvous(attempt_dir: Path, timeout: float) -> tuple[str, int]:
    path = attempt_dir / RENDEZVOUS_FILE
    deadline = time.monotonic() + timeout
    while True:
        try:
            data = json.loads(path.read_text())
            return str(data["address"]), int(data["port"])
        except (OSError, ValueError, KeyError):
            pass
        if time.monotonic() > deadline:
            raise StepError(
                f"the first instance did not publish its address within {timeout:.0f} s"
            )
        time.sleep(RENDEZVOUS_POLL_SECONDS)


def gpu_ids(env: dict[str, str]) -> list[int]:
    """The GPUs Slurm gave this task (it sets CUDA_VISIBLE_DEVICES for a GRES allocation)."""
    visible = env.get("CUDA_VISIBLE_DEVICES", "")
    return [int(g) for g in visible.split(",") if g.strip().isdigit()]


class Shipping:
    """An instance's lines and regex metrics on their way to the job's log in Redis."""

    def __init__(
        self,
        spec: ReplicaSpec,
        url: str,
        spool: Path,
        silent_file: Path,
        lost_seconds: float = DEFAULT_LOST_SECONDS,
    ) -> None:
        self.key = ReplicaKey(spec.job_id, spec.role, spec.index, spec.node, spec.attempt)
        self.shipper = LogShipper(redis.Redis.from_url(url), spool)
        # The heartbeat's own connection: a beat never waits behind a batch of lines.
        self.beats = redis.Redis.from_url(
            url, socket_timeout=HEARTBEAT_TIMEOUT, socket_connect_timeout=HEARTBEAT_TIMEOUT
        )
        self.alive = contract.alive_key(spec.job_id, spec.attempt, spec.tag)
        self.heard = contract.heard_key(spec.job_id, spec.attempt)
        self.tag = spec.tag
        self.lost_ms = max(1, int(lost_seconds * 1000))
        self.spool = spool
        if spec.log_limits:
            self.shipper.limit(self.key, LogLimits.from_dict(spec.log_limits))
        definitions, self.problems = compile_definitions(spec.metric_definitions)
        self.scanner = RegexScanner(definitions) if definitions else None
        self.lock = threading.Lock()
        # Where it sends, without the credentials: for the console's words.
        address = urllib.parse.urlsplit(url)
        self.redis_address = f"{address.hostname}:{address.port or 6379}"
        self.silent_file = silent_file
        self.closed = threading.Event()
        self.watch = threading.Thread(target=self._watch_redis, name="redis-watch", daemon=True)
        self.watch.start()

    def put(self, stream: str, line: str) -> None:
        ts = time.time()
        self.shipper.put(self.key, stream, ts, [line])
        if self.scanner is not None and stream == contract.STREAM_STDOUT:
            with self.lock:  # one scanner, two relays
                points, notes = self.scanner.scan([line], ts)
            if points:
                lines = [p.to_json() for p in points]
                self.shipper.put(self.key, contract.STREAM_METRIC, ts, lines)
            for note in notes:
                self.note(note)

    def note(self, message: str) -> None:
        self.shipper.put_system(self.key, time.time(), [f"[trainyard] {message}"])

    def follow_metrics(self, path: Path, below: Path, uid: int) -> MetricTail:
        """A process's metrics file (trainyard_metrics), followed as the agents follow it: as
        the job's own file (`uid`'s), below `below`, which no job can write to."""

        def points(ts: float, found: list[Point]) -> None:
            self.shipper.put(self.key, contract.STREAM_METRIC, ts, [p.to_json() for p in found])

        def notes(ts: float, lines: list[str]) -> None:
            self.shipper.put_system(self.key, ts, lines)

        tail = MetricTail(path, points, notes, below=below, uid=uid)
        tail.start()
        return tail

    def _watch_redis(self) -> None:
        """Beat (the console's sign that the instance lives), and say, in silent_file, when
        lines have waited in the spool, or beats have failed, for REDIS_SILENT_SECONDS;
        remove it once they went."""
        since: float | None = None
        while True:
            beating = self._beat()
            if self.closed.wait(REDIS_WATCH_SECONDS):
                return
            if beating and not self.shipper.spooling:
                since = None
                self.silent_file.unlink(missing_ok=True)
                continue
            since = since or time.time()
            if time.time() - since >= REDIS_SILENT_SECONDS and not self.silent_file.exists():
                said = {"since": since, "redis": self.redis_address}
                self.silent_file.write_text(json.dumps(said))

    def _beat(self) -> bool:
        """The instance's alive_key, for lost_seconds, and its tag among those heard."""
        try:
            with self.beats.pipeline(transaction=False) as beat:
                beat.set(self.alive, "1", px=self.lost_ms)
                beat.hset(self.heard, self.tag, "1")
                beat.expire(self.heard, HEARD_KEEP_SECONDS)
                beat.execute()
        except redis.RedisError:
            return False
        return True

    def close(self) -> bool:
        """Send what is left; whether every line reached Redis (else it stays in the spool)."""
        self.shipper.release(self.key)
        unreachable = self.silent_file.exists()
        # Delivered: every line put is in Redis (the flush's answer), and none waits in the
        # spool. Lines still queued when the flush gives up are in neither.
        delivered = self.shipper.flush(
            SHIP_CLOSE_UNREACHABLE_SECONDS if unreachable else SHIP_CLOSE_SECONDS
        )
        self.shipper.close(timeout=1.0)
        self.closed.set()
        self.watch.join()
        self.beats.close()
        delivered = delivered and not self.shipper.spooling
        if delivered:
            self.silent_file.unlink(missing_ok=True)
        return delivered


class Instance:
    """The processes of one instance, their output relayed with its tag."""

    def __init__(
        self,
        spec: ReplicaSpec,
        processes: list[launcher.LocalProcess],
        cwd: Path,
        shipping: Shipping | None = None,
    ):
        self.spec = spec
        self.shipping = shipping
        self.lock = threading.Lock()
        self.stderr_tails: dict[int, deque[str]] = {}
        self.children: list[subprocess.Popen[bytes]] = []
        self.relays: list[threading.Thread] = []
        for process in processes:
            # The job's variables go on stdin to the last step (workers/jobenv.py), which runs
            # as the job's uid; this wrapper may be root, and so are bwrap and setpriv.
            job_env = jobenv.stdin_for(process.env)
            try:
                child = subprocess.Popen(
                    process.argv,
                    env=jobenv.privileged_env(),
                    cwd=cwd,
                    stdin=job_env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    # A group of its own, signalled whole: the sandbox's bwrap ignores SIGTERM
                    # (it would only kill the trainer outright), so the trainer must get it.
                    start_new_session=True,
                )
            finally:
                os.close(job_env)
            self.children.append(child)
            tail: deque[str] = deque(maxlen=STDERR_TAIL_LINES)
            self.stderr_tails[process.local_rank] = tail
            assert child.stdout is not None and child.stderr is not None
            for pipe, name, keep in (
                (child.stdout, contract.STREAM_STDOUT, None),
                (child.stderr, contract.STREAM_STDERR, tail),
            ):
                relay = threading.Thread(target=self._relay, args=(pipe, name, keep), daemon=True)
                relay.start()
                self.relays.append(relay)

    def _relay(self, pipe: IO[bytes], stream: str, keep: deque[str] | None) -> None:
        for raw in pipe:
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            if keep is not None:
                keep.append(line)
            self.say(line, stream)

    def say(self, line: str, stream: str = "") -> None:
        """A line to Slurm's output, tagged; and to the job's log: the trainer's own on its
        stream, the wrapper's (no stream) as the agent's notes are."""
        with self.lock:
            try:
                sys.stdout.write(f"[{self.spec.tag}] {line}\n")
                sys.stdout.flush()
            except (OSError, ValueError):
                # srun, which reads this, is gone (scancel ends it first on the batch node):
                # the line still goes to the job's log, and the outcome is still written.
                pass
        if self.shipping is not None:
            if stream:
                self.shipping.put(stream, line)
            else:
                self.shipping.note(line)

    def terminate(self) -> None:
        """SIGTERM to each process group: the trainer inside its sandbox gets it, and has
        Slurm's KillWait to save a checkpoint."""
        for child in self.children:
            if child.poll() is None:
                try:
                    os.killpg(child.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass

    def keep_terminating(self, seconds: float) -> None:
        """SIGTERM again every STOP_REPEAT_INTERVAL for `seconds`, while a process lives."""

        def repeat() -> None:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline and any(c.poll() is None for c in self.children):
                self.terminate()
                time.sleep(STOP_REPEAT_INTERVAL)

        threading.Thread(target=repeat, name="stop-repeat", daemon=True).start()

    def wait(self) -> list[int]:
        codes = [child.wait() for child in self.children]
        for relay in self.relays:
            relay.join()
        return codes


def _sandboxed(
    process: launcher.LocalProcess,
    isolation: sandbox.Sandbox,
    spec: ReplicaSpec,
    script: Path,
    code_root: Path,
    writable: tuple[Path, Path],
    named: tuple[folderaccess.NamedFolder, ...],
) -> launcher.LocalProcess:
    """The process as it runs in the sandbox: the agents' folders, for a node Slurm chose;
    `writable`: the instance's folder and the checkpoint folder."""
    instance_dir, _ = writable
    env = process.env
    if "example" in spec.program and isolation.isolation.isolated:
        # A built-in example imports Trainyard's `workers` package; in the sandbox its folder
        # shows nothing else.
        env = dict(env, PYTHONPATH=f"{env['PYTHONPATH']}:{launcher.WORKERS_PACKAGE.parent}")
    argv, env = isolation.wrap(
        process.argv,
        sandbox.Folders(
            cwd=script.parent,
            read_only=[launcher.WORKERS_PACKAGE, launcher.TRAINER_LIB, script.parent, code_root],
            writable=list(writable),
            gpu_ids=gpu_ids(process.env),
            scratch=instance_dir,
            named=named,
        ),
        env,
        isolation.user_for(spec),
    )
    return launcher.LocalProcess(process.local_rank, argv, env)


def named_folders(spec: ReplicaSpec) -> tuple[folderaccess.NamedFolder, ...]:
    """The folders the job named, checked for the step's own user: Slurm runs a pool's jobs
    as their owners (or as the console's user, where the console refuses named folders), and
    the sandbox of an unprivileged step binds nothing its user could not read anyway. Raises
    folderaccess.FolderRefused."""
    me = unixids.own_user(os.getuid(), os.getgid(), os.getgroups())
    wanted = folderaccess.requests(spec.data_folders, spec.results_folder)
    return tuple(folderaccess.check(path, me, writable) for path, writable in wanted)


def failure_reason(
    spec: ReplicaSpec,
    instance_dir: Path,
    codes: list[int],
    tails: dict[int, deque[str]],
    file_owner: int,
) -> str:
    """How the first failed process ended, in the words the agents' reasons use. The error
    file is read as the job's own (`file_owner`'s), below the attempt's folder."""
    local_rank = next(i for i, code in enumerate(codes) if code != 0)
    how = describe_exit(codes[local_rank])
    recorded = recorded_error(
        launcher.error_file(instance_dir, local_rank), instance_dir.parent, file_owner
    )
    if recorded is not None:
        return f"{recorded} (rank {spec.rank_offset + local_rank}, {how})"
    printed = last_exception(list(tails.get(local_rank, ())))
    return f"{printed} ({how})" if printed else how


def run(plan_path: Path, env: dict[str, str]) -> int:
    # First of all: a stop (scancel) during the start must still end in an outcome, and reach
    # the processes once they exist.
    stopping: list[int] = []
    started: list[Instance] = []

    def forward(signum: int, _frame: object) -> None:
        stopping.append(signum)
        for instance in started:
            instance.terminate()

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, forward)
    attempt_dir = plan_path.parent
    plan = json.loads(plan_path.read_text())
    task = int(env.get("SLURM_PROCID", "0"))
    node = env.get("SLURMD_NODENAME") or socket.gethostname()
    fields = spec_for_task(plan, task)
    network = own_network(env.get("SLURM_LAUNCH_NODE_IPADDR"))
    timeout = float(plan.get("rendezvous_timeout") or DEFAULT_RENDEZVOUS_TIMEOUT)
    if fields.get("hosts_rendezvous"):
        address, port = network.address, free_port(network.address)
        publish_rendezvous(attempt_dir, address, port)
    else:
        address, port = wait_for_rendezvous(attempt_dir, timeout)
    try:
        spec = ReplicaSpec.from_dict({**fields, "node": node, "master_addr": address})
        script = programs.resolve_program(spec.program, Path(str(plan["code_root"])))
        named = named_folders(spec)
    except (SpecError, programs.ProgramError, KeyError, folderaccess.FolderRefused) as exc:
        raise StepError(f"cannot start: {exc}") from None
    instance_dir = attempt_dir / spec.tag
    instance_dir.mkdir(parents=True, exist_ok=True)
    # Where the instance runs, for the console's page while it does (Slurm tells the nodes of
    # the job, not which task is on which).
    where = {"node": node, "address": network.address}
    where_file(attempt_dir, spec.tag).write_text(json.dumps(where))
    checkpoint_dir = Path(str(plan["checkpoint_dir"]))
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    isolation = sandbox.probe(
        wanted=bool(plan.get("sandbox", True)), shared=sandbox.shared_from_env(env)
    )
    sandbox.prepare_scratch(instance_dir)
    for folder in (*sandbox.scratch_folders(instance_dir), checkpoint_dir):
        isolation.hand_over(folder, isolation.user_for(spec))
    processes = launcher.build_processes(
        spec,
        script,
        port,
        instance_dir,
        checkpoint_dir,
        gpu_ids(env),
        python=spec.python or str(plan.get("python") or sys.executable),
        base_env=env,
        network=network,
    )
    processes = [
        _sandboxed(
            p,
            isolation,
            spec,
            script,
            Path(str(plan["code_root"])),
            (instance_dir, checkpoint_dir),
            named,
        )
        for p in processes
    ]
    shipping = None
    if plan.get("credentials"):
        url = Path(str(plan["credentials"])).read_text().strip()
        # Beside the plan, where the trainer cannot reach it (its own folder is writable to it).
        shipping = Shipping(
            spec,
            url,
            attempt_dir / f".spool-{spec.tag}",
            redis_file(attempt_dir, spec.tag),
            float(str(plan.get("lost_seconds") or DEFAULT_LOST_SECONDS)),
        )
        for problem in shipping.problems:
            shipping.note(problem)
        if not isolation.isolation.isolated:
            shipping.note(f"this instance runs without a sandbox: {isolation.reason}")
    if stopping:
        # Stopped before its processes started (scancel in the step's first second): start
        # nothing. Started, its SIGTERM would reach the sandbox being set up and no trainer,
        # which would then run until KillWait's SIGKILL, with no outcome written.
        name = signal.Signals(stopping[0]).name
        stopped = {"state": "stopped", "exit_code": -stopping[0], "reason": f"stopped by Slurm "
                   f"({name}) before it started"}  # fmt: skip
        print(f"[{spec.tag}] Trainyard: {spec.tag} on {node} {stopped['reason']}", flush=True)
        return _ended(attempt_dir, spec, stopped, shipping, node, network.address, None)
    instance = Instance(spec, processes, cwd=script.parent, shipping=shipping)
    tails = []
    if shipping is not None:
        tails = [
            shipping.follow_metrics(
                Path(p.env[contract.TRAINYARD_METRICS_FILE]),
                attempt_dir,
                isolation.file_owner(isolation.user_for(spec)),
            )
            for p in processes
        ]
    started.append(instance)
    if stopping:
        # The stop came while the processes were being started: a trainer still being set up
        # in its sandbox misses a single SIGTERM, so it is said again for a few seconds.
        instance.keep_terminating(STOP_REPEAT_SECONDS)
    codes = [sandbox.exit_code(c, isolation) or 0 for c in instance.wait()]
    for tail in tails:
        tail.stop()
        tail.join()
    # The site's task/cgroup holds the step (docs/slurm.md); its counters are the step's use,
    # and say whether it was the OOM killer that ended it.
    usage = cgroups.slurm_step_usage()
    if all(code == 0 for code in codes):
        outcome: dict[str, object] = {"state": "succeeded", "exit_code": 0, "reason": ""}
    else:
        state = "stopped" if stopping else "failed"
        reason = failure_reason(
            spec,
            instance_dir,
            codes,
            instance.stderr_tails,
            isolation.file_owner(isolation.user_for(spec)),
        )
        limited = limits.end_reason(spec, usage) if usage is not None else None
        if limited is not None:
            reason = f"{limited}: {reason}"
        if stopping:
            reason = f"stopped by Slurm ({signal.Signals(stopping[0]).name}): {reason}"
        first = next(code for code in codes if code != 0)
        outcome = {"state": state, "exit_code": first, "reason": reason}
        instance.say(f"Trainyard: {spec.tag} on {node} {state}: {reason}")
    return _ended(attempt_dir, spec, outcome, shipping, node, network.address, usage)


def _ended(
    attempt_dir: Path,
    spec: ReplicaSpec,
    outcome: dict[str, object],
    shipping: Shipping | None,
    node: str,
    address: str,
    usage: cgroups.Usage | None,
) -> int:
    """Write the instance's outcome (its lines sent first); the wrapper's exit status."""
    # Every line in Redis before the outcome exists: the console closes the log once every
    # instance has one, and a line after the close would be lost to the reader.
    if shipping is not None and not shipping.close():
        # The console says so on the job's page: its log lacks these lines.
        outcome["log_undelivered"] = {
            "redis": shipping.redis_address,
            "spool": str(shipping.spool),
        }
        print(
            f"Trainyard: {spec.tag}: lines could not reach Redis at {shipping.redis_address}; "
            f"they stay in {shipping.spool}",
            file=sys.stderr,
            flush=True,
        )
    outcome.update(node=node, address=address, ended_at=time.time())
    if usage is not None:
        outcome["usage"] = usage.to_dict()
    outcome_file(attempt_dir, spec.tag).write_text(json.dumps(outcome))
    code = int(outcome["exit_code"])  # type: ignore[call-overload]
    return 0 if code == 0 else (code if code > 0 else 128 - code)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workers.slurmstep")
    parser.add_argument("--plan", type=Path, required=True, help="the attempt's plan.json")
    args = parser.parse_args(argv)
    try:
        return run(args.plan, dict(os.environ))
    except StepError as exc:
        print(f"Trainyard: {exc}", file=sys.stderr, flush=True)
        return EXIT_NO_RENDEZVOUS if "address" in str(exc) else EXIT_BAD_PLAN


if __name__ == "__main__":
    sys.exit(main())
