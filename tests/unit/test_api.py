"""HTTP API v1 through Django's test client; Celery messages are captured, not sent."""

import json
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from jobs.models import ApiToken, Job
from jobs.redis_client import get_redis
from jobs.services.submission import check_job_request, submit_job
from tests.conftest import set_quota
from tests.unit.helpers import append_lines, job_request
from workers.logsink import LogSink

pytestmark = pytest.mark.usefixtures("catalog", "code_root", "nodes", "redis_url", "sent_tasks")


def api(
    client: Client,
    method: str,
    path: str,
    token: str | None = None,
    body: Any = None,
    raw: bytes | None = None,
) -> Any:
    headers = {"HTTP_AUTHORIZATION": f"Token {token}"} if token else {}
    data = raw if raw is not None else (json.dumps(body) if body is not None else None)
    call = getattr(client, method)
    return call(path, data=data, content_type="application/json", **headers)


@pytest.fixture
def alice_token(alice: User) -> str:
    return ApiToken.issue(alice)


@pytest.fixture
def bobs_job(bob: User) -> Job:
    return submit_job(bob, check_job_request(job_request(instances=2)))


def test_it_requires_authentication(client: Client) -> None:
    r = api(client, "get", "/api/v1/jobs")
    assert r.status_code == 401
    assert "auth" in r.json()["errors"]


def test_it_refuses_a_wrong_token(client: Client) -> None:
    r = api(client, "get", "/api/v1/jobs", token="not-a-key")
    assert r.status_code == 401


def test_it_lists_the_catalog(client: Client, alice_token: str) -> None:
    r = api(client, "get", "/api/v1/catalog", token=alice_token)
    assert r.status_code == 200
    body = r.json()
    images = {i["name"]: i for i in body["images"]}
    assert images["pytorch:2.13-cpu"]["framework"] == "pytorch"
    assert images["pytorch:2.13-cpu"]["roles"] == ["master", "worker"]
    assert images["pytorch:2.13-cpu"]["kvstore_modes"] == []
    assert images["kvstore-ps:2.13"]["roles"] == ["scheduler", "server", "worker"]
    assert images["kvstore-ps:2.13"]["kvstore_modes"] == [
        "dist_sync",
        "dist_device_sync",
        "dist_async",
    ]
    assert {p["name"] for p in body["packages"]} >= {"cpu-1", "worker-p100x2"}
    assert [(e["name"], e["framework"]) for e in body["examples"]] == [
        ("digits-ddp", "pytorch"),
        ("digits-ps", "kvstore"),
        ("synthetic-ddp", "pytorch"),
    ]
    assert body["quota"]["left"]["cpu"] == 32


def test_it_creates_a_job(client: Client, alice_token: str) -> None:
    r = api(client, "post", "/api/v1/jobs", alice_token, job_request(instances=3))
    assert r.status_code == 201
    body = r.json()
    assert body["state"] == "queued"
    assert body["totals"] == {"cpu": 3, "gpus": 0, "memory_gb": 6, "price_per_hour": "0.1500"}
    assert [x["tag"] for x in body["replicas"]] == ["master", "worker-1", "worker-2"]
    assert Job.objects.get().owner.username == "alice"


def test_it_answers_bad_json_with_400(client: Client, alice_token: str) -> None:
    r = api(client, "post", "/api/v1/jobs", alice_token, raw=b"{not json")
    assert r.status_code == 400
    assert "not valid JSON" in r.json()["errors"]["request"][0]
    assert Job.objects.count() == 0


def test_it_refuses_a_10_mb_name_with_413(client: Client, alice_token: str) -> None:
    r = api(client, "post", "/api/v1/jobs", alice_token, job_request(name="x" * 10_000_000))
    assert r.status_code == 413
    assert Job.objects.count() == 0


def test_it_reports_quota_failures_per_resource(
    client: Client, alice: User, alice_token: str
) -> None:
    set_quota(alice, cpu=10)
    r = api(client, "post", "/api/v1/jobs", alice_token, job_request(instances=12))
    assert r.status_code == 400
    body = r.json()
    assert body["quota"]["cpu"] == {
        "requested": 12,
        "left": 10,
        "limit": 10,
        "over_by": 2,
        "scope": "you",
        "formula": "master 1×1 + worker 1×11 = 12",
    }
    assert "over by 2" in body["errors"]["quota"][0]
    assert body["fits_with"] == {"role": "worker", "instances": 9}
    assert Job.objects.count() == 0


