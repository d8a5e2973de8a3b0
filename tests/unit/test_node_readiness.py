"""Nodes that take no new work for what their agent says: a full work disk, or a protocol
older than this console needs. Placement passes them by, a waiting job's reason says why, and
the Nodes page and API show it; once the agent says otherwise, waiting jobs start there."""

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from jobs.models import ApiToken, Job, Node
from jobs.services import nodes as node_service
from jobs.services.submission import check_job_request, submit_job
from tests.unit.helpers import SentTasks, job_request
from workers import contract

pytestmark = pytest.mark.usefixtures("catalog", "code_root", "redis_url")

FULL = "node-1: no space left on /var/lib/trainyard-agent"
Capture = Callable[..., Any]


def beat(name: str, **extra: Any) -> None:
    node_service.node_heartbeat(
        {"node": name, "address": "127.0.0.1", "cpus": 8, "memory_gb": 32, "gpus": 0,
         "incarnation": "a", "running": [], "finished": [],
         "protocol": contract.PROTOCOL_VERSION, **extra}
    )  # fmt: skip


@pytest.fixture
def one_node(db: None) -> Node:
    beat("node-1")
    return Node.objects.get(name="node-1")


def placed(job: Job) -> set[str]:
    return {r.node.name for r in job.replicas.select_related("node") if r.node is not None}


def test_it_keeps_the_protocol_and_the_disk_state_each_heartbeat_says(one_node: Node) -> None:
    assert (one_node.protocol, one_node.disk_full, one_node.status) == (
        contract.PROTOCOL_VERSION, "", "ready"
    )  # fmt: skip
    beat("node-1", disk_full=FULL)
    node = Node.objects.get(name="node-1")
    assert (node.status, node.status_reason) == ("disk full", FULL)
    beat("node-1", protocol=None)  # an agent from before versioning says nothing
    node.refresh_from_db()
    assert (node.protocol, node.status) == (0, "agent too old")
    assert node.status_reason == (
        f"node-1: its agent speaks protocol 0, this console needs "
        f"{contract.MIN_AGENT_PROTOCOL} or later: upgrade the agent"
    )


@pytest.mark.parametrize(
    ("said", "reason"),
    [
        ({"disk_full": FULL}, FULL),
        (
            {"protocol": contract.MIN_AGENT_PROTOCOL - 1},
            f"node-1: its agent speaks protocol {contract.MIN_AGENT_PROTOCOL - 1}, this console "
            f"needs {contract.MIN_AGENT_PROTOCOL} or later: upgrade the agent",
        ),
    ],
)
def test_a_job_waits_saying_why_and_starts_once_the_node_takes_work_again(
    one_node: Node,
    alice: User,
    sent_tasks: SentTasks,
    django_capture_on_commit_callbacks: Capture,
    said: dict[str, Any],
    reason: str,
) -> None:
    beat("node-1", **said)
    with django_capture_on_commit_callbacks(execute=True):
        job = submit_job(alice, check_job_request(job_request(instances=2)))
    job.refresh_from_db()
    assert not placed(job)
    assert job.reason == f"waiting: no node is ready ({reason})"
    assert not sent_tasks.named(contract.TASK_START_REPLICA)
    with django_capture_on_commit_callbacks(execute=True):
        beat("node-1")  # space freed, or the agent upgraded
    job.refresh_from_db()
    assert placed(job) == {"node-1"} and job.reason == "starting on node-1"


def test_with_another_node_ready_but_too_small_the_reason_names_the_full_one(
    one_node: Node, alice: User, sent_tasks: SentTasks, django_capture_on_commit_callbacks: Capture
) -> None:
    beat("node-1", disk_full=FULL)
    node_service.node_heartbeat(
        {"node": "node-2", "address": "127.0.0.1", "cpus": 1, "memory_gb": 32, "gpus": 0,
         "protocol": contract.PROTOCOL_VERSION}
    )  # fmt: skip
    with django_capture_on_commit_callbacks(execute=True):
        job = submit_job(alice, check_job_request(job_request(instances=2, package="cpu-2")))
    job.refresh_from_db()
    assert job.reason == (
        f"waiting: needs a node with 2 CPU cores and 4 GB free (not taking work: {FULL})"
    )


def test_the_nodes_page_and_api_show_why_a_node_takes_no_work(
    one_node: Node, alice: User, client: Client
) -> None:
    beat("node-1", disk_full=FULL)
    client.force_login(alice)
    page = client.get("/nodes/").content.decode()
    assert "disk full" in page and FULL in page
    answer = client.get("/api/v1/nodes", HTTP_AUTHORIZATION=f"Token {ApiToken.issue(alice)}")
    (shown,) = answer.json()["nodes"]
    assert (shown["status"], shown["status_reason"], shown["protocol"]) == (
        "disk full", FULL, contract.PROTOCOL_VERSION
    )  # fmt: skip
