"""Start the whole Trainyard stack on this machine, restart what dies, stop it on Ctrl-C.

    python -m stack.run [--port 8000] [--nodes 2]

Every process is started by us, in its own session, and stopped by its PID (never by name).
Each one dies with us however we end, SIGKILL included: it is started through the death-signal
shim (workers/deathsig.py), from one thread that lives until every child has stopped, and its
pid is recorded in var/stack.pids, so that the next start stops what the signal missed
(stack/leftovers.py).
A process that exits while the stack runs is started again with the same argv, after a delay
that doubles while it keeps dying (1 s, 2 s, 4 s … 30 s) — the local stand-in for systemd's
Restart= (docs/operations.md). Ctrl-C stops the node agents first (with SIGUSR2, so they stop
their trainers and report, rather than leave them to their keepers), then the console worker
and the log keeper, the web server and Redis; SIGTERM and SIGHUP (the terminal closed) do the
same. A process still running its stop timeout after its signal is killed, and a line names
it: a node agent gets 45 s, every other process 15 s, so a stop takes at most 90 s.
"""

import argparse
import concurrent.futures
import enum
import json
import os
import queue
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import IO, Any

from stack.leftovers import AlreadyRunning, StackPids
from stack.netns import HostNetwork, new_tag, unavailable_reason
from stack.redis_server import (
    free_port,
    redis_answers,
    redis_argv,
    redis_server_binary,
    wait_for_redis,
)
from stack.trainer_image import CONTAINERS_CONF
from workers import deathsig

ROOT = Path(__file__).resolve().parent.parent
# Longer than a node agent's own stop (up to 30 s to stop its trainers and report them).
AGENT_STOP_TIMEOUT_SECONDS = 45.0
# Every other process: longer than the web server's graceful shutdown (10 s, stack/web.py).
STOP_TIMEOUT_SECONDS = 15.0


# --- supervision: one owner for the child processes -----------------------------------------


@dataclass(frozen=True)
class ChildRestarts:
    """When a process that exited is started again, and how long a stop may take."""

    first_delay: float = 1.0
    max_delay: float = 30.0
    # A process that stayed up this long was healthy: its next exit starts the back-off afresh.
    stable_after: float = 60.0
    # SIGTERM first; whatever still runs this long after it is SIGKILLed.
    stop_timeout: float = STOP_TIMEOUT_SECONDS
    # How often the watcher looks for exits; an exit costs at most this much on top of the delay.
    poll_interval: float = 0.2

    def delay(self, quick_exits: int) -> float:
        """The wait before the next start, after `quick_exits` exits in a row."""
        return float(min(self.first_delay * 2**quick_exits, self.max_delay))


class ChildState(enum.Enum):
    STARTING = "starting"  # spawned; its readiness probe has not answered yet
    UP = "up"
    BACKING_OFF = "backing off"  # exited; starts again at restart_due
    HELD = "held"  # being restarted on request: the watcher leaves it alone meanwhile
    STOPPED = "stopped"


@dataclass(eq=False)
class Child:
    """One supervised process. The object lives as long as the stack; `proc` is the current
    incarnation (after an exit, the dead one until the restart)."""

    name: str
    argv: list[str]
    proc: subprocess.Popen[bytes]
    log_path: Path
    log_file: IO[bytes]
    # Up only once this answers (Redis: a PING); None: up as soon as it is spawned.
    ready: Callable[[], bool] | None = None
    # SIGTERM, then SIGKILL this long after; None: the policy's stop_timeout.
    stop_timeout: float | None = None
    # What the stack's own stop sends instead of SIGTERM: an agent gets SIGUSR2, so that it
    # stops its trainers as well (on SIGTERM it would leave them to their keepers, for an
    # agent that comes back; none does when the whole stack stops).
    stop_signal: int = signal.SIGTERM
    # On top of the stack's environment, for this process only (an agent's REDIS_URL as its
    # host reaches Redis).
    env: dict[str, str] = field(default_factory=dict)
    state: ChildState = ChildState.STARTING
    started_at: float = 0.0
    down_since: float | None = None  # when it went down, until it is up again
    restart_due: float = 0.0
    restarts: int = 0  # restarts after an exit (not those asked for through restart())
    quick_exits: int = 0  # exits in a row, each before stable_after: sets the next delay


