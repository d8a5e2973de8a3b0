"""The Nodes page and GET /api/v1/nodes: every node's capacity and use for everyone, but the ids
of only the viewer's own jobs (staff: all), so that a shared page names no one else's job."""

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from jobs.models import ApiToken, Job
from jobs.services.scheduler import scheduling
from jobs.services.submission import check_job_request, submit_job
from tests.unit.helpers import job_request

pytestmark = pytest.mark.usefixtures("catalog", "code_root", "nodes", "redis_url", "sent_tasks")


@pytest.fixture
def jobs(alice: User, bob: User) -> tuple[Job, Job]:
    """alice's job and bob's, one core each, both placed."""
    mine = submit_job(alice, check_job_request(job_request(instances=1, name="alice-secret-run")))
    his = submit_job(bob, check_job_request(job_request(instances=1, name="bobs-run")))
    scheduling.schedule()
    return mine, his


def nodes_for(client: Client, user: User) -> dict[str, dict[str, Any]]:
    response = client.get("/api/v1/nodes", HTTP_AUTHORIZATION=f"Token {ApiToken.issue(user)}")
    assert response.status_code == 200, response.content
    return {n["name"]: n for n in response.json()["nodes"]}


def test_it_lists_only_the_users_own_job_ids(
    client: Client, bob: User, jobs: tuple[Job, Job]
) -> None:
    _, bobs = jobs
    nodes = nodes_for(client, bob)
    assert sorted(j for n in nodes.values() for j in n["jobs"]) == [bobs.pk]
    # What the nodes hold is a fact about the cluster: alice's core counts too.
    assert sum(n["used"]["cpu"] for n in nodes.values()) == 2
    assert sum(n["free"]["cpu"] for n in nodes.values()) == 14


def test_it_lists_every_job_id_to_staff(
    client: Client, charlie_admin: User, jobs: tuple[Job, Job]
) -> None:
    nodes = nodes_for(client, charlie_admin)
    assert sorted(j for n in nodes.values() for j in n["jobs"]) == sorted(j.pk for j in jobs)


def test_the_page_names_no_one_elses_job(client: Client, bob: User, jobs: tuple[Job, Job]) -> None:
    alices, bobs = jobs
    client.force_login(bob)
    r = client.get("/nodes/")
    assert r.status_code == 200
    html = r.content.decode()
    assert f'href="/jobs/{bobs.pk}/"' in html and "<th>Your jobs</th>" in html
    assert f'href="/jobs/{alices.pk}/"' not in html and f"#{alices.pk}<" not in html
    assert "alice" not in html  # neither her name nor her job's
    assert "2 / 8" in html or "1 / 8" in html  # her core is counted as used


def test_a_node_busy_with_others_jobs_is_not_called_idle(
    client: Client, alice: User, bob: User
) -> None:
    submit_job(alice, check_job_request(job_request(instances=1)))
    scheduling.schedule()
    client.force_login(bob)
    html = client.get("/nodes/").content.decode()
    assert "none of yours" in html and "1 / 8" in html


def test_the_page_lists_every_job_to_staff(
    client: Client, charlie_admin: User, jobs: tuple[Job, Job]
) -> None:
    client.force_login(charlie_admin)
    r = client.get("/nodes/")
    assert r.status_code == 200
    html = r.content.decode()
    assert all(f'href="/jobs/{j.pk}/"' in html for j in jobs) and "<th>Jobs</th>" in html
