"""Node agents report what they have and keep heartbeating; a node whose agent dies is lost."""

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import RunningStack

pytestmark = pytest.mark.integration


def test_an_agent_registers_its_inventory_and_is_lost_once_it_dies(
    stack: RunningStack, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # An agent of its own Redis user, as every agent has (the console refuses unsigned reports).
    env = dict(
        stack.stack.env(), REDIS_URL=stack.stack.manage("agent_credentials", "node-9").strip()
    )
    workdir = tmp_path_factory.mktemp("node-9")
    log = open(workdir / "agent.log", "wb")
    agent = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "workers.agent",
            "--node",
            "node-9",
            "--address",
            "127.0.0.1",
            "--cpus",
            "3",
            "--memory-gb",
            "5",
            "--workdir",
            str(tmp_path_factory.mktemp("n9")),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while node_status(stack) != "ready 3 0 5":
            assert time.monotonic() < deadline, (workdir / "agent.log").read_text()
            time.sleep(0.5)
        os.killpg(agent.pid, signal.SIGKILL)  # no goodbye: only its silence tells
        agent.wait()
        died = time.monotonic()
        while node_status(stack) != "lost 3 0 5":
            assert time.monotonic() < died + 120, "node-9 never marked lost"
            time.sleep(0.5)
        print(f"\nnode-9 shown lost {time.monotonic() - died:.1f} s after its agent died")
    finally:
        log.close()
        if agent.poll() is None:
            os.killpg(agent.pid, signal.SIGKILL)
            agent.wait()


def node_status(stack: RunningStack) -> str:
    """node-9's status and capacity, read from the console's database."""
    return stack.stack.manage("shell", "--no-imports", "-c", NODE_STATUS).strip().splitlines()[-1]


NODE_STATUS = (
    "from jobs.models import Node; n = Node.objects.filter(name='node-9').first(); "
    "print(n and f'{n.status} {n.cpu} {n.gpus} {n.memory_gb}')"
)
