"""Finding jobs: the job list page and GET /api/v1/jobs filter by state, user, name, image,
program and date, sort by submitted or duration, refuse bad values by parameter, show a
waiting job's place and reason, and cost the same queries for 1 job as for many."""

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from jobs.models import ApiToken, Job
from jobs.services.submission import check_job_request, submit_job
from tests.conftest import set_quota
from tests.unit.helpers import job_request

pytestmark = pytest.mark.usefixtures("catalog", "code_root", "nodes", "redis_url", "sent_tasks")


def make(user: User, name: str, state: str = Job.State.QUEUED, **fields: Any) -> Job:
    job = submit_job(user, check_job_request(job_request(instances=1, name=name)))
    Job.objects.filter(pk=job.pk).update(state=state, **fields)
    job.refresh_from_db()
    return job


def api_ids(client: Client, user: User, query: str) -> list[int]:
    auth = {"HTTP_AUTHORIZATION": f"Token {ApiToken.issue(user)}"}
    r = client.get(f"/api/v1/jobs?{query}", **auth)  # type: ignore[arg-type]
    assert r.status_code == 200, r.json()
    return [j["id"] for j in r.json()["jobs"]]


@pytest.fixture
def jobs(alice: User, bob: User) -> dict[str, Job]:
    set_quota(alice, cpu=100, memory_gb=1000, jobs=100)
    set_quota(bob, cpu=100, memory_gb=1000, jobs=100)
    now = timezone.now()
    return {
        "a-failed": make(
            alice,
            "resnet-lr-sweep",
            Job.State.FAILED,
            started=now - timedelta(minutes=5),
            finished=now - timedelta(minutes=4),
        ),
        "a-long": make(
            alice,
            "resnet-long",
            Job.State.SUCCEEDED,
            started=now - timedelta(hours=2),
            finished=now - timedelta(minutes=1),
        ),
        "b-failed": make(
            bob,
            "bert-tune",
            Job.State.FAILED,
            started=now - timedelta(minutes=9),
            finished=now - timedelta(minutes=8),
        ),
        "b-old": make(bob, "bert-old", Job.State.CANCELLED, created=now - timedelta(days=10)),
    }


def test_it_filters_by_state_and_name(client: Client, alice: User, jobs: dict[str, Job]) -> None:
    assert api_ids(client, alice, "state=failed") == [jobs["a-failed"].pk]
    assert api_ids(client, alice, "name=RESNET") == [jobs["a-long"].pk, jobs["a-failed"].pk]
    assert api_ids(client, alice, "state=failed,succeeded&name=long") == [jobs["a-long"].pk]


def test_staff_filter_by_user_and_users_see_only_theirs(
    client: Client, alice: User, charlie_admin: User, jobs: dict[str, Job]
) -> None:
    assert api_ids(client, charlie_admin, "user=bob&state=failed") == [jobs["b-failed"].pk]
    assert jobs["b-failed"].pk not in api_ids(client, alice, "name=bert")
    auth = {"HTTP_AUTHORIZATION": f"Token {ApiToken.issue(alice)}"}
    refused = client.get("/api/v1/jobs?user=bob", **auth)  # type: ignore[arg-type]
    assert refused.status_code == 400
    assert refused.json()["errors"] == {"user": ["Only administrators can list other users' jobs."]}


def test_it_filters_by_image_program_and_date(
    client: Client, charlie_admin: User, jobs: dict[str, Job]
) -> None:
    every = {j.pk for j in jobs.values()}
    assert set(api_ids(client, charlie_admin, "image=pytorch:2.13-cpu")) == every
    assert api_ids(client, charlie_admin, "program=no-such.py") == []
    assert set(api_ids(client, charlie_admin, "program=digits-ddp")) == every
    old = timezone.now() - timedelta(days=10)
    day = old.date().isoformat()
    assert api_ids(client, charlie_admin, f"since={day}&until={day}") == [jobs["b-old"].pk]
    assert jobs["b-old"].pk not in api_ids(client, charlie_admin, f"since={timezone.now().date()}")


def test_it_sorts_by_duration_and_submitted(
    client: Client, charlie_admin: User, jobs: dict[str, Job]
) -> None:
    longest = api_ids(client, charlie_admin, "sort=-duration")
    assert longest[:3] == [jobs["a-long"].pk, jobs["b-failed"].pk, jobs["a-failed"].pk]
    assert longest[-1] == jobs["b-old"].pk  # never started: last
    assert api_ids(client, charlie_admin, "sort=submitted")[0] == jobs["b-old"].pk


@pytest.mark.parametrize(
    ("query", "parameter"),
    [
        ("state=broken", "state"),
        ("since=yesterday", "since"),
        ("until=2026-13-01", "until"),
        ("sort=size", "sort"),
        ("name=" + "x" * 201, "name"),
    ],
)
def test_bad_filter_values_are_a_400_naming_the_parameter(
    client: Client, alice: User, query: str, parameter: str
) -> None:
    auth = {"HTTP_AUTHORIZATION": f"Token {ApiToken.issue(alice)}"}
    r = client.get(f"/api/v1/jobs?{query}", **auth)  # type: ignore[arg-type]
    assert r.status_code == 400
    assert list(r.json()["errors"]) == [parameter]
    client.force_login(alice)
    page = client.get(f"/?{query}")
    assert page.status_code == 400
    assert r.json()["errors"][parameter][0] in page.content.decode()


def test_the_page_keeps_the_filter_in_the_url_and_lists_matches(
    client: Client, charlie_admin: User, jobs: dict[str, Job]
) -> None:
    client.force_login(charlie_admin)
    html = client.get("/?state=failed&user=bob&name=bert").content.decode()
    assert f'data-job="{jobs["b-failed"].pk}"' in html
    assert f'data-job="{jobs["a-failed"].pk}"' not in html
    assert 'name="name" id="filter-name" value="bert"' in html
    assert '<option value="failed" selected>' in html
    assert "No job matches" in client.get("/?name=nothing-like-it").content.decode()


def test_a_waiting_job_shows_its_place_and_reason_in_the_list(client: Client, alice: User) -> None:
    set_quota(alice, cpu=1000, memory_gb=10_000, jobs=100)
    # The first fills both nodes (16 cores); the next two wait for it.
    for _ in range(3):
        waiting = submit_job(alice, check_job_request(job_request(instances=8, package="cpu-2")))
    waiting.refresh_from_db()
    assert waiting.state == Job.State.QUEUED and waiting.reason
    client.force_login(alice)
    html = client.get("/").content.decode()
    row = html[html.index(f'data-job="{waiting.pk}"') :]
    row = row[: row.index("</tr>")]
    page = client.get(f"/jobs/{waiting.pk}/").content.decode()
    position = page.split('id="queue-position"')[1].split("<span>")[1].split("</span>")[0]
    assert f"#{position} in the queue" in row
    assert waiting.reason.splitlines()[0][:60] in row


def test_the_page_costs_the_same_queries_for_1_job_as_for_20(client: Client, alice: User) -> None:
    set_quota(alice, cpu=1000, memory_gb=10_000, jobs=100)
    client.force_login(alice)

    def cost() -> int:
        with CaptureQueriesContext(connection) as queries:
            assert client.get("/?state=queued,failed&sort=-duration").status_code == 200
        return len(queries)

    make(alice, "one")
    cost()  # the first visit with a sort keeps it as the user's last used view: one write
    one = cost()
    for n in range(19):
        make(alice, f"more-{n}", Job.State.FAILED if n % 2 else Job.State.QUEUED)
    assert cost() == one
