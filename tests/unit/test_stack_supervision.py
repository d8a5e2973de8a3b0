"""The local stack's supervisor over cheap real processes: restarts with back-off, stops in
order, nothing left behind. (The stack itself drives the same class with Redis, the web server,
the console worker, the log keeper and the agents.)"""

import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from stack.run import Child, ChildRestarts, ChildState, ChildSupervisor
from tests.conftest import process_alive

SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]

# Counts its runs in the file named by argv[1]; the first QUICK runs exit at once, the next one
# stays up STABLE seconds before it exits, later ones stay up.
FLAKY = """
import pathlib, sys, time
counter = pathlib.Path(sys.argv[1])
run = int(counter.read_text()) + 1 if counter.exists() else 1
counter.write_text(str(run))
quick, stable = int(sys.argv[2]), float(sys.argv[3])
if run <= quick:
    sys.exit(3)
time.sleep(stable if run == quick + 1 else 600)
sys.exit(3)
"""

# Says "ready" once its SIGTERM handler is in place: ignore the signal, or note it in
# argv[2] and exit.
ON_SIGTERM = """
import pathlib, signal, sys, time
name, notes = sys.argv[1], sys.argv[2]
def note_and_exit(signum, frame):
    with open(notes, "a") as f:
        f.write(name + "\\n")
    sys.exit(0)
signal.signal(signal.SIGTERM, signal.SIG_IGN if notes == "ignore" else note_and_exit)
print("ready", flush=True)
time.sleep(600)
"""


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout  # hang guard only
    while not condition():
        assert time.monotonic() < deadline, f"waited {timeout:g} s for {what}"
        time.sleep(0.02)


class Supervised:
    """A supervisor over a temporary folder, with the lines it announced."""

    def __init__(self, folder: Path, **policy: Any) -> None:
        self.folder = folder
        self.lines: list[str] = []
        self.supervisor = ChildSupervisor(
            folder,
            env=lambda: dict(os.environ),
            cwd=folder,
            policy=ChildRestarts(**{"poll_interval": 0.02, **policy}),
            announce=self.lines.append,
        )

    def runs(self, counter: str) -> int:
        path = self.folder / counter
        return int(path.read_text()) if path.exists() else 0

    def wait_ready(self, child: Child) -> None:
        wait_until(lambda: "ready" in child.log_path.read_text(), f"{child.name} to say ready")


@pytest.fixture
def supervised(tmp_path: Path) -> Iterator[Callable[..., Supervised]]:
    made: list[Supervised] = []

    def make(**policy: Any) -> Supervised:
        made.append(Supervised(tmp_path, **policy))
        return made[-1]

    yield make
    for each in made:  # whatever a test left running
        each.supervisor.stop()


def test_a_killed_child_is_restarted_with_a_new_pid_and_says_so(
    supervised: Callable[..., Supervised],
) -> None:
    s = supervised(first_delay=0.05)
    child = s.supervisor.spawn("sleeper", SLEEPER)
    s.supervisor.watch()
    old_pid = s.supervisor.pid("sleeper")

    s.supervisor.kill("sleeper", signal.SIGKILL)
    new_pid = s.supervisor.wait_up("sleeper", timeout=20, not_pid=old_pid)

    assert new_pid != old_pid and process_alive(new_pid) and not process_alive(old_pid)
    said = "sleeper exited (killed by SIGKILL); restarting in 0.05 s (restart 1)"
    assert said in s.lines
    assert said in child.log_path.read_text(), "the child's own log says it too"
    assert any(line.startswith(f"sleeper is up again (pid {new_pid})") for line in s.lines)
    assert child.restarts == 1


def test_the_back_off_doubles_up_to_the_cap_and_starts_afresh_after_a_stable_run(
    supervised: Callable[..., Supervised],
) -> None:
    s = supervised(first_delay=0.05, max_delay=0.15, stable_after=2.0)
    # Four runs die at once, the fifth stays up longer than stable_after, then dies too.
    child = s.supervisor.spawn(
        "flaky", [sys.executable, "-c", FLAKY, str(s.folder / "runs"), "4", "2.5"]
    )
    s.supervisor.watch()

    wait_until(lambda: child.restarts == 5, "five exits of the flaky child")

    delays = [float(m[1]) for line in s.lines if (m := re.search(r"restarting in (\S+) s", line))]
    assert delays == [0.05, 0.1, 0.15, 0.15, 0.05]
    assert all("flaky exited (code 3)" in line for line in s.lines if "restarting" in line)


