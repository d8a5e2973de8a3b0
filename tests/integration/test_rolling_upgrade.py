"""A rolling upgrade as docs/operations.md writes it, over a stack of its own, with a DDP job
running throughout: migrate, restart the console processes one by one, then replace each agent,
one at a time, by an agent from another checkout that speaks the next protocol version. Agents
of both versions serve side by side meanwhile; the job never stops (its replicas outlive the
agent that is replaced: the per-replica keeper, issue 26 item 1), keeps its one attempt, and
loses no line. A job submitted after the upgrade runs on the new agents.

Each agent is stopped with SIGTERM, as systemd stops it: it hands its replicas over to their
keepers, and the new agent takes them over within the keeper grace. The job has no restart
policy, so nothing but that hand-over keeps it alive: were the trainers to die with their agent,
the job would fail at the first agent replaced."""

import functools
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.agents import checkout_with_protocol, node_row
from tests.conftest import (
    RunningStack,
    StackClient,
    pytorch_request,
    running_stack,
    signal_file,
    wait_until,
)
from tests.integration.test_faults import check_every_line, hold_request, started
from workers import contract

NEW_VERSION = contract.PROTOCOL_VERSION + 1
CONSOLE_PROCESSES = ("web", "console-worker", "log-keeper")
AGENTS = ("node-1", "node-2")


@pytest.fixture(scope="module")
def upgraded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningStack]:
    """A stack of its own: its agents end the test running another checkout's code."""
    with running_stack(
        tmp_path_factory.mktemp("upgrade"), extra_env={"TRAINYARD_HEARTBEAT_SECONDS": "1"}
    ) as running:
        yield running


def web_answers(stack: RunningStack) -> bool:
    try:
        return stack.admin.http.get("/healthz").status_code == 200
    except httpx.TransportError:
        return False


def last_steps(client: StackClient, job_id: int) -> dict[str, int]:
    """hold.py's last step printed, by rank tag."""
    last: dict[str, int] = {}
    for x in client.logs(job_id):
        tag, _, rest = x["text"].partition(" ")
        if rest.isdigit():
            last[tag] = int(rest)
    return last


def steps_on(client: StackClient, job_id: int) -> None:
    """Until every rank has printed a step past where it was now; fails at once if the job
    ends meanwhile."""
    before = last_steps(client, job_id)

    def moved_on() -> bool:
        job = client.job(job_id)
        assert job["state"] == "running", job["reason"]
        now = last_steps(client, job_id)
        return len(now) == 3 and all(now[t] > before.get(t, -1) for t in now)

    wait_until("every rank to step on", moved_on)


def serves_new(stack: RunningStack, node: str) -> bool:
    row = node_row(stack, node)
    return row is not None and (row["status"], row["protocol"]) == ("ready", NEW_VERSION)


def replace_agent(stack: RunningStack, node: str, checkout: Path) -> None:
    """Stop the node's agent as systemd would (SIGTERM) and start the agent of `checkout` in
    its place, with the same options, work dir and credentials."""
    (child,) = [c for c in stack.stack.children if c.name == node]
    options = child.argv[child.argv.index("--node") :]
    # -P: the checkout named by PYTHONPATH, not the working folder, is where `workers` is.
    child.argv = [sys.executable, "-P", "-m", "workers.agent", *options]
    child.env = dict(child.env, PYTHONPATH=str(checkout))
    stack.stack.restart(node)


def test_a_job_runs_through_a_rolling_upgrade_of_the_console_and_every_agent(
    upgraded: RunningStack, tmp_path: Path
) -> None:
    admin = upgraded.admin
    new = checkout_with_protocol(tmp_path / "new-checkout", NEW_VERSION)
    release = signal_file()
    request = hold_request("through an upgrade", 3, release)
    for role in request["roles"].values():
        role["package"] = "cpu-2"  # 3 × 2 cores: the job spans both 4-core nodes
    job = admin.submit(request)
    try:
        started(admin, job["id"], 3)
        spans = {r["node"] for r in admin.job(job["id"])["replicas"]}
        assert spans == set(AGENTS)

        def still_running() -> None:
            now = admin.job(job["id"])
            assert now["state"] == "running", now["reason"]
            assert {r["state"] for r in now["replicas"]} == {"running"}, now["replicas"]
            assert now["attempt"] == 0

        # 1. The console: migrate, then its processes one by one.
        upgraded.stack.manage("migrate", "--noinput", quiet=True)
        for name in CONSOLE_PROCESSES:
            upgraded.stack.restart(name)
            wait_until("the web server to answer", lambda: web_answers(upgraded))
            still_running()

        # 2. The agents, one at a time; old and new serve side by side meanwhile.
        for i, node in enumerate(AGENTS):
            replace_agent(upgraded, node, new)
            wait_until(f"{node}'s new agent", functools.partial(serves_new, upgraded, node))
            if i == 0:
                other = node_row(upgraded, AGENTS[1])
                assert other is not None
                assert (other["status"], other["protocol"]) == ("ready", contract.PROTOCOL_VERSION)
            steps_on(admin, job["id"])
            still_running()

        release.touch()
        finished = admin.wait_finished(job["id"])
        assert finished["state"] == "succeeded", finished["reason"]
        check_every_line(admin, job["id"], 3)

        # New work goes to the new agents.
        after = admin.submit(pytorch_request("after the upgrade", "markup.py", 2))
        ran = admin.wait_finished(after["id"])
        assert ran["state"] == "succeeded", ran["reason"]
    finally:
        release.touch()
