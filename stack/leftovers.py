"""What a stack started, on disk (`var/stack.pids`), so that a later stack can stop what this
one could not.

Every child of stack.run dies with it (workers/deathsig.py), however it ends; what the death
signal cannot reach is a helper a child started in its process group, a process of a stack run
by an older checkout, or a network namespace of `make cluster` (a kernel object, not a
process). So the record holds the supervisor, each child's pid with its start time (psutil's
create_time: a pid the kernel has since given to someone else is never signalled), and the tag
of the hosts' network. A stack that starts on the same `var/` reads it first: if the recorded
supervisor still runs, it refuses to start beside it; otherwise it kills every recorded process
group that is still the one recorded, removes the recorded network, and says so.

The record is written by one object, `StackPids`, each write whole and atomic.
"""

import json
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from workers.procrecords import CREATE_TIME_TOLERANCE, group_members

# How long a leftover group may take to disappear after SIGKILL before we give up on it.
REAP_WAIT_SECONDS = 5.0


@dataclass(frozen=True)
class Recorded:
    name: str
    pid: int  # also its process group: every child leads a session of its own
    create_time: float


class AlreadyRunning(RuntimeError):
    """The supervisor recorded in this var/ still runs."""


def _create_time(pid: int) -> float:
    return psutil.Process(pid).create_time()


def _is(recorded: Recorded) -> bool:
    """Whether the recorded pid is still the process recorded (not a reused number)."""
    try:
        return abs(_create_time(recorded.pid) - recorded.create_time) < CREATE_TIME_TOLERANCE
    except psutil.NoSuchProcess:
        return False


def _group_is_ours(recorded: Recorded) -> bool:
    """As workers.procrecords.still_ours: Linux does not reuse a number as a pid while it is in
    use as a process group id, so a group whose leader is gone, but which has members, is
    still the recorded one; a leader with another start time is someone else's."""
    try:
        leader = psutil.Process(recorded.pid)
        return abs(leader.create_time() - recorded.create_time) < CREATE_TIME_TOLERANCE
    except psutil.NoSuchProcess:
        return bool(group_members(recorded.pid))


def _kill_group(recorded: Recorded) -> list[int]:
    """SIGKILL the recorded group while it is still ours; the pids it held."""
    killed: list[int] = []
    deadline = time.monotonic() + REAP_WAIT_SECONDS
    while _group_is_ours(recorded) and time.monotonic() < deadline:
        members = group_members(recorded.pid)
        if not members:
            break
        killed += [pid for pid in members if pid not in killed]
        try:
            os.killpg(recorded.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            break
        time.sleep(0.05)
    return killed


class StackPids:
    """The record of one stack in its var/: `claim()` it, note each child and the network as
    they are made, `release()` it once everything has stopped."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._children: dict[str, Recorded] = {}
        self._network_tag: str | None = None
        self._claimed = False

    @property
    def claimed(self) -> bool:
        return self._claimed

    def claim(self) -> list[str]:
        """Make this var/ ours: refuse (AlreadyRunning) if its recorded supervisor still runs;
        stop what an earlier stack left there; record us. Returns what it stopped, one line
        per process or network, for the terminal."""
        earlier = self._read()
        supervisor = earlier.get("supervisor")
        if supervisor is not None:
            them = Recorded("supervisor", int(supervisor["pid"]), float(supervisor["create_time"]))
            if them.pid != os.getpid() and _is(them):
                raise AlreadyRunning(
                    f"Trainyard already runs from this folder (pid {them.pid}); "
                    "stop it first (Ctrl-C in its terminal)"
                )
        said = []
        for name, entry in earlier.get("children", {}).items():
            killed = _kill_group(Recorded(name, int(entry["pid"]), float(entry["create_time"])))
            if killed:
                pids = ", ".join(str(pid) for pid in sorted(killed))
                said.append(f"{name} (pid {pids})")
        tag = earlier.get("network")
        if tag:
            from stack.netns import remove_leftovers

            said += remove_leftovers(str(tag))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._lock:
            self._claimed = True
            self._write()
        return said

    def child_started(self, name: str, pid: int) -> None:
        """Called right after the child is spawned, while it is our unreaped child (its start
        time can be read even if it has already exited)."""
        if not self._claimed:
            return
        with self._lock:
            self._children[name] = Recorded(name, pid, _create_time(pid))
            self._write()

    def network_tag(self, tag: str) -> None:
        """Called before the network is made, so that a stack killed while making it leaves its
        name behind."""
        if not self._claimed:
            return
        with self._lock:
            self._network_tag = tag
            self._write()

    def release(self) -> None:
        """Everything recorded has stopped (and the network is gone): forget it."""
        if not self._claimed:
            return
        with self._lock:
            self.path.unlink(missing_ok=True)
            self._children.clear()
            self._network_tag = None
            self._claimed = False

    def _read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except ValueError:
            return {}  # half a file cannot happen (atomic writes); anything else is not ours
        return data if isinstance(data, dict) else {}

    def _write(self) -> None:
        me = os.getpid()
        data = {
            "supervisor": {"pid": me, "create_time": _create_time(me)},
            "children": {
                c.name: {"pid": c.pid, "create_time": c.create_time}
                for c in self._children.values()
            },
            "network": self._network_tag,
        }
        temp = self.path.with_name(f".{self.path.name}.tmp")
        temp.write_text(json.dumps(data, indent=1) + "\n")
        os.replace(temp, self.path)
