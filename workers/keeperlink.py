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
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workers import keeper
from workers.procrecords import alive

log = logging.getLogger(__name__)

REPLICA = "replica.json"
STARTED_WAIT_SECONDS = 30.0
POLL_SECONDS = 0.02
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
    ) -> "KeeperLink":
        """Start a keeper running `procs`; returns once they run (or raises KeeperError)."""
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        spec = {
            "procs": [{"argv": p.argv, "env": p.env, "cwd": str(p.cwd)} for p in procs],
            "grace_seconds": grace_seconds,
            "stop_grace_seconds": stop_grace_seconds,
            "records_dir": str(records_dir),
            "job_id": replica["spec"]["job_id"],
            "role": replica["spec"]["role"],
            "index": replica["spec"]["index"],
        }
        keeper.write_atomically(folder / REPLICA, json.dumps(replica))
        keeper.write_atomically(folder / keeper.SPEC, json.dumps(spec))
        with open(folder / keeper.LOG, "ab") as log_file:
            proc = subprocess.Popen(
                [sys.executable, "-m", "workers.keeper", str(folder)],
                env={k: os.environ[k] for k in _KEEPER_ENV_NAMES if k in os.environ},
                cwd=_PACKAGE_PARENT,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=log_file,
                start_new_session=True,  # not in the agent's group: a signal to it passes by
            )
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