class _Spawner:
    """Forks every child from one thread of its own, which ends only once they have all stopped.

    The death signal (PR_SET_PDEATHSIG, set by workers/deathsig.py) fires when the *thread* that
    forked the child exits, not the process. Children are started from the caller's thread, the
    watcher thread (restarts) and test threads; the watcher ends at the start of stop(), so a
    child it had restarted would be SIGKILLed there, out of order. Forking them all here ties
    each child to the supervisor's process alone.
    """

    def __init__(self) -> None:
        self._requests: queue.SimpleQueue[
            tuple[Callable[[], subprocess.Popen[bytes]], concurrent.futures.Future[Any]] | None
        ] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()

    def run(self, start: Callable[[], subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
        with self._start_lock:
            if self._thread is None:
                # A daemon: if the interpreter ends without stop(), every thread ends with the
                # process, and the children with it.
                self._thread = threading.Thread(
                    target=self._serve, name="stack-spawner", daemon=True
                )
                self._thread.start()
        if threading.current_thread() is self._thread:
            return start()
        done: concurrent.futures.Future[subprocess.Popen[bytes]] = concurrent.futures.Future()
        self._requests.put((start, done))
        return done.result()

    def _serve(self) -> None:
        while (request := self._requests.get()) is not None:
            start, done = request
            try:
                done.set_result(start())
            except BaseException as exc:  # the caller raises it
                done.set_exception(exc)

    def close(self) -> None:
        """Only once every child has stopped: its death signal fires when this thread ends."""
        with self._start_lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._requests.put(None)
            thread.join()


class ChildSupervisor:
    """Starts processes, starts again whatever exits (with back-off) and stops them in stages.

    Each process runs in its own session (so Ctrl-C reaches only stack.run, which stops them in
    order) with stdout and stderr appended to its own log file, and dies with the supervisor's
    process however that ends (SIGKILL included: see _Spawner). `watch()` starts a thread that
    heals; without it, call `supervise_once()`. Every lifecycle line goes to `announce` (the
    terminal) and into the child's log file, so the log shows where one incarnation ends.
    """

    def __init__(
        self,
        log_dir: Path,
        env: Callable[[], dict[str, str]],
        cwd: Path = ROOT,
        policy: ChildRestarts | None = None,
        announce: Callable[[str], None] | None = None,
        on_spawn: Callable[[str, int], None] | None = None,
    ) -> None:
        self.log_dir = log_dir
        # Told each child's name and new pid while it is still our unreaped child.
        self._on_spawn = on_spawn or (lambda name, pid: None)
        self._spawner = _Spawner()
        self.policy = policy or ChildRestarts()
        self._env = env
        self._cwd = cwd
        self._announce = announce or _print_line
        self._lock = threading.Lock()
        # Notified on every change of a child's state or process: wait_up() waits on it.
        self._changed = threading.Condition(self._lock)
        self._children: list[Child] = []
        self._stopping = False
        self._watcher: threading.Thread | None = None
        self._wake_watcher = threading.Event()

    @property
    def children(self) -> list[Child]:
        with self._lock:
            return list(self._children)

    def spawn(
        self,
        name: str,
        argv: list[str],
        ready: Callable[[], bool] | None = None,
        env: dict[str, str] | None = None,
        stop_timeout: float | None = None,
        stop_signal: int = signal.SIGTERM,
    ) -> Child:
        log_path = self.log_dir / f"{name}.log"
        log_file = open(log_path, "ab")  # kept across restarts, closed in stop()
        env = dict(env or {})
        with self._lock:
            if self._stopping:
                log_file.close()
                raise RuntimeError(f"not starting {name}: the stack is stopping")
            proc = self._popen(name, argv, log_file, env)
            child = Child(
                name, argv, proc, log_path, log_file, ready, stop_timeout, stop_signal, env=env
            )
            child.started_at = time.monotonic()
            child.state = ChildState.STARTING if ready else ChildState.UP
            self._children.append(child)
            self._changed.notify_all()
        return child

    def _popen(
        self, name: str, argv: list[str], log_file: IO[bytes], env: dict[str, str]
    ) -> subprocess.Popen[bytes]:
        def start() -> subprocess.Popen[bytes]:
            return subprocess.Popen(
                # The shim execs argv under the same pid, set to get SIGKILL when we die.
                deathsig.command(argv),
                env=self._env() | env,
                cwd=self._cwd,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C reaches us only; we stop children in order
            )

        proc = self._spawner.run(start)
        self._on_spawn(name, proc.pid)
        return proc

    def _stop_timeout(self, child: Child) -> float:
        return self.policy.stop_timeout if child.stop_timeout is None else child.stop_timeout

    def _terminate(
        self, child: Child, deadline: float, signalled: bool = False, sig: int = signal.SIGTERM
    ) -> None:
        """SIGTERM (unless `signalled` with `sig` already), SIGKILL at `deadline` with a line
        naming it."""

        def late() -> None:
            self._say(
                child,
                f"{child.name} did not stop within {self._stop_timeout(child):g} s of "
                f"{signal.Signals(sig).name}; killing it (SIGKILL, pid {child.proc.pid})",
            )

        _terminate(child.proc, deadline, signalled, late)

    def child(self, name: str) -> Child:
        with self._lock:
            return self._find(name)

    def _find(self, name: str) -> Child:
        for child in self._children:
            if child.name == name:
                return child
        raise KeyError(f"no process named {name!r} in this stack")

    def pid(self, name: str) -> int:
        return self.child(name).proc.pid

    def kill(self, name: str, sig: int) -> None:
        """Send `sig` to the named process itself (not its group): SIGKILL is a crash of that
        process, SIGSTOP and SIGCONT freeze and thaw it."""
        # Popen.send_signal does nothing once the process is reaped, so a stale PID that the
        # kernel has handed to someone else is never signalled.
        self.child(name).proc.send_signal(sig)

    # --- healing ---

    def watch(self) -> None:
        """Heal from a background thread until stop()."""
        if self._watcher is not None:
            return
        self._watcher = threading.Thread(target=self._watch, name="stack-supervisor", daemon=True)
        self._watcher.start()

    def _watch(self) -> None:
        while not self._wake_watcher.wait(self.policy.poll_interval):
            try:
                self.supervise_once()
            except Exception as exc:  # a bug here must not end the healing for good
                self._announce(f"supervision error: {exc!r}")

    def supervise_once(self) -> None:
        """One pass: note exits, start again those whose delay is over, mark ready ones up."""
        with self._lock:
            if self._stopping:
                return
            for child in self._children:
                self._tend(child, time.monotonic())

    def _tend(self, child: Child, now: float) -> None:
        if child.state in (ChildState.HELD, ChildState.STOPPED):
            return
        if child.state is ChildState.BACKING_OFF:
            if now >= child.restart_due:
                self._respawn(child, now)
            return
        code = child.proc.poll()
        if code is not None:
            self._schedule_restart(child, now, describe_exit(code))
        elif child.state is ChildState.STARTING and child.ready is not None and child.ready():
            self._mark_up(child, now)

    def _schedule_restart(self, child: Child, now: float, why: str) -> None:
        # Whatever the dead process left in its group goes with it: nothing stays orphaned.
        _signal_group(child.proc, signal.SIGKILL)
        if now - child.started_at >= self.policy.stable_after:
            child.quick_exits = 0
        delay = self.policy.delay(child.quick_exits)
        child.quick_exits += 1
        child.restarts += 1
        child.state = ChildState.BACKING_OFF
        child.down_since = now if child.down_since is None else child.down_since
        child.restart_due = now + delay
        self._changed.notify_all()
        self._say(
            child, f"{child.name} {why}; restarting in {delay:g} s (restart {child.restarts})"
        )

    def _respawn(self, child: Child, now: float) -> None:
        try:
            child.proc = self._popen(child.name, child.argv, child.log_file, child.env)
        except OSError as exc:
            child.started_at = now  # a failed start is a quick exit: the back-off grows
            self._schedule_restart(child, now, f"could not be started ({exc})")
            return
        child.started_at = now
        if child.ready is None:
            self._mark_up(child, now)
        else:
            child.state = ChildState.STARTING
            self._changed.notify_all()

    def _mark_up(self, child: Child, now: float) -> None:
        child.state = ChildState.UP
        if child.down_since is not None:
            self._say(
                child,
                f"{child.name} is up again (pid {child.proc.pid}), "
                f"{now - child.down_since:.1f} s after it went down",
            )
            child.down_since = None
        self._changed.notify_all()

    def _say(self, child: Child, line: str) -> None:
        self._announce(line)
        stamp = datetime.now().astimezone().isoformat(timespec="milliseconds")
        try:
            child.log_file.write(f"{stamp} [stack.run] {line}\n".encode())
            child.log_file.flush()
        except (OSError, ValueError):  # the log is gone or closed: the terminal still has it
            pass

    def wait_up(self, name: str, timeout: float, not_pid: int | None = None) -> int:
        """Until the named process is up (and, with `not_pid`, is not that process any more);
        returns its PID. Needs the watcher (or calls of supervise_once) to make progress."""
        with self._changed:
            child = self._find(name)

            def arrived() -> bool:
                up = child.state is ChildState.UP and child.proc.pid != not_pid
                return up or self._stopping

            if self._changed.wait_for(arrived, timeout) and self._stopping:
                raise RuntimeError(f"{name} will not come back: the stack is stopping")
            if not arrived():
                raise TimeoutError(
                    f"{name} was not up again within {timeout:g} s "
                    f"(state: {child.state.value}, pid {child.proc.pid}, waiting to replace "
                    f"pid {not_pid})"
                )
            return child.proc.pid

    def restart(
        self,
        name: str,
        while_down: Callable[[], object] | None = None,
        ready_timeout: float = 20.0,
        how: int = signal.SIGTERM,
    ) -> int:
        """Stop one process (`how`, SIGTERM by default, then SIGKILL after the stop timeout),
        leave it down until `while_down()` returns (an outage that lasts until something
        happened, never a fixed time), start it again as it was and wait until it is up;
        returns the new PID. With `how` SIGKILL it is a crash that the stack does not undo
        until `while_down()` returns."""
        with self._lock:
            if self._stopping:
                raise RuntimeError(f"not restarting {name}: the stack is stopping")
            child = self._find(name)
            child.state = ChildState.HELD
            child.down_since = time.monotonic()
        self._say(child, f"{name} is being restarted on request")
        if how != signal.SIGTERM and child.proc.poll() is None:
            os.kill(child.proc.pid, how)  # the process only, as a crash or a signal would
        self._terminate(
            child,
            time.monotonic() + self._stop_timeout(child),
            signalled=how != signal.SIGTERM,
            sig=how,
        )
        if while_down is not None:
            while_down()
        with self._lock:
            if self._stopping:
                return child.proc.pid
            child.proc = self._popen(child.name, child.argv, child.log_file, child.env)
            child.started_at = time.monotonic()
            child.quick_exits = 0
            child.state = ChildState.STARTING
            if child.ready is None:
                self._mark_up(child, child.started_at)
            self._changed.notify_all()
        return self.wait_up(name, ready_timeout)

    # --- stop ---

    def stop(self, stage_of: Callable[[str], int] = lambda name: 0) -> None:
        """Stop every process, stage by stage (lowest first), none restarted meanwhile: SIGTERM
        to a stage's process groups, then SIGKILL to what still runs after its stop timeout."""
        with self._lock:
            self._stopping = True
            self._changed.notify_all()
            children = list(self._children)
            self._children.clear()
        self._wake_watcher.set()
        if self._watcher is not None and self._watcher is not threading.current_thread():
            self._watcher.join()
        for stage in sorted({stage_of(c.name) for c in children}):
            group = [c for c in children if stage_of(c.name) == stage]
            running = [c for c in group if c.proc.poll() is None]
            for child in running:
                _signal_group(child.proc, child.stop_signal)
                # A frozen (SIGSTOPped) process must run to act on its SIGTERM.
                _signal_group(child.proc, signal.SIGCONT)
            signalled_at = time.monotonic()
            for child in group:
                self._terminate(
                    child,
                    signalled_at + self._stop_timeout(child),
                    signalled=True,
                    sig=child.stop_signal,
                )
            for child in running:
                ended = describe_exit(child.proc.wait()).removeprefix("exited ")
                self._say(child, f"{child.name} stopped {ended}")
        # Only now: its end fires the death signal of every child it started.
        self._spawner.close()
        for child in children:
            child.state = ChildState.STOPPED
            child.log_file.close()


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"exited (killed by {signal.Signals(-returncode).name})"
        except ValueError:
            return f"exited (killed by signal {-returncode})"
    return f"exited (code {returncode})"


def _terminate(
    proc: subprocess.Popen[bytes],
    deadline: float,
    signalled: bool = False,
    late: Callable[[], None] = lambda: None,
) -> None:
    if not signalled and proc.poll() is None:
        _signal_group(proc, signal.SIGTERM)
        _signal_group(proc, signal.SIGCONT)
    try:
        proc.wait(max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        late()
        _signal_group(proc, signal.SIGKILL)
        proc.wait()
    # Helpers that outlived the leader in its group go too.
    _signal_group(proc, signal.SIGKILL)


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _print_line(line: str, file: IO[str] | None = None) -> None:
    """Print, unless the terminal is gone (closed: SIGHUP, then EIO on every write; a pipe
    whose reader died): a stop must go on whether or not anyone reads about it."""
    try:
        print(line, file=file or sys.stdout, flush=True)
    except OSError:
        pass


# --- the Trainyard stack --------------------------------------------------------------------


class StartInterrupted(RuntimeError):
    """Ctrl-C came while the stack was starting."""


def _stop_stage(name: str) -> int:
    # Agents first (they stop their trainers and report), then whoever they report to; the
    # keeper stops after the agents, so it archives their last lines.
    return {"console-worker": 1, "log-keeper": 1, "web": 2, "redis": 3}.get(name, 0)


@dataclass
class Stack:
    var_dir: Path
    port: int
    nodes: int = 2
    node_cpus: int = 4
    node_memory_gb: int = 16
    redis_url: str = ""  # empty: start our own
    # Our own Redis asks for this password, always (docs/deploy.md: a shared Redis does too): it
    # is the console's, which may do anything there. Each agent gets credentials of its own
    # (workers/credentials.py), allowed only its own queue, reports and jobs.
    redis_password: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    # Each agent on a "host" of its own: a network namespace with its own address on a bridge
    # (stack/netns.py, `make cluster`). Redis then listens on the bridge too.
    hosts_in_namespaces: bool = False
    # Addresses Redis listens on besides loopback: where hosts outside this stack reach it (a
    # Slurm pool's nodes, whose step wrappers ship the jobs' logs there; docs/slurm.md).
    redis_also_on: tuple[str, ...] = ()
    # The default quota from what the local nodes hold (`make run`), not the starter one that
    # the tests' stacks count on: load_catalog refits it only while it has the starter values.
    fit_default_quota: bool = False
    # How an agent is started, before its options: this Python's `-m workers.agent`, or the
    # `trainyard-agent` of an environment that holds only the agent (no Django).
    agent_command: list[str] = field(
        default_factory=lambda: [sys.executable, "-m", "workers.agent"]
    )
    trainer_python: str | None = None  # the agents' --trainer-python; None: their own Python
    code_root: Path | None = None
    extra_env: dict[str, str] = field(default_factory=dict)  # for every child
    child_restarts: ChildRestarts = field(default_factory=ChildRestarts)
    # The agents' stop timeout; every other process has the restart policy's.
    agent_stop_timeout: float = AGENT_STOP_TIMEOUT_SECONDS
    announce: Callable[[str], None] | None = None  # restart lines; None: print them
    # Lets wait_ready read /healthz's details (the count of live nodes), which anonymous
    # callers do not get; the environment's own token if it sets one.
    healthz_token: str = field(
        default_factory=lambda: (
            os.environ.get("TRAINYARD_HEALTHZ_TOKEN") or secrets.token_urlsafe(24)
        )
    )

    def __post_init__(self) -> None:
        self.network: HostNetwork | None = None
        # Our own Redis gets its port now, so that its URL is known before it starts (a
        # production console refuses to run even manage.py without REDIS_URL).
        self._redis_port = 0 if self.redis_url else free_port(avoid=self.port)
        self._redis_auth = f":{self.redis_password}@" if self.redis_password else ""
        if not self.redis_url:
            self.redis_url = f"redis://{self._redis_auth}127.0.0.1:{self._redis_port}/0"
        self.healthz_token = self.extra_env.get("TRAINYARD_HEALTHZ_TOKEN", self.healthz_token)
        self._pids = StackPids(self.var_dir / "stack.pids")
        self._supervisor = ChildSupervisor(
            self.var_dir / "logs",
            self.env,
            ROOT,
            self.child_restarts,
            self.announce,
            on_spawn=self._pids.child_started,
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def children(self) -> list[Child]:
        """The processes, one Child per name; `child.proc` is the current incarnation."""
        return self._supervisor.children

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            {
                "DJANGO_SETTINGS_MODULE": "console.settings",
                "TRAINYARD_VAR_DIR": str(self.var_dir),
                "REDIS_URL": self.redis_url,
                "TRAINYARD_HEALTHZ_TOKEN": self.healthz_token,
                "PYTHONUNBUFFERED": "1",
            }
        )
        if self.code_root is not None:
            env["TRAINYARD_CODE_ROOT"] = str(self.code_root)
        env.update(self.extra_env)
        return env

    # --- start ---

    def prepare(self) -> str:
        """Migrate, load the starter catalog, make the admin; returns 'user password'."""
        self.keep_var_private()
        (self.var_dir / "logs").mkdir(exist_ok=True)
        self.manage("migrate", "--noinput", quiet=True)
        self.manage("load_catalog", *self.default_quota_options(), quiet=True)
        return self.manage("ensure_admin").strip()

    def keep_var_private(self) -> None:
        """var/ holds the database, the admin's password, Redis's config (its password) and
        data: the owner's alone."""
        self.var_dir.mkdir(parents=True, exist_ok=True)
        self.var_dir.chmod(0o700)

    def default_quota_options(self) -> list[str]:
        """load_catalog's options for a default quota that fits the local nodes: all their
        cores and memory, and the GPUs this machine has (each local agent advertises the same
        GPUs, so the nodes' sum would count them more than once)."""
        if not self.fit_default_quota:
            return []
        from workers.inventory import detect_gpus

        gpus, _ = detect_gpus()
        return [
            "--quota-cpu", str(self.nodes * self.node_cpus),
            "--quota-memory-gb", str(self.nodes * self.node_memory_gb),
            "--quota-gpus", str(gpus),
        ]  # fmt: skip

    def manage(self, *args: str, quiet: bool = False) -> str:
        result = subprocess.run(
            # Dies with us too (this thread waits for it, so it outlives it).
            deathsig.command([sys.executable, str(ROOT / "manage.py"), *args]),
            env=self.env(),
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(f"manage.py {' '.join(args)} failed:\n{result.stderr}")
        return "" if quiet else result.stdout

    def claim(self) -> list[str]:
        """Make var/ this stack's (AlreadyRunning if another stack runs from it) and stop what
        an earlier one left there; one line per thing stopped. start() claims it if need be."""
        return self._pids.claim()

    def start(self, should_stop: Callable[[], bool] = lambda: False) -> None:
        if _port_in_use(self.port):
            raise RuntimeError(f"port {self.port} is in use; pick another with PORT=...")
        self.keep_var_private()
        if not self._pids.claimed:
            for line in self.claim():
                _print_line(f"stopped what an earlier stack left running: {line}")
        (self.var_dir / "logs").mkdir(parents=True, exist_ok=True)
        if self.hosts_in_namespaces:
            tag = new_tag()
            self._pids.network_tag(tag)  # first, so that a SIGKILL meanwhile leaves its name
            self.network = HostNetwork.create(self.nodes, tag=tag)
        spawn = self._supervisor.spawn
        agents_redis_host: list[str] = []  # agent_credentials' --host: REDIS_URL's by default
        if self._redis_port:
            data_dir = self.var_dir / "redis"
            data_dir.mkdir(parents=True, exist_ok=True)
            url = self.redis_url
            bind: tuple[str, ...] = ("127.0.0.1", *self.redis_also_on)
            if self.network is not None:
                # The hosts reach this machine only across the bridge.
                bind = (*bind, self.network.gateway)
                agents_redis_host = ["--host", self.network.gateway]
            # The same argv on every restart: the same port and the same append-only file.
            child = spawn(
                "redis",
                redis_argv(
                    redis_server_binary(), self._redis_port, data_dir, bind, self.redis_password
                ),
                ready=lambda: redis_answers(url),
            )
            wait_for_redis(self.redis_url, child.proc)
        else:
            wait_for_redis(self.redis_url, None)
        py = sys.executable
        # The production web command (docs/deploy.md), with one worker.
        spawn("web", [py, "-m", "stack.web", "--host", "127.0.0.1", "--port", str(self.port)])
        spawn(
            "console-worker",
            [py, "-m", "celery", "-A", "console", "worker", "-Q", "console",
             "-n", f"console@{self.port}", "--pool", "threads", "--concurrency", "4",
             "--without-mingle", "--without-gossip", "--loglevel", "INFO"],
            # One connection per worker thread, kept, not one per task (docs/deploy.md).
            env={KEEP_CONNECTIONS: self.extra_env.get(KEEP_CONNECTIONS, "60")},
        )  # fmt: skip
        spawn("log-keeper", [py, str(ROOT / "manage.py"), "keep_logs"])
        names = (
            [host.node for host in self.network.hosts]
            if self.network is not None
            else [f"node-{i}" for i in range(1, self.nodes + 1)]
        )
        # Fresh credentials for every agent, each a Redis user of its own (made now, Redis is up).
        # None with --nodes 0: a console whose nodes come from elsewhere (bench/fleet.py).
        agent_urls = (
            self.manage("agent_credentials", *names, *agents_redis_host).split() if names else []
        )
        for i, (node, agent_url) in enumerate(zip(names, agent_urls, strict=True), start=1):
            address = "127.0.0.1"
            if self.network is not None:
                address = self.network.hosts[i - 1].address
            argv = [
                *self.agent_command, "--node", node, "--address", address,
                "--cpus", str(self.node_cpus), "--memory-gb", str(self.node_memory_gb),
                "--workdir", str(self.var_dir / "agents"),
            ]  # fmt: skip
            if self.trainer_python:
                argv += ["--trainer-python", self.trainer_python]
            if shutil.which("podman"):
                # Container images run in podman, with the settings these hosts need.
                argv += [
                    "--container-runtime",
                    "podman",
                    "--container-config",
                    str(CONTAINERS_CONF),
                ]
            if self.network is not None:
                argv = self.network.hosts[i - 1].run_argv(argv)
            # The URL in the environment, not on the command line, where `ps` shows it.
            spawn(
                node,
                argv,
                env={"REDIS_URL": agent_url},
                stop_timeout=self.agent_stop_timeout,
                stop_signal=signal.SIGUSR2,
            )
        self._supervisor.watch()
        self.wait_ready(should_stop=should_stop)

    def wait_ready(
        self, timeout: float = 90.0, should_stop: Callable[[], bool] = lambda: False
    ) -> None:
        """Until the web server answers and every agent has registered its node.

        A process that dies meanwhile is restarted like any other, but the deadline stands.
        """
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            if should_stop():
                raise StartInterrupted("stopped while starting")
            try:
                request = urllib.request.Request(  # noqa: S310  (our own http:// URL)
                    f"{self.url}/healthz", headers={"Authorization": f"Token {self.healthz_token}"}
                )
                with urllib.request.urlopen(request, timeout=2) as response:  # noqa: S310
                    health = json.load(response)
                if health.get("nodes_live", 0) >= self.nodes:
                    return
                last = f"{health.get('nodes_live', 0)} of {self.nodes} nodes registered"
            except urllib.error.HTTPError as exc:  # 503 names the failing part
                last = f"{exc}: {exc.read().decode(errors='replace')}"
            except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError) as exc:
                last = str(exc)
            time.sleep(0.2)
        raise RuntimeError(
            f"the stack did not become ready in {timeout:.0f} s: {last}" + self._restart_report()
        )

    def _restart_report(self) -> str:
        report = ""
        for child in self.children:
            if child.restarts:
                tail = child.log_path.read_text(errors="replace").splitlines()[-30:]
                report += (
                    f"\n{child.name} was restarted {child.restarts} times; "
                    f"last lines of {child.log_path}:\n" + "\n".join(tail)
                )
        return report

    # --- faults, for trying out what survives them ---

    def pid(self, name: str) -> int:
        """The PID of the named process now (it changes when the process is restarted)."""
        return self._supervisor.pid(name)

    def kill(self, name: str, sig: int) -> None:
        """Signal the named process itself: SIGKILL is a crash (it is restarted after the
        back-off), SIGSTOP/SIGCONT freeze and thaw it. Trainers of an agent run in sessions of
        their own and are not signalled."""
        self._supervisor.kill(name, sig)

    def wait_restarted(self, name: str, old_pid: int, timeout: float = 60.0) -> int:
        """Until the named process runs again under a PID other than `old_pid` and is up
        (Redis: answers); returns the new PID. Raises TimeoutError saying where it stands."""
        return self._supervisor.wait_up(name, timeout, not_pid=old_pid)

    def restart(
        self, name: str, while_down: Callable[[], object] | None = None, how: int = signal.SIGTERM
    ) -> None:
        """Stop one process by its PID (with `how`: SIGTERM, or SIGKILL for a crash) and start
        it again as it was (same port, same data), once `while_down()` has returned; returns
        once it is up (Redis: answers)."""
        self._supervisor.restart(name, while_down, how=how)

    # --- stop ---

    def stop(self) -> None:
        self._supervisor.stop(_stop_stage)
        if self.network is not None:
            self.network.destroy()
            self.network = None
        self._pids.release()


# The console worker keeps its database connections this many seconds (console/settings.py).
KEEP_CONNECTIONS = "TRAINYARD_DB_CONN_MAX_AGE"


def _port_in_use(port: int) -> bool:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run Trainyard on this machine.")
    parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
    parser.add_argument(
        "--nodes", type=int, default=None, help="node agents (default 2; 3 with --cluster)"
    )
    parser.add_argument("--var-dir", type=Path, default=None)
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="each agent on a host of its own: a network namespace with its own address on a "
        "bridge (needs root); Redis then listens on the bridge, with a password",
    )
    parser.add_argument(
        "--redis-also-on",
        action="append",
        default=[],
        metavar="ADDRESS",
        help="Redis listens on this address too, besides 127.0.0.1 (e.g. where a Slurm pool's "
        "nodes reach this machine: docs/slurm.md); it always has a password",
    )
    args = parser.parse_args(argv)
    nodes = args.nodes or (3 if args.cluster else 2)
    var_dir = args.var_dir or ROOT / ("var/cluster" if args.cluster else "var")
    if args.cluster:
        reason = unavailable_reason()
        if reason:
            print(f"error: make cluster cannot run here: {reason}", file=sys.stderr)
            return 1

    stack = Stack(
        var_dir=var_dir.resolve(),
        port=args.port,
        nodes=nodes,
        redis_url=os.environ.get("REDIS_URL", ""),
        hosts_in_namespaces=args.cluster,
        fit_default_quota=True,
        redis_also_on=tuple(args.redis_also_on),
    )
    # A plain flag: a signal handler must not take locks (Event.set does), the main thread
    # might hold them when the signal arrives.
    stopping = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    # The terminal closed: stop in order, as on Ctrl-C (the default would end us at once, and
    # our children with us, by their death signal, out of order).
    signal.signal(signal.SIGHUP, on_signal)
    try:
        # Before anything touches var/: refuse to run beside a live stack of this checkout.
        left = stack.claim()
    except AlreadyRunning as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if left:
        print(
            f"An earlier stack from {stack.var_dir} was not stopped cleanly; stopped what it "
            f"left: {'; '.join(left)}",
            flush=True,
        )
    try:
        login = stack.prepare()
        where = " on hosts of their own (network namespaces)" if args.cluster else ""
        print(
            "Starting Redis, the web server, the console worker, the log keeper and "
            f"{nodes} node agents{where}…",
            flush=True,
        )
        stack.start(should_stop=lambda: stopping)
        user, _, password = login.partition(" ")
        print(f"\nTrainyard is running at {stack.url}/", flush=True)
        if password:
            print(f"Log in as {user} / {password}", flush=True)
        print(f"Logs of each process: {stack.var_dir / 'logs'}/", flush=True)
        if stack.network is not None:
            for host in stack.network.hosts:
                print(
                    f"  {host.node}: {host.address} in network namespace {host.namespace}",
                    flush=True,
                )
        # manage.py commands that talk to the running console (unlock_login) need it.
        print(f"Redis: REDIS_URL={stack.redis_url}", flush=True)
        print("A process that exits is restarted; press Ctrl-C to stop everything.", flush=True)
        while not stopping:
            time.sleep(0.5)  # the supervisor's thread heals; this one only waits for Ctrl-C
        return 0
    except StartInterrupted:
        return 130
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        _print_line("\nStopping…")
        stack.stop()
        _print_line("Stopped.")


if __name__ == "__main__":
    sys.exit(main())
