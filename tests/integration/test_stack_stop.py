"""`make run` leaves nothing behind, whatever stops it (issue 30).

Each test runs `python -m stack.run` itself, as `make run` does, with one node and a var/ of its
own, and ends it the way a user's stack ends: SIGKILL, SIGHUP (the terminal closed), SIGTERM
with a child that ignores it. What is "left" is checked twice: by the pids the stack recorded in
var/stack.pids (with their start times), and by every process on the machine whose command line
or environment names this stack's var/ or port (a stack beside ours names other ones).
"""

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from stack import netns
from stack.leftovers import StackPids
from stack.redis_server import free_port
from stack.run import ROOT
from tests.conftest import (
    FIXTURE_CODE_ROOT,
    StackClient,
    process_alive,
    pytorch_request,
    required_here,
    wait_until,
)

pytestmark = pytest.mark.integration

GUARD = 120.0  # a hang guard for each wait; measures nothing

# stack.run with its agent wrapped in a process that ignores its stop signal (SIGUSR2 for an
# agent: the real agent, its child, stops; the wrapper does not), and a stop timeout of 2 s.
STUBBORN_STACK = """
import sys
from stack import run

WRAPPER = '''
import signal, subprocess, sys, time
agent = subprocess.Popen(sys.argv[1:])
signal.signal(signal.SIGTERM, signal.SIG_IGN)
signal.signal(signal.SIGUSR2, signal.SIG_IGN)
agent.wait()
while True:
    time.sleep(3600)
'''


class StubbornAgents(run.Stack):
    def __post_init__(self):
        self.agent_command = [sys.executable, "-c", WRAPPER, *self.agent_command]
        self.agent_stop_timeout = 2.0
        super().__post_init__()


run.Stack = StubbornAgents
sys.exit(run.main(sys.argv[1:]))
"""


