"""The agent's side of a replica's keeper (workers/keeper.py): start one, or find the ones an
earlier agent left; claim it, read what it holds, and tell it what to do.

A keeper's folder is `<workdir>/keepers/<job>-<attempt>-<tag>/`. Besides the keeper's own files
it holds `replica.json`, written by the agent that started it: what a later agent needs to take
the replica over (its spec, GPUs, folder, containers, and the writer names its lines go to
Redis under).
"""

import json
import logging
import os
import select
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workers import keeper
from workers.procrecords import alive

log = logging.getLogger(__name__)

REPLICA = "replica.json"
STARTED_WAIT_SECONDS = 30.0
POLL_SECONDS = 0.02
# How long a spare keeper that is no longer needed gets to exit once its stdin ends.
SPARE_END_SECONDS = 5.0
# Where `python -m workers.keeper` finds the package, whatever the agent's working directory.
_PACKAGE_PARENT = Path(__file__).resolve().parent.parent
# The keeper's whole environment: it talks to no service, and holds none of the agent's secrets
# (the trainers' environments travel in its spec file, not in its own).
_KEEPER_ENV_NAMES = ("PATH", "LANG", "LC_ALL", "TZ")


class KeeperError(RuntimeError):
    pass


@dataclass(frozen=True)
class KeptProcess:
    argv: list[str]
    env: dict[str, str]
    cwd: Path
    # The cgroup.procs files of the instance's cgroups (workers/cgroups.py), joined before the
    # program starts, and its OOM score (None: the keeper's).
    cgroups: list[str] = field(default_factory=list)
    oom_score_adj: int | None = None


def folder_name(job_id: int, attempt: int, tag: str) -> str:
    return f"{job_id}-{attempt}-{tag}"