def test_stop_during_the_back_off_restarts_nothing(
    supervised: Callable[..., Supervised],
) -> None:
    s = supervised(first_delay=0.05)
    # Driven by hand, without the watcher thread, so that each step happens exactly when said.
    child = s.supervisor.spawn(
        "flaky", [sys.executable, "-c", FLAKY, str(s.folder / "runs"), "99", "0"]
    )
    dead_pid = child.proc.pid
    child.proc.wait(20)
    s.supervisor.supervise_once()
    assert child.state is ChildState.BACKING_OFF

    s.supervisor.stop()
    wait_until(lambda: time.monotonic() > child.restart_due, "the restart to fall due")
    s.supervisor.supervise_once()

    assert child.state is ChildState.STOPPED and child.proc.pid == dead_pid
    assert s.runs("runs") == 1
    assert not any("up again" in line for line in s.lines)


def test_stop_ends_every_child_on_sigterm_and_returns(
    supervised: Callable[..., Supervised],
) -> None:
    s = supervised(stop_timeout=60)
    children = [s.supervisor.spawn(f"sleeper-{i}", SLEEPER) for i in range(3)]
    s.supervisor.watch()

    stopping = threading.Thread(target=s.supervisor.stop)
    stopping.start()
    stopping.join(20)  # hang guard: each child ends on SIGTERM, far before the 60 s timeout

    assert not stopping.is_alive(), "stop() still waits although every child has ended"
    for child in children:
        assert child.proc.returncode == -signal.SIGTERM, "ended by SIGTERM, not SIGKILL"
        assert not process_alive(child.proc.pid)
    assert s.supervisor.children == []
    assert not any("restarting" in line for line in s.lines), "no restart while stopping"


def test_stop_goes_stage_by_stage(supervised: Callable[..., Supervised]) -> None:
    s = supervised()
    notes = str(s.folder / "stopped")
    # Spawned in the reverse of the stop order, so the order cannot come from the list.
    names = ["redis", "web", "agent"]
    children = [
        s.supervisor.spawn(name, [sys.executable, "-c", ON_SIGTERM, name, notes]) for name in names
    ]
    for child in children:
        s.wait_ready(child)

    s.supervisor.stop(stage_of={"agent": 0, "web": 1, "redis": 2}.__getitem__)

    assert Path(notes).read_text().split() == ["agent", "web", "redis"]


def test_a_child_that_ignores_sigterm_is_killed_after_the_stop_timeout(
    supervised: Callable[..., Supervised],
) -> None:
    s = supervised(stop_timeout=0.5)
    stubborn = s.supervisor.spawn("stubborn", [sys.executable, "-c", ON_SIGTERM, "x", "ignore"])
    s.wait_ready(stubborn)

    s.supervisor.stop()

    assert stubborn.proc.returncode == -signal.SIGKILL
    assert not process_alive(stubborn.proc.pid)
    pid = stubborn.proc.pid
    assert (
        f"stubborn did not stop within 0.5 s of SIGTERM; killing it (SIGKILL, pid {pid})" in s.lines
    )
    assert "stubborn stopped (killed by SIGKILL)" in s.lines