class StackRun:
    """One `python -m stack.run` process, its output in a file."""

    def __init__(
        self,
        var_dir: Path,
        *options: str,
        program: list[str] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.var_dir = var_dir
        self.port = free_port()
        self.output = var_dir.parent / f"{var_dir.name}-{self.port}.out"
        extra = env or {}
        env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DATABASE_URL", "CI")}
        env["TRAINYARD_CODE_ROOT"] = str(FIXTURE_CODE_ROOT)
        env |= extra
        argv = program or [sys.executable, "-m", "stack.run"]
        with open(self.output, "wb") as out:
            self.proc = subprocess.Popen(
                [*argv, "--port", str(self.port), "--nodes", "1", "--var-dir", str(var_dir),
                 *options],
                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip

    def text(self) -> str:
        return self.output.read_text(errors="replace")

    def wait_running(self) -> None:
        def running() -> bool:
            assert self.proc.poll() is None, f"stack.run ended:\n{self.text()}"
            return "press Ctrl-C to stop everything" in self.text()

        wait_until("the stack to run", running, GUARD)

    def recorded(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.var_dir / "stack.pids").read_text())
        return data

    def wait_ended(self) -> int:
        wait_until("stack.run to end", lambda: self.proc.poll() is not None, GUARD)
        return self.proc.returncode

    def close(self) -> None:
        """After a failed test too: whatever the stack recorded goes, by pid and start time."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if (self.var_dir / "stack.pids").exists():
            record = StackPids(self.var_dir / "stack.pids")
            record.claim()
            record.release()


@pytest.fixture
def runs() -> Iterator[list[StackRun]]:
    made: list[StackRun] = []
    yield made
    for run in made:
        run.close()


def alive_recorded(recorded: dict[str, Any]) -> list[str]:
    """The recorded children still running as the process recorded (not a reused pid)."""
    left = []
    for name, entry in recorded["children"].items():
        try:
            if abs(psutil.Process(entry["pid"]).create_time() - entry["create_time"]) < 0.005:
                if process_alive(entry["pid"]):
                    left.append(f"{name} (pid {entry['pid']})")
        except psutil.NoSuchProcess:
            pass
    return left


def naming(run: StackRun) -> list[str]:
    """Every live process whose command line or environment names this stack's var/ or port
    (Redis writes its title over both: it is named by its port)."""
    marks = [str(run.var_dir), f"--port {run.port}", f"@{run.port}"]
    marks += re.findall(r"REDIS_URL=redis://(?:.*@)?(127\.0\.0\.1:\d+)/", run.text())
    found = []
    for proc in psutil.process_iter(["cmdline", "environ"]):
        try:
            cmdline = " ".join(proc.info["cmdline"] or [])
            env = proc.info["environ"] or {}
            ours = any(m in cmdline for m in marks) or str(run.var_dir) in env.get(
                "TRAINYARD_VAR_DIR", ""
            )
            if ours and proc.pid != run.proc.pid and process_alive(proc.pid):
                found.append(f"{proc.pid}: {cmdline}")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def wait_nothing_left(run: StackRun, recorded: dict[str, Any], also: list[int]) -> None:
    def gone() -> bool:
        left = alive_recorded(recorded) + naming(run)
        return not (left or any(process_alive(pid) for pid in also))

    wait_until("every process of the stack to be gone", gone, GUARD)


def token(run: StackRun) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DATABASE_URL")}
    env |= {"TRAINYARD_VAR_DIR": str(run.var_dir), "DJANGO_SETTINGS_MODULE": "console.settings"}
    found = subprocess.run(
        [sys.executable, "manage.py", "token", "admin"],
        cwd=ROOT, env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return found.stdout.strip()


def test_sigkill_of_the_supervisor_leaves_no_process_not_even_a_trainer(
    tmp_path: Path, runs: list[StackRun]
) -> None:
    # The agents die with the supervisor; their keepers hold the trainers for a stack started
    # again within the grace, and stop them after it.
    run = StackRun(tmp_path / "var", env={"TRAINYARD_KEEPER_GRACE_SECONDS": "2"})
    runs.append(run)
    run.wait_running()
    # A trainer with a child of its own, which the death signal does not reach: its keeper
    # must stop it.
    admin = StackClient(f"http://127.0.0.1:{run.port}", token(run))
    job = admin.submit(pytorch_request("held", "sleep_tree.py", 1))
    admin.wait(job["id"], lambda j: j["state"] == "running", GUARD)
    agent = psutil.Process(run.recorded()["children"]["node-1"]["pid"])

    def trainer_tree() -> list[psutil.Process]:
        tree = agent.children(recursive=True)
        return tree if any("sleep(3600)" in " ".join(p.cmdline()) for p in tree) else []

    descendants = wait_until("the trainer and its child", trainer_tree, GUARD)
    guardians = [p for p in descendants if "workers.guardian" in " ".join(p.cmdline())]
    assert guardians, "the agent's guardian runs"
    recorded = run.recorded()

    run.proc.kill()
    run.proc.wait()

    wait_nothing_left(run, recorded, [p.pid for p in descendants])


def test_a_start_stops_what_an_earlier_stack_left_and_sighup_stops_in_order(
    tmp_path: Path, runs: list[StackRun]
) -> None:
    var_dir = tmp_path / "var"
    var_dir.mkdir()
    # What a stack killed before this one left: a process group (a leader and a helper), and
    # a pid that has since gone to another process (a different start time), which must live.
    leftover = subprocess.Popen(
        [sys.executable, "-c",
         "import subprocess, sys, time\n"
         "helper = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
         "print(helper.pid, flush=True)\n"
         "time.sleep(600)"],
        stdout=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    other = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True
    )
    try:
        assert leftover.stdout is not None
        helper = int(leftover.stdout.readline())
        started = psutil.Process(leftover.pid).create_time()
        reused = {"pid": other.pid, "create_time": psutil.Process(other.pid).create_time() - 100}
        (var_dir / "stack.pids").write_text(
            json.dumps(
                {
                    "supervisor": reused,  # the supervisor's pid reused: not a running stack
                    "children": {
                        "node-1": {"pid": leftover.pid, "create_time": started},
                        "web": reused,
                    },
                    "network": None,
                }
            )
        )

        run = StackRun(var_dir)
        runs.append(run)
        run.wait_running()

        pids = ", ".join(str(pid) for pid in sorted([leftover.pid, helper]))
        assert f"stopped what it left: node-1 (pid {pids})" in run.text()
        assert not process_alive(leftover.pid) and not process_alive(helper)
        assert process_alive(other.pid), "a reused pid is never signalled"
        recorded = run.recorded()

        run.proc.send_signal(signal.SIGHUP)

        assert run.wait_ended() == 0
        lines = run.text().splitlines()
        order = [line.split()[0] for line in lines if " stopped (" in line]
        assert order[0] == "node-1" and order[-2:] == ["web", "redis"], order
        assert sorted(order[1:3]) == ["console-worker", "log-keeper"], order
        assert lines[-1] == "Stopped."
        assert not any("did not stop within" in line for line in lines)
        wait_nothing_left(run, recorded, [])
        assert not (var_dir / "stack.pids").exists(), "a clean stop leaves no record"
    finally:
        for proc in (leftover, other):
            proc.kill()
            proc.wait()


def test_a_child_that_ignores_sigterm_is_killed_at_its_stop_timeout_and_named(
    tmp_path: Path, runs: list[StackRun]
) -> None:
    run = StackRun(tmp_path / "var", program=[sys.executable, "-c", STUBBORN_STACK])
    runs.append(run)
    run.wait_running()
    recorded = run.recorded()
    agent = recorded["children"]["node-1"]["pid"]

    run.proc.send_signal(signal.SIGTERM)

    assert run.wait_ended() == 0
    text = run.text()
    assert f"node-1 did not stop within 2 s of SIGUSR2; killing it (SIGKILL, pid {agent})" in text
    assert "node-1 stopped (killed by SIGKILL)" in text
    wait_nothing_left(run, recorded, [])


def namespaces() -> set[str]:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    return {line.split(" ", 1)[0] for line in listed.stdout.splitlines()}


def bridge_exists(tag: str) -> bool:
    return Path("/sys/class/net", f"tyb{tag}").exists()


def test_cluster_killed_by_sigkill_loses_its_namespaces_and_bridge_at_the_next_start(
    tmp_path: Path, runs: list[StackRun]
) -> None:
    required_here("the multi-host tests", netns.unavailable_reason())
    var_dir = tmp_path / "cluster"
    first = StackRun(var_dir, "--cluster")
    runs.append(first)
    first.wait_running()
    recorded = first.recorded()
    tag = recorded["network"]
    namespace = f"trainyard-{tag}-node-1"
    assert namespace in namespaces() and bridge_exists(tag)

    first.proc.kill()
    first.proc.wait()
    wait_nothing_left(first, recorded, [])

    second = StackRun(var_dir, "--cluster")
    runs.append(second)
    second.wait_running()
    assert f"network namespace {namespace}; bridge tyb{tag}" in second.text()
    assert namespace not in namespaces() and not bridge_exists(tag)
    new_tag = second.recorded()["network"]
    assert new_tag != tag and bridge_exists(new_tag)
    recorded = second.recorded()

    second.proc.send_signal(signal.SIGINT)

    assert second.wait_ended() == 0
    wait_nothing_left(second, recorded, [])
    assert not any(name.startswith(f"trainyard-{new_tag}-") for name in namespaces())
    assert not bridge_exists(new_tag)
