"""The admins' Storage page (/storage/): storage per user and per job from jobs.services.storage,
when each job's log and metrics go, and what a prune now would remove (retention.plan, the list
of `manage.py prune --dry-run`). Staff only."""

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from jobs import logstream, views
from jobs.models import Job, LogChunk, MetricPoint
from jobs.services import retention
from jobs.services.submission import check_job_request, submit_job
from tests.unit.helpers import job_request

pytestmark = pytest.mark.usefixtures("catalog", "nodes", "redis_url", "sent_tasks")

PAGE = "/storage/"
DAY = timedelta(days=1)


@pytest.fixture(autouse=True)
def default_days(settings: Any) -> None:
    settings.TRAINYARD_LOG_RETENTION_DAYS = 90


@pytest.fixture
def admin(client: Client, charlie_admin: User) -> Client:
    client.force_login(charlie_admin)
    return client


def job_with_log(owner: User, text: str, points: int, **fields: Any) -> Job:
    """A submitted job with one log chunk of `text` and `points` metric points, its row
    updated with `fields` (state, finished, keep...)."""
    job = submit_job(owner, check_job_request(job_request(instances=2)))
    LogChunk.objects.create(job=job, first_cursor=1, last_cursor=1, role="master", text=text)
    for n in range(points):
        MetricPoint.objects.create(
            job=job, cursor=100 + n, role="master", index=0, name="loss", value=0.5, ts=1.0
        )
    Job.objects.filter(pk=job.pk).update(**fields)
    job.refresh_from_db()
    return job


def ended(owner: User, text: str, points: int, at: datetime, **fields: Any) -> Job:
    return job_with_log(
        owner, text, points, state=Job.State.SUCCEEDED, finished=at, log_complete=True, **fields
    )


def shown(moment: datetime) -> str:
    """How the page writes a moment (the local_time tag: UTC, turned local by its script)."""
    return f"{moment.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"


def table(page: str, table_id: str) -> str:
    match = re.search(rf'<table [^>]*id="{table_id}">(.*?)</table>', page, re.DOTALL)
    assert match, f"no table {table_id}"
    return match.group(1)


def row(page: str, table_id: str, attribute: str, value: object) -> str:
    match = re.search(rf'<tr {attribute}="{value}">(.*?)</tr>', table(page, table_id), re.DOTALL)
    assert match, f"no row {attribute}={value} in {table_id}"
    return match.group(1)


def figure(row_html: str, name: str) -> str:
    match = re.search(rf'data-figure="{name}">(.*?)</td>', row_html, re.DOTALL)
    assert match, f"no figure {name}"
    return match.group(1).strip()


def test_it_sends_anonymous_users_to_log_in(client: Client) -> None:
    response = client.get(PAGE)
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")


def test_it_refuses_an_ordinary_user_and_hides_the_link(client: Client, alice: User) -> None:
    client.force_login(alice)
    assert client.get(PAGE).status_code == 403
    assert 'href="/storage/"' not in client.get("/").content.decode()


def test_it_shows_storage_per_user_and_per_job_and_when_it_goes(
    admin: Client, alice: User, bob: User
) -> None:
    now = timezone.now()
    big = ended(alice, "x" * 1500, 3, now - DAY)
    kept = ended(alice, "loss 0.5", 2, now - DAY, keep=True)
    running = job_with_log(bob, "step 1", 1, state=Job.State.RUNNING, started=now)
    gone = ended(bob, "old", 1, now - 100 * DAY)
    retention.prune()

    response = admin.get(PAGE)
    assert response.status_code == 200
    page = response.content.decode()
    assert 'href="/storage/"' in page  # in the navigation, for staff

    alices = row(page, "storage-users", "data-user", "alice")
    assert (figure(alices, "jobs"), figure(alices, "log"), figure(alices, "points")) == (
        "2",
        "1,508",
        "5",
    )
    bobs = row(page, "storage-users", "data-user", "bob")  # the pruned job holds nothing
    assert (figure(bobs, "jobs"), figure(bobs, "log"), figure(bobs, "points")) == ("1", "6", "1")

    order = re.findall(r'<tr data-job="(\d+)">', table(page, "storage-jobs"))
    assert order == [str(j.pk) for j in (big, kept, running, gone)]  # the largest log first
    first = row(page, "storage-jobs", "data-job", big.pk)
    assert f'href="/jobs/{big.pk}/"' in first and "alice" in first
    assert (figure(first, "log"), figure(first, "points")) == ("1,500", "3")
    assert figure(first, "goes").endswith(f">{shown(now - DAY + 90 * DAY)}</time>")
    assert figure(row(page, "storage-jobs", "data-job", kept.pk), "goes") == "never"
    assert "—" in figure(row(page, "storage-jobs", "data-job", running.pk), "goes")
    gone.refresh_from_db()
    assert gone.logs_pruned is not None
    removed = figure(row(page, "storage-jobs", "data-job", gone.pk), "goes")
    assert removed.startswith("removed <time") and shown(gone.logs_pruned) in removed

    assert "<strong>90 days</strong>" in page and "TRAINYARD_LOG_RETENTION_DAYS" in page
    assert "Nothing: no ended job" in page  # the prune above left nothing to remove