def test_a_child_outlives_the_thread_that_asked_for_it_and_stops_in_order(
    supervised: Callable[..., Supervised],
) -> None:
    """The death signal follows the thread that forked the child: children asked for from a
    thread that ends (the watcher ends when stop() begins; restarts come from it) must live on
    and be stopped in order like the others."""
    s = supervised(stop_timeout=60)

    def ask() -> None:
        pid = s.supervisor.spawn("sleeper", SLEEPER).proc.pid
        # Until the shim has set the death signal and become the sleeper: only then can the
        # end of this thread fire it.
        wait_until(lambda: "deathsig.py" not in " ".join(psutil.Process(pid).cmdline()), "exec")

    asker = threading.Thread(target=ask)
    asker.start()
    asker.join(20)
    task = Path(f"/proc/self/task/{asker.native_id}")
    wait_until(lambda: not task.exists(), "the asking thread to be gone from the kernel too")
    child = s.supervisor.child("sleeper")

    assert process_alive(child.proc.pid)
    s.supervisor.stop()
    assert child.proc.returncode == -signal.SIGTERM


# Starts a supervisor with one sleeper, prints the sleeper's pid, then waits to be killed.
SUPERVISOR_SCRIPT = """
import os, sys, time
from pathlib import Path
from stack.run import ChildSupervisor
supervisor = ChildSupervisor(Path(sys.argv[1]), env=lambda: dict(os.environ))
supervisor.spawn("sleeper", [sys.executable, "-c", "import time; time.sleep(600)"])
supervisor.watch()
print(supervisor.pid("sleeper"), flush=True)
time.sleep(600)
"""


def test_children_die_with_a_supervisor_killed_by_sigkill(tmp_path: Path) -> None:
    import subprocess

    owner = subprocess.Popen(
        [sys.executable, "-c", SUPERVISOR_SCRIPT, str(tmp_path)],
        stdout=subprocess.PIPE,
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        assert owner.stdout is not None
        sleeper = int(owner.stdout.readline())
        assert process_alive(sleeper)
        owner.kill()
        owner.wait(20)
        wait_until(lambda: not process_alive(sleeper), "the sleeper to die with its supervisor")
    finally:
        owner.kill()
        owner.wait(20)


def test_a_frozen_child_is_thawed_to_take_its_sigterm(
    supervised: Callable[..., Supervised],
) -> None:
    s = supervised(stop_timeout=60)
    child = s.supervisor.spawn("sleeper", SLEEPER)
    s.supervisor.kill("sleeper", signal.SIGSTOP)
    wait_until(
        lambda: psutil.Process(child.proc.pid).status() == psutil.STATUS_STOPPED,
        "the child to be frozen",
    )

    s.supervisor.stop()

    assert child.proc.returncode == -signal.SIGTERM


def test_a_restarted_child_is_up_only_once_its_probe_answers(
    supervised: Callable[..., Supervised],
) -> None:
    s = supervised(first_delay=0.05)
    answering = threading.Event()
    answering.set()
    child = s.supervisor.spawn("server", SLEEPER, ready=answering.is_set)
    s.supervisor.watch()
    first_pid = s.supervisor.wait_up("server", timeout=20)

    answering.clear()
    s.supervisor.kill("server", signal.SIGKILL)
    wait_until(
        lambda: child.state is ChildState.STARTING and child.proc.pid != first_pid,
        "the new server process to start",
    )
    with pytest.raises(TimeoutError, match="state: starting"):
        s.supervisor.wait_up("server", timeout=0.2, not_pid=first_pid)

    answering.set()
    assert s.supervisor.wait_up("server", timeout=20, not_pid=first_pid) == child.proc.pid


def test_a_restart_on_request_is_one_restart_and_no_crash(
    supervised: Callable[..., Supervised],
) -> None:
    s = supervised(first_delay=0.05)
    child = s.supervisor.spawn("sleeper", SLEEPER)
    s.supervisor.watch()
    old_pid = child.proc.pid

    seen_while_down: list[tuple[bool, int]] = []

    def while_down() -> None:
        # However often the watcher looks meanwhile, a held process is not started again.
        for _ in range(3):
            s.supervisor.supervise_once()
        seen_while_down.append((process_alive(old_pid), child.proc.pid))

    new_pid = s.supervisor.restart("sleeper", while_down)

    assert seen_while_down == [(False, old_pid)], "down, and not restarted, until it returned"
    assert new_pid != old_pid and process_alive(new_pid) and not process_alive(old_pid)
    assert child.restarts == 0, "not counted as a crash"
    assert not any("exited" in line for line in s.lines), "the watcher left it alone"
