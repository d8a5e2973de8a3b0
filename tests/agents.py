"""Node agents a test starts beside a running stack: on a work dir of its choosing (a small
tmpfs), or from another checkout of the agent (an older or newer protocol version).

Each is a real `python -m workers.agent` with credentials of its own, started through the
death-signal shim (it dies with the test process however that dies) and stopped by its PID.
"""

import contextlib
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.conftest import RunningStack, wait_until
from workers import deathsig

ROOT = Path(__file__).resolve().parent.parent
PROTOCOL_LINE = re.compile(r"^PROTOCOL_VERSION = \d+$", re.MULTILINE)


def checkout_with_protocol(dest: Path, version: int) -> Path:
    """A copy of the agent's package (`workers/`) in `dest` that speaks protocol `version`:
    what a host running an older or newer release of the agent runs."""
    shutil.copytree(
        ROOT / "workers", dest / "workers", ignore=shutil.ignore_patterns("__pycache__")
    )
    contract = dest / "workers" / "contract.py"
    text, found = PROTOCOL_LINE.subn(f"PROTOCOL_VERSION = {version}", contract.read_text())
    assert found == 1, "workers/contract.py must say PROTOCOL_VERSION once"
    contract.write_text(text)
    return dest


class Agent:
    def __init__(self, node: str, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.node = node
        self.proc = proc
        self.log = log

    def stop(self, timeout: float = 60.0) -> None:
        """SIGTERM, as systemd stops it; SIGKILL if it has not ended within `timeout`."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_agent(
    stack: RunningStack,
    node: str,
    workdir: Path,
    log: Path,
    *args: str,
    checkout: Path = ROOT,
    cpus: int = 4,
) -> Agent:
    """Start the agent of `node` (credentials made now, if it has none yet)."""
    (url,) = stack.stack.manage("agent_credentials", node).split()
    env: dict[str, Any] = dict(stack.stack.env(), REDIS_URL=url, PYTHONPATH=str(checkout))
    argv = [
        sys.executable, "-m", "workers.agent", "--node", node, "--address", "127.0.0.1",
        "--cpus", str(cpus), "--memory-gb", "16", "--workdir", str(workdir),
        "--heartbeat-seconds", "1", *args,
    ]  # fmt: skip
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            deathsig.command(argv), env=env, cwd=checkout, stdout=out, stderr=subprocess.STDOUT
        )
    return Agent(node, proc, log)


@contextlib.contextmanager
def running_agent(
    stack: RunningStack, node: str, workdir: Path, log: Path, *args: str, **kw: Any
) -> Iterator[Agent]:
    agent = start_agent(stack, node, workdir, log, *args, **kw)
    try:
        yield agent
    finally:
        agent.stop()


def node_row(stack: RunningStack, node: str) -> dict[str, Any] | None:
    answer = stack.admin.http.get("/api/v1/nodes")
    assert answer.status_code == 200, answer.text
    return next((n for n in answer.json()["nodes"] if n["name"] == node), None)


def wait_status(stack: RunningStack, node: str, status: str) -> dict[str, Any]:
    """The node's row once its status is `status`."""

    def row() -> dict[str, Any] | None:
        found = node_row(stack, node)
        return found if found is not None and found["status"] == status else None

    found: dict[str, Any] = wait_until(f"{node} to be {status}", row)
    return found


def retire_node(stack: RunningStack, node: str) -> None:
    """Drain a node a test added (its agent stopped), so that it counts for no later test: a
    drained node is no capacity that admission judges by, and gets no work."""
    answer = stack.admin.http.post(f"/api/v1/nodes/{node}/drain", json={})
    assert answer.status_code in (200, 404), answer.text  # 404: it never registered


# A package only the tests' own agents (12 cores) hold: the stack's agents have 4, so a job that
# asks for it runs on the test's agent or nowhere.
BIG = "cpu-6"


def make_big_package(stack: RunningStack) -> None:
    stack.stack.manage(
        "shell",
        "-c",
        "from jobs.models import Package\n"
        f"Package.objects.get_or_create(name={BIG!r}, defaults={{'cpu': 6, 'memory_gb': 2}})",
    )


def on_big_nodes(request: dict[str, Any]) -> dict[str, Any]:
    for role in request["roles"].values():
        role["package"] = BIG
    return request
