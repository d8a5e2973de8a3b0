"""Paging the job list by cursor (jobs.services.views.job_pages): every job once, in the list's
order, forwards and back, in every sort (ties and jobs that never started included); bad
cursors refused by name; the count capped; the page's Older / Newer links."""

import re
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from jobs.models import ApiToken, Job
from jobs.services.submission import check_job_request, submit_job
from jobs.services.views import job_pages
from jobs.services.views.job_search import SORTS
from tests.conftest import set_quota
from tests.unit.helpers import job_request

pytestmark = pytest.mark.usefixtures("catalog", "code_root", "nodes", "redis_url", "sent_tasks")


@pytest.fixture
def history(alice: User) -> list[int]:
    """Nine finished jobs of alice's: three submitted at the same moment, two that ran equally
    long, two that never started."""
    set_quota(alice, cpu=100, memory_gb=1000, jobs=100)
    now = timezone.now().replace(microsecond=0)
    shapes: list[tuple[int, int | None]] = [  # (submitted minutes ago, ran minutes)
        (90, 5), (80, 30), (70, 30), (60, None), (50, 1), (50, 2), (50, None), (20, 60), (10, 3)
    ]  # fmt: skip
    ids = []
    for ago, ran in shapes:
        job = submit_job(alice, check_job_request(job_request(instances=1)))
        created = now - timedelta(minutes=ago)
        started = created + timedelta(seconds=1) if ran is not None else None
        finished = started + timedelta(minutes=ran) if started and ran is not None else None
        Job.objects.filter(pk=job.pk).update(
            state=Job.State.SUCCEEDED if ran is not None else Job.State.CANCELLED,
            created=created,
            started=started,
            finished=finished,
        )
        ids.append(job.pk)
    return ids


def get(client: Client, user: User, query: str) -> Any:
    auth = {"HTTP_AUTHORIZATION": f"Token {ApiToken.issue(user)}"}
    return client.get(f"/api/v1/jobs?{query}", **auth)  # type: ignore[arg-type]


def ids_of(answer: Any) -> list[int]:
    return [j["id"] for j in answer["jobs"]]


@pytest.mark.parametrize("sort", SORTS)
def test_following_next_then_previous_lists_every_job_once_in_order(
    client: Client, alice: User, history: list[int], sort: str
) -> None:
    whole = get(client, alice, f"sort={sort}").json()
    assert sorted(ids_of(whole)) == sorted(history)
    assert whole["next"] is None and whole["previous"] is None
    pages = [get(client, alice, f"sort={sort}&limit=2").json()]
    assert pages[0]["previous"] is None
    while pages[-1]["next"] is not None:
        pages.append(get(client, alice, f"sort={sort}&limit=2&cursor={pages[-1]['next']}").json())
    assert [i for page in pages for i in ids_of(page)] == ids_of(whole)
    assert [len(ids_of(page)) for page in pages] == [2, 2, 2, 2, 1]
    back = [pages[-1]]
    while back[-1]["previous"] is not None:
        back.append(get(client, alice, f"sort={sort}&limit=2&cursor={back[-1]['previous']}").json())
    assert [ids_of(page) for page in back] == [ids_of(page) for page in reversed(pages)]


def test_a_job_submitted_meanwhile_neither_repeats_nor_hides_a_row(
    client: Client, alice: User, history: list[int]
) -> None:
    first = get(client, alice, "limit=4").json()
    newer = submit_job(alice, check_job_request(job_request(instances=1)))
    rest = get(client, alice, f"limit=200&cursor={first['next']}").json()
    assert newer.pk not in ids_of(rest)
    assert sorted(ids_of(first) + ids_of(rest)) == sorted(history)


def test_a_bad_cursor_is_a_400_naming_it(client: Client, alice: User, history: list[int]) -> None:
    made_for_duration = get(client, alice, "sort=duration&limit=2").json()["next"]
    refusals = {
        "cursor=nonsense": "cursor is not one this list gave",
        "cursor=" + "W10" * 100: "cursor is not one this list gave",
        "cursor=WyItc3VibWl0dGVkIiwiYWZ0ZXIiLCJ4IiwxXQ": "cursor is not one this list gave",
        f"cursor={made_for_duration}": "cursor belongs to sort duration, not -submitted",
        f"cursor={made_for_duration}&offset=2": "Give a cursor or an offset, not both.",
    }
    for query, words in refusals.items():
        refused = get(client, alice, query)
        assert refused.status_code == 400, query
        [(field, [message])] = refused.json()["errors"].items()
        assert field in ("cursor", "offset") and words in message, (query, message)


def test_the_count_stops_at_the_cap(
    client: Client, alice: User, history: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert (
        get(client, alice, "").json()["count"],
        get(client, alice, "").json()["count_capped"],
    ) == (
        9,
        False,
    )
    monkeypatch.setattr(job_pages, "COUNT_CAP", 5)
    answer = get(client, alice, "limit=2").json()
    assert (answer["count"], answer["count_capped"], len(answer["jobs"])) == (5, True, 2)
    client.force_login(alice)
    page = client.get("/").content.decode()
    assert re.search(r'id="list-count">5\+ jobs<', page), page


def test_the_page_links_older_and_newer_pages_keeping_the_filter(
    client: Client, alice: User, history: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    from jobs import views

    monkeypatch.setattr(views, "LIST_PAGE", 4)
    client.force_login(alice)
    first = client.get("/?state=succeeded").content.decode()
    assert 'id="list-previous"' not in first
    older = re.search(r'<a href="\?([^"]+)" id="list-next" rel="next">Older →</a>', first)
    assert older is not None, first
    assert "state=succeeded" in older.group(1)
    second = client.get("/?" + older.group(1).replace("&amp;", "&")).content.decode()
    listed = [int(i) for i in re.findall(r'<tr data-job="(\d+)">', first + second)]
    succeeded = sorted(
        Job.objects.filter(pk__in=history, state=Job.State.SUCCEEDED),
        key=lambda j: (j.created, j.pk),
        reverse=True,
    )
    assert listed == [j.pk for j in succeeded]
    assert 'id="list-next"' not in second
    assert re.search(r'id="list-previous" rel="prev">← Newer</a>', second)
    refused = client.get("/?cursor=nonsense")
    assert refused.status_code == 400 and b"cursor is not one this list gave" in refused.content