class KeeperLink:
    """One keeper, as an agent holds it: through a connection whose end starts its grace."""

    def __init__(self, folder: Path, proc: subprocess.Popen[bytes] | None = None) -> None:
        self.folder = folder
        self._proc = proc  # only when this agent started it (and so must reap it)
        self._conn: socket.socket | None = None
        self._state: dict[str, Any] | None = None

    # --- starting, finding ---

    @classmethod
    def start(
        cls,
        folder: Path,
        procs: list[KeptProcess],
        replica: dict[str, Any],
        records_dir: Path,
        grace_seconds: float,
        stop_grace_seconds: float,
        spares: "SpareKeepers | None" = None,
    ) -> "KeeperLink":
        """Start a keeper running `procs`; returns once they run (or raises KeeperError).
        With `spares`, the keeper is its waiting spare, when it has one."""
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        spec = {
            "procs": [
                {
                    "argv": p.argv,
                    "env": p.env,
                    "cwd": str(p.cwd),
                    "cgroups": p.cgroups,
                    "oom_score_adj": p.oom_score_adj,
                }
                for p in procs
            ],
            "grace_seconds": grace_seconds,
            "stop_grace_seconds": stop_grace_seconds,
            "records_dir": str(records_dir),
            "job_id": replica["spec"]["job_id"],
            "role": replica["spec"]["role"],
            "index": replica["spec"]["index"],
        }
        keeper.write_atomically(folder / REPLICA, json.dumps(replica))
        keeper.write_atomically(folder / keeper.SPEC, json.dumps(spec))
        proc = spares.take(folder) if spares is not None else None
        if proc is None:
            with open(folder / keeper.LOG, "ab") as log_file:
                proc = _spawn_keeper([str(folder)], stdin=subprocess.DEVNULL, output=log_file)
        link = cls(folder, proc)
        deadline = time.monotonic() + STARTED_WAIT_SECONDS
        while link.state() is None:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                raise KeeperError(f"the replica's keeper did not start ({link.log_tail()})")
            time.sleep(POLL_SECONDS)
        state = link.state() or {}
        if "error" in state:
            raise KeeperError(f"cannot start the replica's processes: {state['error']}")
        link.claim()
        return link

    @staticmethod
    def found(keepers_dir: Path) -> list["KeeperLink"]:
        """The keepers an earlier agent left (alive, or ended with their outcome on disk)."""
        if not keepers_dir.is_dir():
            return []
        return [KeeperLink(f) for f in sorted(keepers_dir.iterdir()) if (f / REPLICA).is_file()]

    def replica(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.folder / REPLICA).read_text())
        return data

    # --- the connection ---

    def claim(self) -> bool:
        """Connect: from now on the keeper waits for this agent. False when it has ended."""
        # Through the folder's descriptor: the socket's full path may be too long to name.
        fd = os.open(self.folder, os.O_PATH | os.O_DIRECTORY)
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(f"/proc/self/fd/{fd}/{keeper.SOCKET}")
        except OSError:
            conn.close()
            return False
        finally:
            os.close(fd)
        self._conn = conn
        return True

    def send(self, command: bytes) -> None:
        if self._conn is None:
            return
        try:
            self._conn.sendall(command + b"\n")
        except OSError:
            pass  # it has ended: nothing left to signal

    def wait_for_news(self, timeout: float) -> None:
        """Wait up to `timeout` for the keeper to say it has written an exit record or `done`
        (keeper.NEWS); returns at once when it has. The files, not this, say what happened:
        this only saves the caller its poll (an older keeper says nothing, and this waits)."""
        conn = self._conn
        if conn is None:
            time.sleep(timeout)
            return
        try:
            if select.select([conn], [], [], timeout)[0]:
                if not conn.recv(4096):
                    # The keeper has gone: the caller sees it in the files, or in alive().
                    # Not waiting again here keeps the caller's loop from spinning on it.
                    time.sleep(timeout)
        except (OSError, ValueError):
            time.sleep(timeout)  # closed meanwhile (a release or a detach by another thread)

    def terminate(self) -> None:
        self.send(keeper.TERM)

    def kill(self) -> None:
        self.send(keeper.KILL)

    def detach(self) -> None:
        """Let go without ending it (the agent hands over): its grace begins."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def release(self, wait: float = 5.0) -> None:
        """The outcome is read: let the keeper end, and reap it if it is our child."""
        self.send(keeper.RELEASE)
        self.detach()
        if self._proc is not None:
            try:
                self._proc.wait(wait)
            except subprocess.TimeoutExpired:
                log.warning("keeper %s did not end after its release", self._proc.pid)

    # --- what it holds ---

    def state(self) -> dict[str, Any] | None:
        if self._state is None:
            try:
                self._state = json.loads((self.folder / keeper.STATE).read_text())
            except (FileNotFoundError, ValueError):
                return None
        return self._state

    def pids(self) -> list[int]:
        state = self.state() or {}
        return [int(p["pid"]) for p in state.get("procs", [])]

    def ranks(self) -> int:
        return len(self.pids())

    def alive(self) -> bool:
        state = self.state()
        if state is None:
            return False
        identity = state["keeper"]
        return alive(int(identity["pid"]), float(identity["create_time"]))

    def exits(self) -> list[dict[str, Any] | None]:
        """Per rank, {"code", "at"} once its process has ended."""
        out: list[dict[str, Any] | None] = []
        for rank in range(self.ranks()):
            try:
                out.append(json.loads((self.folder / keeper.exit_name(rank)).read_text()))
            except (FileNotFoundError, ValueError):
                out.append(None)
        return out

    def done(self) -> bool:
        return (self.folder / keeper.DONE).exists()

    def output(self, rank: int) -> Path:
        """The rank's output file: its stdout and stderr, framed (keeper.read_frames)."""
        return self.folder / keeper.output_name(rank)

    def log_tail(self) -> str:
        try:
            lines = (self.folder / keeper.LOG).read_text(errors="replace").strip().splitlines()
        except OSError:
            return "no log"
        return lines[-1] if lines else "no log"


