"""The queue page, `GET /api/v1/queue` and their one order: every waiting job in the order the
scheduler takes them; another user's job without its name, id, owner or reason."""

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from jobs.models import ApiToken, Job, Replica
from jobs.services.submission import check_job_request, submit_job
from jobs.services.views import presenters, queue_listing
from tests.unit.helpers import SentTasks, job_request
from tests.unit.test_api_keys_declared import check

pytestmark = pytest.mark.usefixtures("catalog", "code_root", "redis_url", "nodes")

Capture = Callable[..., Any]


@pytest.fixture
def full_cluster(
    alice: User, bob: User, sent_tasks: SentTasks, django_capture_on_commit_callbacks: Capture
) -> list[Job]:
    """The nodes' 16 cores held by one of alice's jobs; then alice, bob, alice wait, in turn."""

    def submit(owner: User, instances: int, name: str) -> Job:
        with django_capture_on_commit_callbacks(execute=True):
            job = submit_job(owner, check_job_request(job_request(instances, "cpu-2", name=name)))
        job.refresh_from_db()
        return job

    running = submit(alice, 8, "fills-the-nodes")
    assert not running.replicas.filter(state=Replica.State.PENDING).exists()
    return [submit(alice, 1, "alice-first"), submit(bob, 1, "bobs-secret"),
            submit(alice, 2, "alice-second")]  # fmt: skip


def test_every_waiting_job_is_listed_in_order_and_others_jobs_say_nothing_of_theirs(
    full_cluster: list[Job], alice: User
) -> None:
    first, bobs, second = full_cluster
    entries = queue_listing.entries(alice)
    assert [e.position for e in entries] == [1, 2, 3]
    assert [e.job_id for e in entries] == [first.pk, None, second.pk]
    hidden = entries[1]
    assert (hidden.name, hidden.owner, hidden.reason) == (None, None, None)
    assert (hidden.cpu, hidden.submitted) == (bobs.cpu_total, bobs.created)
    assert entries[0].reason == Job.objects.get(pk=first.pk).reason != ""
    assert entries[2].cpu == 4


def test_an_administrator_sees_every_job_and_owner(
    full_cluster: list[Job], charlie_admin: User
) -> None:
    entries = queue_listing.entries(charlie_admin)
    assert [e.owner for e in entries] == ["alice", "bob", "alice"]
    assert entries[1].name == "bobs-secret"


def test_a_jobs_place_on_its_own_page_is_its_place_in_the_queue(
    full_cluster: list[Job], charlie_admin: User
) -> None:
    listed = {e.job_id: e.position for e in queue_listing.entries(charlie_admin)}
    assert listed == {job.pk: place for place, job in enumerate(full_cluster, 1)}
    for job in full_cluster:
        assert presenters.queue_position(job) == listed[job.pk]
    assert presenters.queue_positions(full_cluster) == listed


def test_the_api_and_the_page_show_the_same_queue_and_the_answer_is_documented(
    full_cluster: list[Job], alice: User
) -> None:
    first, bobs, second = full_cluster
    client = Client(headers={"Authorization": f"Token {ApiToken.issue(alice)}"})
    document = client.get("/api/v1/openapi.json").json()
    check(client, document, "get", "/api/v1/queue", "/api/v1/queue", 200)
    answer = client.get("/api/v1/queue").json()["jobs"]
    assert [e["job_id"] for e in answer] == [first.pk, None, second.pk]
    assert answer[1]["name"] is None and answer[1]["reason"] is None

    page = Client()
    page.force_login(alice)
    html = page.get("/queue/").content.decode()
    assert "another user's job" in html and "bobs-secret" not in html
    assert f'data-job="{first.pk}"' in html and f'data-job="{bobs.pk}"' not in html


def test_an_empty_queue_says_so(alice: User) -> None:
    page = Client()
    page.force_login(alice)
    assert "No job is waiting" in page.get("/queue/").content.decode()
    assert queue_listing.entries(alice) == []


def test_a_higher_class_is_listed_first_and_each_entry_names_its_class(
    full_cluster: list[Job],
    alice: User,
    sent_tasks: SentTasks,
    django_capture_on_commit_callbacks: Capture,
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        urgent = submit_job(
            alice, check_job_request(job_request(1, "cpu-2", name="urgent", priority="high"))
        )
    entries = queue_listing.entries(alice)
    assert (entries[0].job_id, entries[0].priority) == (urgent.pk, "high")
    assert [e.priority for e in entries[1:]] == ["normal"] * 3
