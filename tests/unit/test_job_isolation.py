"""Every endpoint that names a job answers another user's job exactly as a job that does not
exist: 404, with nothing of it in the body, and nothing changed. The endpoints are read from
the URL configuration, so one added later is covered without touching this test."""

import json
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver

from jobs.models import ApiToken, Job
from jobs.services.submission import check_job_request, submit_job
from tests.unit.helpers import job_request

pytestmark = pytest.mark.usefixtures("catalog", "code_root", "nodes", "redis_url", "sent_tasks")


def job_routes() -> list[str]:
    """The route of every URL pattern that takes a job id, e.g. 'api/v1/jobs/<int:job_id>'."""
    routes = [r for r in all_routes(get_resolver().url_patterns) if "<int:job_id>" in r]
    assert len(routes) >= 12, routes  # the API's job endpoints and the job pages
    return routes


@pytest.fixture
def bobs_job(bob: User) -> Job:
    return submit_job(bob, check_job_request(job_request(name="bob's secret run")))


def all_routes(patterns: list[Any], prefix: str = "") -> list[str]:
    """Every route, included ones (the API's) joined to their prefix."""
    routes: list[str] = []
    for p in patterns:
        if isinstance(p, URLPattern):
            routes.append(prefix + str(p.pattern))
        elif isinstance(p, URLResolver):
            routes += all_routes(p.url_patterns, prefix + str(p.pattern))
    return routes


def call(client: Client, method: str, path: str, token: str | None) -> Any:
    headers = {"Authorization": f"Token {token}"} if token else {}
    if method == "get":
        return client.get(path, headers=headers)
    # A body each operation takes, so that the answer is about the job, not the body.
    body = json.dumps({"keep": False} if path.endswith("/retention") else {"baseline": None})
    return client.post(path, data=body, content_type="application/json", headers=headers)


@pytest.mark.parametrize("route", job_routes())
@pytest.mark.parametrize("method", ["get", "post"])
def test_another_users_job_is_a_404_on_every_endpoint(
    client: Client, alice: User, bobs_job: Job, route: str, method: str
) -> None:
    path = "/" + route.replace("<int:job_id>", str(bobs_job.pk))
    missing = "/" + route.replace("<int:job_id>", str(bobs_job.pk + 1000))
    as_page = not route.startswith("api/")
    token = None if as_page else ApiToken.issue(alice)
    if as_page:
        client.force_login(alice)
    before = Job.objects.values().get(pk=bobs_job.pk)

    theirs = call(client, method, path, token)
    nobodys = call(client, method, missing, token)

    if theirs.status_code == 405:  # a method the endpoint never takes: no job looked up
        assert nobodys.status_code == 405
        return
    assert theirs.status_code == 404, (path, method, theirs.status_code)
    assert nobodys.status_code == 404
    assert b"secret" not in theirs.content
    if not as_page:
        assert theirs.json() == nobodys.json()  # the same answer: no way to tell it exists
    assert Job.objects.values().get(pk=bobs_job.pk) == before