def _spawn_keeper(args: list[str], stdin: Any, output: Any) -> subprocess.Popen[bytes]:
    """`python -m workers.keeper ARGS`, as every keeper starts, spare or not."""
    return subprocess.Popen(
        [sys.executable, "-m", "workers.keeper", *args],
        env={k: os.environ[k] for k in _KEEPER_ENV_NAMES if k in os.environ},
        cwd=_PACKAGE_PARENT,
        stdin=stdin,
        stdout=output,
        stderr=output,
        start_new_session=True,  # not in the agent's group: a signal to it passes by
    )


class SpareKeepers:
    """Keepers started ahead of need (`python -m workers.keeper --spare`), so that a replica's
    start does not wait for the keeper's interpreter to start and import its modules (a tenth
    of a second or more before the first trainer can even be spawned).

    `count` of them wait at once: a job's instances on one node arrive together, and with one
    spare the second instance waited for a cold keeper (0.16-0.19 s measured by bench.startup,
    on the master's path to the rendezvous as often as not). Each costs about 17 MB RSS (10 MB
    of its own) while it waits.

    Only the keeper is prestarted, never a trainer: the keeper is the agent's own process, run
    outside every sandbox with an environment of its own that is the same for every replica
    (the replica's spec, with the trainers' argv, environment and folder, comes in the spec file
    as before), so a spare is exactly the keeper a cold start would have made. It holds nothing
    until it is given a folder; when the agent goes, its stdin ends and it exits.
    """

    def __init__(self, start: bool = True, count: int = 1) -> None:
        """With `start` False, the first spares start at the first replenish() or take()."""
        if count < 1:
            raise ValueError("a spare keeper pool holds at least one")
        self._lock = threading.Lock()
        self._count = count
        # Oldest first: the one most likely to have its interpreter up is handed out first.
        self._waiting: list[subprocess.Popen[bytes]] = []
        self._closed = False
        if start:
            self.replenish()

    def take(self, folder: Path) -> subprocess.Popen[bytes] | None:
        """A spare, now keeping `folder` (whose spec file is written), or None when there is
        none (each died, or none could start): the caller starts a keeper the ordinary way.
        A new spare is started in its place."""
        while True:
            with self._lock:
                proc = self._waiting.pop(0) if self._waiting else None
            if proc is None or _hand(proc, folder):
                break
        self.replenish()
        return proc

    def close(self) -> None:
        """End the spares: their stdin closes, and each exits as soon as it reads that. Not
        waited for here (a spare still starting may take a moment on a busy host, and a
        stopping agent has better things to do): a thread reaps them."""
        with self._lock:
            self._closed = True
            procs, self._waiting = self._waiting, []
        for proc in procs:
            threading.Thread(
                target=_end_spare, args=(proc,), name="spare-keeper-end", daemon=True
            ).start()

    def pids(self) -> list[int]:
        """The waiting spares, the next to be handed out first."""
        with self._lock:
            return [proc.pid for proc in self._waiting]

    def pid(self) -> int | None:
        """The spare the next take() hands out, if one waits."""
        return next(iter(self.pids()), None)

    def replenish(self) -> None:
        """Start spares until `count` wait (unless the agent is stopping)."""
        with self._lock:
            while not self._closed and len(self._waiting) < self._count:
                try:
                    self._waiting.append(
                        _spawn_keeper(
                            [keeper.SPARE], stdin=subprocess.PIPE, output=subprocess.DEVNULL
                        )
                    )
                except OSError as exc:
                    log.warning("could not start a spare keeper: %s", exc)
                    return


def _hand(proc: subprocess.Popen[bytes], folder: Path) -> bool:
    """Give a spare its folder; False if it has died meanwhile (it is reaped)."""
    assert proc.stdin is not None
    try:
        proc.stdin.write(os.fsencode(folder) + b"\n")
        proc.stdin.close()
    except OSError:
        _end_spare(proc)
        return False
    return True


def _end_spare(proc: subprocess.Popen[bytes]) -> None:
    try:
        if proc.stdin is not None:
            proc.stdin.close()
        proc.wait(SPARE_END_SECONDS)
    except (OSError, subprocess.TimeoutExpired):
        proc.kill()
        proc.wait()
