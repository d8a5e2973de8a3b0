"""The exec shim: a program started through it dies with the thread that started it."""

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.conftest import process_alive
from tests.unit.test_supervisor import wait_until
from workers import deathsig

SLEEPER = [sys.executable, "-c", "import time; time.sleep(3600)"]
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[str]]]:
    """Parents this test starts; whatever is left of them is killed by pid at the end."""
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def start_parent(started: list[subprocess.Popen[str]], body: str) -> tuple[int, int]:
    """A Python process that runs `body` (which starts `child` through the shim and prints its
    pid); returns (parent pid, child pid) once the child runs the real program."""
    code = "import subprocess, sys, threading, time\nfrom workers import deathsig\n"
    code += textwrap.dedent(body)
    parent = subprocess.Popen(
        [sys.executable, "-c", code, *SLEEPER],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    started.append(parent)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    wait_until(lambda: psutil.Process(child).cmdline() == SLEEPER, 10, "the shim to exec")
    return parent.pid, child


def test_it_dies_when_its_parent_is_killed(started: list[subprocess.Popen[str]]) -> None:
    parent, child = start_parent(
        started,
        """
        child = subprocess.Popen(deathsig.command(sys.argv[1:]))
        print(child.pid, flush=True)
        time.sleep(3600)
        """,
    )
    os.kill(parent, signal.SIGKILL)
    wait_until(lambda: not process_alive(child), 5, f"child {child} to die with its parent")


def test_it_dies_when_the_thread_that_started_it_ends(
    started: list[subprocess.Popen[str]],
) -> None:
    # Why the supervisor starts a replica's processes from a thread that outlives them.
    parent, child = start_parent(
        started,
        """
        def start():
            child = subprocess.Popen(deathsig.command(sys.argv[1:]))
            print(child.pid, flush=True)
            sys.stdin.readline()  # the thread ends when the test says so

        thread = threading.Thread(target=start)
        thread.start()
        thread.join()
        time.sleep(3600)
        """,
    )
    proc = next(p for p in started if p.pid == parent)
    assert proc.stdin is not None
    proc.stdin.write("end the thread\n")
    proc.stdin.flush()
    wait_until(lambda: not process_alive(child), 5, f"child {child} to die with the thread")
    assert process_alive(parent)


def test_it_passes_argv_and_environment_through_untouched(tmp_path: Path) -> None:
    script = "import os, sys; print(sys.argv[1:], os.environ['ODD'], sys.flags.isolated)"
    out = subprocess.run(
        deathsig.command([sys.executable, "-c", script, "a b", "--", "$HOME"]),
        env={**os.environ, "ODD": "x y"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out == "['a b', '--', '$HOME'] x y 0\n"


def test_it_does_not_start_the_program_once_its_parent_is_gone(tmp_path: Path) -> None:
    # A parent pid that is not ours stands for a parent that died before the shim ran.
    marker = tmp_path / "ran"
    result = subprocess.run(
        deathsig.command(["touch", str(marker)], parent_pid=1),
        capture_output=True,
        text=True,
    )
    assert result.returncode == deathsig.EXIT_PARENT_GONE
    assert "parent 1 is gone" in result.stderr
    assert not marker.exists()


def test_it_says_when_the_program_cannot_run(tmp_path: Path) -> None:
    result = subprocess.run(
        deathsig.command([str(tmp_path / "missing")]), capture_output=True, text=True
    )
    assert result.returncode == deathsig.EXIT_CANNOT_EXEC
    assert f"cannot run {tmp_path / 'missing'}" in result.stderr
