"""Nodes whose trainers are not sandboxed, or not held to their packages (no cgroup per
instance): marked so on the Nodes page and in the API, and, where the console asks for
isolation (production's default), given no work."""

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from jobs.models import ApiToken, Job, Node
from jobs.services.nodes import node_heartbeat
from jobs.services.scheduler import scheduling
from jobs.services.submission import check_job_request, submit_job
from tests.unit.helpers import job_request
from workers.contract import PROTOCOL_VERSION

pytestmark = pytest.mark.usefixtures("catalog", "code_root", "redis_url", "sent_tasks")


def beat(
    name: str,
    isolation: str,
    reason: str = "",
    limits: str = "cgroup-v1",
    limits_reason: str = "cgroup v1: memory, CPU quota, process limit, devices per instance",
) -> None:
    payload: dict[str, Any] = {
        "node": name, "address": "127.0.0.1", "cpus": 8, "gpus": 0, "memory_gb": 32,
        "incarnation": f"{name}-1", "running": [], "finished": [], "sent": 0,
        "isolation": isolation, "isolation_reason": reason, "protocol": PROTOCOL_VERSION,
        "limits": limits, "limits_reason": limits_reason,
    }  # fmt: skip
    node_heartbeat(payload)


def placed_on(job: Job) -> set[str | None]:
    return {r.node.name if r.node else None for r in job.replicas.all()} - {None}


@pytest.fixture
def two_nodes(db: None) -> None:
    beat("node-1", "none", "bwrap not found; install bubblewrap")
    beat("node-2", "sandbox", "bubblewrap sandbox; trainers run as uid 1900000000+user")


def test_it_keeps_what_the_agent_says_of_its_isolation(two_nodes: None) -> None:
    one, two = Node.objects.order_by("name")
    assert (one.isolated, one.isolation_reason) == (False, "bwrap not found; install bubblewrap")
    assert two.isolated and two.isolation == "sandbox"


def test_an_agent_older_than_the_sandbox_is_not_isolated(db: None) -> None:
    node_heartbeat({"node": "old", "address": "127.0.0.1", "cpus": 8, "gpus": 0, "memory_gb": 32})
    assert not Node.objects.get(name="old").isolated


def test_where_isolation_is_required_an_unisolated_node_gets_no_work(
    two_nodes: None, alice: User, settings: Any
) -> None:
    settings.TRAINYARD_ALLOW_UNISOLATED_NODES = False
    job = submit_job(alice, check_job_request(job_request(instances=3, package="cpu-2")))
    scheduling.schedule()
    # Every instance on node-2, though node-1 has as much room.
    assert placed_on(job) == {"node-2"}
    Node.objects.filter(name="node-2").update(isolation="none")
    waiting = submit_job(alice, check_job_request(job_request(instances=1)))
    scheduling.schedule()
    waiting.refresh_from_db()
    assert placed_on(waiting) == set()
    assert "node-1 not isolated" in waiting.reason and "node-2 not isolated" in waiting.reason


def test_where_it_is_allowed_an_unisolated_node_takes_work(
    two_nodes: None, alice: User, settings: Any
) -> None:
    settings.TRAINYARD_ALLOW_UNISOLATED_NODES = True
    Node.objects.filter(name="node-2").update(isolation="none")
    job = submit_job(alice, check_job_request(job_request(instances=1)))
    scheduling.schedule()
    assert placed_on(job) == {"node-1"}


def test_the_api_and_the_page_mark_a_node_that_is_not_isolated(
    two_nodes: None, client: Client, alice: User, settings: Any
) -> None:
    settings.TRAINYARD_ALLOW_UNISOLATED_NODES = False
    response = client.get("/api/v1/nodes", HTTP_AUTHORIZATION=f"Token {ApiToken.issue(alice)}")
    assert response.status_code == 200
    nodes = {n["name"]: n for n in response.json()["nodes"]}
    assert (nodes["node-1"]["isolated"], nodes["node-1"]["isolation"]) == (False, "none")
    assert nodes["node-1"]["status"] == "not isolated"
    assert (nodes["node-2"]["isolated"], nodes["node-2"]["status"]) == (True, "ready")
    client.force_login(alice)
    html = client.get("/nodes/").content.decode()
    assert 'class="state state-not-isolated">not isolated<' in html
    assert "bwrap not found; install bubblewrap" in html  # why, on hover
    assert "sandboxed" in html


def test_where_isolation_is_required_a_node_without_limits_gets_no_work(
    db: None, alice: User, settings: Any
) -> None:
    """Sandboxed, but nothing holds its jobs to their packages: the same switch decides."""
    settings.TRAINYARD_ALLOW_UNISOLATED_NODES = False
    beat("node-1", "sandbox", limits="none", limits_reason="cgroup v1: Permission denied")
    beat("node-2", "sandbox")
    one = Node.objects.get(name="node-1")
    assert (one.limits_enforced, one.status) == (False, "limits not enforced")
    assert one.status_reason == "node-1: limits not enforced: cgroup v1: Permission denied"
    job = submit_job(alice, check_job_request(job_request(instances=3, package="cpu-2")))
    scheduling.schedule()
    assert placed_on(job) == {"node-2"}
    settings.TRAINYARD_ALLOW_UNISOLATED_NODES = True
    assert Node.objects.get(name="node-1").status == "ready"


def test_an_agent_older_than_limits_does_not_enforce_them(db: None) -> None:
    node_heartbeat({"node": "old", "address": "127.0.0.1", "cpus": 8, "gpus": 0, "memory_gb": 32})
    assert not Node.objects.get(name="old").limits_enforced


def test_the_api_and_the_page_show_how_a_node_holds_jobs_to_their_packages(
    db: None, client: Client, alice: User
) -> None:
    beat("node-1", "sandbox", limits="none", limits_reason="cgroup v1: Permission denied")
    beat("node-2", "sandbox")
    response = client.get("/api/v1/nodes", HTTP_AUTHORIZATION=f"Token {ApiToken.issue(alice)}")
    nodes = {n["name"]: n for n in response.json()["nodes"]}
    assert (nodes["node-1"]["limits_enforced"], nodes["node-1"]["limits"]) == (False, "none")
    assert nodes["node-1"]["limits_reason"] == "cgroup v1: Permission denied"
    assert (nodes["node-2"]["limits_enforced"], nodes["node-2"]["limits"]) == (True, "cgroup-v1")
    client.force_login(alice)
    html = client.get("/nodes/").content.decode()
    assert (
        '>limits not enforced</span> <small class="limits-reason">cgroup v1: Permission denied<'
        in html
    )
    assert ">cgroup-v1</span>" in html
