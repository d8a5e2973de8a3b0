"""Agents of two protocol versions beside one console, over the real stack: an agent too old
for the console (another checkout of the agent, one protocol version back) registers, is shown
so, and gets no start; a job that could run only there waits saying why, and starts once the
node's agent is upgraded (this checkout's, on the same work dir)."""

from pathlib import Path

from tests.agents import (
    checkout_with_protocol,
    make_big_package,
    on_big_nodes,
    retire_node,
    running_agent,
    wait_status,
)
from tests.conftest import RunningStack, pytorch_request
from workers import contract

NODE = "old-1"


def test_an_agent_too_old_for_the_console_gets_no_start_until_it_is_upgraded(
    stack: RunningStack, tmp_path: Path
) -> None:
    admin = stack.admin
    make_big_package(stack)
    old_version = contract.MIN_AGENT_PROTOCOL - 1
    old = checkout_with_protocol(tmp_path / "old-checkout", old_version)
    workdir, log = tmp_path / "agents", tmp_path / "agent.log"
    try:
        with running_agent(stack, NODE, workdir, log, checkout=old, cpus=12):
            row = wait_status(stack, NODE, "agent too old")
            assert row["protocol"] == old_version
            why = (
                f"{NODE}: its agent speaks protocol {old_version}, this console needs "
                f"{contract.MIN_AGENT_PROTOCOL} or later: upgrade the agent"
            )
            assert row["status_reason"] == why
            job = admin.submit(on_big_nodes(pytorch_request("for a new agent", "markup.py", 1)))
            waiting = admin.wait(job["id"], lambda j: why in j["reason"])
            assert waiting["state"] == "queued"
            assert all(r["node"] is None for r in waiting["replicas"])
        # The node's agent upgraded: the same node, the same work dir, this checkout's agent.
        with running_agent(stack, NODE, workdir, log, cpus=12):
            assert wait_status(stack, NODE, "ready")["protocol"] == contract.PROTOCOL_VERSION
            ran = admin.wait_finished(job["id"])
            assert ran["state"] == "succeeded", ran["reason"]
            assert {r["node"] for r in ran["replicas"]} == {NODE}
    finally:
        retire_node(stack, NODE)