def test_it_hides_other_users_jobs(client: Client, alice_token: str, bobs_job: Job) -> None:
    assert api(client, "get", "/api/v1/jobs", alice_token).json()["jobs"] == []
    for path in (f"/api/v1/jobs/{bobs_job.pk}", f"/api/v1/jobs/{bobs_job.pk}/logs"):
        r = api(client, "get", path, alice_token)
        assert r.status_code == 404
    r = api(client, "post", f"/api/v1/jobs/{bobs_job.pk}/cancel", alice_token)
    assert r.status_code == 404
    bobs_job.refresh_from_db()
    assert bobs_job.state == Job.State.QUEUED


def test_it_shows_admins_every_job(client: Client, charlie_admin: User, bobs_job: Job) -> None:
    token = ApiToken.issue(charlie_admin)
    jobs = api(client, "get", "/api/v1/jobs", token).json()["jobs"]
    assert [j["id"] for j in jobs] == [bobs_job.pk]


def test_it_cancels_and_refuses_a_second_cancel(client: Client, bob: User, bobs_job: Job) -> None:
    token = ApiToken.issue(bob)
    r = api(client, "post", f"/api/v1/jobs/{bobs_job.pk}/cancel", token)
    assert r.status_code == 200 and r.json()["state"] == "cancelled"
    r = api(client, "post", f"/api/v1/jobs/{bobs_job.pk}/cancel", token)
    assert r.status_code == 409


def test_it_needs_the_csrf_token_for_session_writes(alice: User) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    r = api(client, "post", "/api/v1/jobs", body=job_request())
    assert r.status_code == 403
    assert Job.objects.count() == 0


def test_it_pages_through_logs_filtered_by_instance(
    client: Client, bob: User, bobs_job: Job
) -> None:
    sink = LogSink(get_redis())
    append_lines(sink, bobs_job.pk, "master", 0, "node-1", [f"m{i}" for i in range(3)])
    append_lines(sink, bobs_job.pk, "worker", 1, "node-2", ["<b>w</b>"], "e", ts=2.0)
    append_lines(sink, bobs_job.pk, "master", 0, "node-1", ["m3"])
    token = ApiToken.issue(bob)
    base = f"/api/v1/jobs/{bobs_job.pk}/logs"
    page = api(client, "get", f"{base}?after=0&limit=2", token).json()
    assert [line["text"] for line in page["lines"]] == ["m0", "m1"]
    assert page["next"] == 2 and page["complete"] is False
    page = api(client, "get", f"{base}?after=2", token).json()
    assert [(x["cursor"], x["text"]) for x in page["lines"]] == [
        (3, "m2"),
        (4, "<b>w</b>"),
        (5, "m3"),
    ]
    worker = api(client, "get", f"{base}?role=worker&index=1", token).json()
    assert worker["lines"][0] == {
        "cursor": 4,
        "role": "worker",
        "index": 1,
        "attempt": 0,
        "node": "node-2",
        "stream": "stderr",
        "ts": 2.0,
        "text": "<b>w</b>",
    }
    assert api(client, "get", f"{base}?after=x", token).status_code == 400


def test_a_log_search_matches_what_a_line_shows_and_says_where(
    client: Client, bob: User, bobs_job: Job
) -> None:
    sink = LogSink(get_redis())
    lines = ["hidden NEEDLE 10%\r\x1b[2Kdone", "a \x1b[1mvisible\x1b[0m-needle\r", "Needle"]
    append_lines(sink, bobs_job.pk, "master", 0, "node-1", lines)
    token = ApiToken.issue(bob)
    base = f"/api/v1/jobs/{bobs_job.pk}/logs"
    found = api(client, "get", f"{base}?q=needle", token).json()["lines"]
    assert [line["cursor"] for line in found] == [2, 3]
    assert found[0]["text"] == lines[1]
    assert found[0]["shown"] == [["a ", ""], ["visible", "ansi-bold"], ["-needle", ""]]
    assert found[0]["hits"] == [[10, 16]]
    assert "shown" not in found[1] and found[1]["hits"] == [[0, 6]]
    assert api(client, "get", f"{base}?q=hidden", token).json()["lines"] == []
    # Without a search, a line says how it shows only when that is not its text.
    every = api(client, "get", f"{base}?after=0", token).json()["lines"]
    assert every[0]["shown"] == [["done", ""]]
    assert "shown" not in every[2] and "hits" not in every[2]