def test_it_lists_what_a_prune_now_would_remove(admin: Client, alice: User) -> None:
    now = timezone.now()
    due = ended(alice, "loss 0.5", 2, now - 100 * DAY)
    ended(alice, "loss 0.5", 2, now - DAY)  # not yet

    page = admin.get(PAGE).content.decode()
    assert [item.job_id for item in retention.plan().logs] == [due.pk]
    assert re.findall(r'<tr data-job="(\d+)">', table(page, "prune-logs")) == [str(due.pk)]
    listed = row(page, "prune-logs", "data-job", due.pk)
    assert f'href="/jobs/{due.pk}/"' in listed and shown(now - 100 * DAY + 90 * DAY) in listed
    assert "The logs and metrics of 1 job and 0 code snapshots" in page
    goes = figure(row(page, "storage-jobs", "data-job", due.pk), "goes")
    assert "due: the next prune removes them" in goes
    assert LogChunk.objects.filter(job=due).exists()  # showing it removes nothing


def test_it_caps_the_jobs_with_a_line_saying_how_many_more(
    admin: Client, alice: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(views, "STORAGE_JOBS_SHOWN", 2)
    now = timezone.now()
    for size in (10, 30, 20):
        ended(alice, "x" * size, 0, now - DAY)
    page = admin.get(PAGE).content.decode()
    assert len(re.findall(r"<tr data-job=", table(page, "storage-jobs"))) == 2
    assert "1 more job, each holding no more" in page
    # The per-user figures still count every job.
    assert figure(row(page, "storage-users", "data-user", "alice"), "log") == "60"


def test_metric_points_kept_beside_the_log_are_not_counted_as_its_characters(
    admin: Client, alice: User
) -> None:
    """Batches of metric points are LogChunks too (stream "metric", JSON a point a line): the
    page counted their JSON as the log's characters, 29,029 for a 2,754-character log."""
    job = ended(alice, "x" * 40, 1, timezone.now() - DAY)
    LogChunk.objects.create(
        job=job, first_cursor=2, last_cursor=2, role="master", stream=logstream.METRIC,
        text='{"name": "loss", "value": 0.5, "step": 1}' * 10,
    )  # fmt: skip
    page = admin.get(PAGE).content.decode()
    assert figure(row(page, "storage-jobs", "data-job", job.pk), "log") == "40"
    assert figure(row(page, "storage-users", "data-user", "alice"), "log") == "40"
    Job.objects.filter(pk=job.pk).update(finished=timezone.now() - 100 * DAY)
    (expired,) = retention.plan().logs
    assert expired.log_characters == 40


def test_a_refused_page_is_one_line_in_the_log_without_a_traceback(
    client: Client, alice: User, caplog: pytest.LogCaptureFixture
) -> None:
    client.force_login(alice)
    with caplog.at_level("WARNING", logger="django.request"):
        assert client.get(PAGE).status_code == 403
    (refused,) = [r for r in caplog.records if r.name == "django.request"]
    assert refused.getMessage() == f"Forbidden (Permission denied): {PAGE}"
    assert refused.exc_info is None
