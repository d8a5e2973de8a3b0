"""The console speaks its users' language: no internal references on any page or in the API's
reference, prices in the configured currency, times and durations on the job pages."""

import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from jobs.models import Job
from jobs.services.submission import check_job_request, submit_job
from tests.unit.helpers import job_request

pytestmark = pytest.mark.usefixtures("catalog", "code_root", "nodes", "redis_url", "sent_tasks")

T0 = datetime(2025, 3, 7, 14, 5, 9, tzinfo=UTC)


def visible_words(html: str) -> str:
    """The page less its scripts' data and the examples' own --seed option, which is theirs."""
    html = re.sub(r"<script\b.*?</script>", "", html, flags=re.DOTALL)
    return html.replace("--seed", "--(option)")


def finished_job(owner: User, seconds: float = 192.4) -> Job:
    job = submit_job(owner, check_job_request(job_request(instances=2)))
    Job.objects.filter(pk=job.pk).update(
        state=Job.State.SUCCEEDED, started=T0, finished=T0 + timedelta(seconds=seconds)
    )
    job.refresh_from_db()
    return job


# The design documents call their sources "seed 000", "seed 004": never words for users. (A
# searcher's random seed, on the New job form's Search…, is a word of theirs.)
DESIGN_DOCUMENTS = re.compile(r"seed \d|seeds/|seed's|\bseed (?:article|document)", re.IGNORECASE)


def test_no_page_names_the_design_documents(client: Client, alice: User) -> None:
    job = finished_job(alice)
    client.force_login(alice)
    for path in ("/", "/jobs/new/", f"/jobs/{job.pk}/", "/nodes/", "/quotas/", "/experiments/"):
        page = visible_words(client.get(path).content.decode())
        assert not DESIGN_DOCUMENTS.search(page), path


def test_the_api_reference_names_no_design_document(client: Client, alice: User) -> None:
    client.force_login(alice)
    schema = client.get("/api/v1/openapi.json").content.decode()
    assert not DESIGN_DOCUMENTS.search(schema)


def test_prices_are_in_the_configured_currency(client: Client, alice: User, settings: Any) -> None:
    settings.TRAINYARD_CURRENCY = "EUR"
    job = finished_job(alice)
    client.force_login(alice)
    form = client.get("/jobs/new/").content.decode()
    assert "cpu-1 — 1 core, 2 GB · €0.05/h" in form
    assert '"money": {"code": "EUR", "symbol": "\\u20ac", "prefix": "\\u20ac"}' in form  # JSON
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert "4 GB, €0.10 per hour" in page
    assert "Samples per €</span>" in page and "at €0.10 per hour" in page
    catalog = client.get("/api/v1/catalog").json()
    assert catalog["currency"] == "EUR"
    assert catalog["packages"][0]["price_per_hour"] == "0.0500"  # the API keeps numbers


def test_the_job_page_shows_when_it_started_and_ended_and_how_long_it_ran(
    client: Client, alice: User
) -> None:
    job = finished_job(alice, seconds=192.4)
    client.force_login(alice)
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert (
        '<time class="local-time" datetime="2025-03-07T14:05:09+00:00" id="job-started">'
        "2025-03-07 14:05:09 UTC</time>"
    ) in page
    assert 'id="job-finished">2025-03-07 14:08:21 UTC</time>' in page
    assert 'id="job-duration" data-started=' in page and ">3 min 12 s</span>" in page


def test_a_queued_job_has_no_start_and_no_duration_yet(client: Client, alice: User) -> None:
    job = submit_job(alice, check_job_request(job_request(instances=2)))
    client.force_login(alice)
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert '<time class="local-time" id="job-started">—</time>' in page
    duration = re.search(r'<span class="duration" id="job-duration"([^>]*)>—</span>', page)
    assert duration is not None
    # Once the page hears that the job started, it counts on from the server's clock.
    assert 'data-now="' in duration[1] and 'data-prefix="running for "' in duration[1]
    assert "data-started" not in duration[1]
    listed = client.get("/").content.decode()
    assert re.search(r'<td class="num"><span class="duration"[^>]*>—</span></td>', listed)


def test_the_job_list_has_a_duration_column(client: Client, alice: User) -> None:
    job = finished_job(alice, seconds=65)
    client.force_login(alice)
    html = client.get("/").content.decode()
    assert "<th>Submitted</th><th>Duration</th>" in html
    row = html[html.index(f'<tr data-job="{job.pk}">') :]
    assert 'data-seconds="65.000">1 min 05 s</span>' in row[: row.index("</tr>")]


def test_the_rules_block_carries_the_currency(client: Client, alice: User) -> None:
    client.force_login(alice)
    html = client.get("/").content.decode()
    rules = json.loads(
        re.search(r'<script id="trainyard-rules" type="application/json">(.*?)</script>', html)[1]  # type: ignore[index]
    )
    assert rules["money"] == {"code": "USD", "symbol": "$", "prefix": "$"}
