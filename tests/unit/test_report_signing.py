"""The console believes a report or heartbeat only from the node it names: each is signed with
that node's key (workers/credentials.py), and jobs.tasks refuses the rest, saying so."""

import logging
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User

from jobs import tasks
from jobs.models import Job, Node, Replica
from jobs.services import heartbeat_limits
from jobs.services.submission import check_job_request, submit_job
from tests.unit.helpers import SentTasks, give_credentials, job_request
from workers import contract, credentials

Capture = Callable[..., Any]


def heartbeat(node: str, cpus: int) -> dict[str, Any]:
    return {
        "node": node, "address": "10.0.0.9", "cpus": cpus, "memory_gb": 32, "gpus": 0,
        "incarnation": "a", "running": [], "finished": [], "sent": time.time(),
    }  # fmt: skip


@pytest.fixture(autouse=True)
def no_heartbeat_seen() -> None:
    heartbeat_limits.forget()  # each test's heartbeat is an agent's first, not one too soon


@pytest.fixture
def keys(nodes: list[Node]) -> dict[str, str]:
    return {node.name: give_credentials(node.name) for node in nodes}


def test_a_heartbeat_signed_with_another_nodes_key_is_refused(
    keys: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    forged = credentials.sign(heartbeat("node-1", 99), keys["node-2"], contract.TASK_NODE_HEARTBEAT)
    with caplog.at_level(logging.WARNING):
        tasks.node_heartbeat(forged)
    node = Node.objects.get(name="node-1")
    assert (node.cpu, node.address, node.incarnation) == (8, "127.0.0.1", "")
    assert "claims to come from node 'node-1'" in caplog.text
    assert "does not match" in caplog.text


def test_a_heartbeat_signed_with_its_own_nodes_key_is_applied(keys: dict[str, str]) -> None:
    tasks.node_heartbeat(
        credentials.sign(heartbeat("node-1", 12), keys["node-1"], contract.TASK_NODE_HEARTBEAT)
    )
    node = Node.objects.get(name="node-1")
    assert (node.cpu, node.address, node.incarnation) == (12, "10.0.0.9", "a")


@pytest.mark.parametrize(
    "tamper",
    [
        lambda p, key: p,  # unsigned
        lambda p, key: dict(
            credentials.sign(p, key, contract.TASK_NODE_HEARTBEAT), cpus=64
        ),  # changed after signing
        lambda p, key: credentials.sign(p, key, contract.TASK_REPLICA_STARTED),  # another task
        lambda p, key: credentials.sign(
            p, key, contract.TASK_NODE_HEARTBEAT, now=time.time() - 7200
        ),  # replayed long after
    ],
    ids=["unsigned", "altered", "other-task", "stale"],
)
def test_a_heartbeat_not_signed_for_what_it_says_is_refused(
    keys: dict[str, str], tamper: Callable[[dict[str, Any], str], dict[str, Any]]
) -> None:
    tasks.node_heartbeat(tamper(heartbeat("node-1", 12), keys["node-1"]))
    assert Node.objects.get(name="node-1").cpu == 8


@pytest.mark.django_db
def test_a_node_without_credentials_is_believed_only_where_they_are_not_required(
    settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        tasks.node_heartbeat(heartbeat("node-9", 4))
    assert not Node.objects.filter(name="node-9").exists()
    assert "node 'node-9': the node has no credentials" in caplog.text

    settings.TRAINYARD_REQUIRE_AGENT_CREDENTIALS = False
    tasks.node_heartbeat(heartbeat("node-9", 4))
    assert Node.objects.get(name="node-9").cpu == 4
    give_credentials("node-8")  # a node with credentials must sign all the same
    tasks.node_heartbeat(heartbeat("node-8", 4))
    assert not Node.objects.filter(name="node-8").exists()


@pytest.mark.usefixtures("catalog", "code_root", "redis_url")
def test_an_exit_report_signed_by_another_node_changes_nothing_and_its_own_is_applied(
    keys: dict[str, str],
    alice: User,
    sent_tasks: SentTasks,
    django_capture_on_commit_callbacks: Capture,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        job = submit_job(alice, check_job_request(job_request(instances=1)))
    replica = job.replicas.select_related("node").get()
    assert replica.node is not None
    node = replica.node.name
    other = next(n for n in keys if n != node)
    report = {
        "job_id": job.pk, "role": replica.role, "index": replica.index, "node": node,
        "state": "failed", "exit_code": 1, "reason": "forged", "stderr_tail": [],
    }  # fmt: skip
    with caplog.at_level(logging.WARNING), django_capture_on_commit_callbacks(execute=True):
        tasks.replica_exited(credentials.sign(report, keys[other], contract.TASK_REPLICA_EXITED))
    assert Replica.objects.get(pk=replica.pk).state == replica.state
    assert Job.objects.get(pk=job.pk).state == job.state
    assert f"claims to come from node {node!r}" in caplog.text

    honest = dict(report, state="succeeded", exit_code=0, reason="")
    with django_capture_on_commit_callbacks(execute=True):
        tasks.replica_exited(credentials.sign(honest, keys[node], contract.TASK_REPLICA_EXITED))
    assert Replica.objects.get(pk=replica.pk).state == Replica.State.SUCCEEDED
    assert Job.objects.get(pk=job.pk).state == Job.State.SUCCEEDED
