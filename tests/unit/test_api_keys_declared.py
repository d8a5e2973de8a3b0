"""Every key the API sends is in its OpenAPI document: real answers of the real views (a job
that restarted after a health rule warned, with log lines and metric points) are walked, nested
objects and arrays through their $refs, against GET /api/v1/openapi.json."""

import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from jobs.healthrules import Watch, parse_rules
from jobs.models import ApiToken, Job
from jobs.redis_client import get_redis
from jobs.services import health
from jobs.services.lifecycle import reports
from jobs.services.submission import check_job_request, submit_job
from tests.conftest import set_quota
from tests.unit.helpers import append_lines, job_request
from workers import contract
from workers.logsink import LogSink

pytestmark = pytest.mark.usefixtures("catalog", "code_root", "nodes", "redis_url", "sent_tasks")

Json = Any


def undeclared(value: Json, schema: Json, document: Json, where: str = "$") -> Iterator[str]:
    """The paths in `value` of keys that `schema` (or the schemas it refers to) does not
    declare. A union is satisfied by any one of its alternatives."""
    while "$ref" in schema:
        schema = document["components"]["schemas"][schema["$ref"].rsplit("/", 1)[-1]]
    alternatives = schema.get("anyOf") or schema.get("oneOf")
    if alternatives:
        found = [list(undeclared(value, alt, document, where)) for alt in alternatives]
        yield from min(found, key=len)
        return
    for part in schema.get("allOf", []):
        yield from undeclared(value, part, document, where)
    if isinstance(value, dict):
        # A schema with properties declares its keys (an `additionalProperties: true` beside
        # them declares nothing); one without is a map, whose values its
        # additionalProperties describes, if anything does.
        properties = schema.get("properties")
        rest = schema.get("additionalProperties", properties is None)
        for key, item in value.items():
            if properties and key in properties:
                yield from undeclared(item, properties[key], document, f"{where}.{key}")
            elif isinstance(rest, dict):
                yield from undeclared(item, rest, document, f"{where}[{key!r}]")
            elif properties is not None or rest is False:
                yield f"{where}.{key}"
    elif isinstance(value, list):
        for k, item in enumerate(value):
            yield from undeclared(item, schema.get("items", {}), document, f"{where}[{k}]")


def answer_schema(document: Json, path: str, method: str = "get", status: int = 200) -> Json:
    answer = document["paths"][path][method]["responses"]
    return answer[str(status)]["content"]["application/json"]["schema"]


def check(client: Client, document: Json, method: str, url: str, path: str, status: int,
          body: Json = None) -> None:  # fmt: skip
    """Call `url` for real and walk its answer against the document's for `path`."""
    if method == "get":
        response = client.get(url)
    else:
        response = client.post(url, body, content_type="application/json")
    assert response.status_code == status, (url, response.content)
    missing = list(undeclared(response.json(), answer_schema(document, path, method, status),
                              document))  # fmt: skip
    assert not missing, f"{method} {url} sends keys its schema does not declare: {missing}"


def a_job_with_a_history(user: User, django_capture_on_commit_callbacks: Any) -> Job:
    """A job in its second attempt: a warning of a health rule, a failed instance, log lines
    (a later attempt's too) and metric points."""
    request = job_request(instances=2)
    request["restart"] = {"policy": "on-failure", "max_restarts": 2, "backoff_seconds": 0}
    request["health_rules"] = [{"kind": "log-pattern", "pattern": "slow", "action": "warn"}]
    with django_capture_on_commit_callbacks(execute=True):
        job = submit_job(user, check_job_request(request))
    replicas = list(job.replicas.select_related("node"))
    for r in replicas:
        assert r.node is not None
        with django_capture_on_commit_callbacks(execute=True):
            reports.replica_started(job.pk, r.role, r.index, r.node.name, "a", attempt=0)
    (rule,) = parse_rules(request["health_rules"])
    (firing,) = Watch([rule], started_at=0.0).line("worker", 1, "slow", "stderr", 1.0)
    health.fired(job.pk, 0, firing)
    sink = LogSink(get_redis())
    append_lines(sink, job.pk, "master", 0, "node-1", ["<b>epoch 1</b>", "epoch 2"])
    points: list[dict[str, Any]] = [
        {"name": "loss", "value": 0.5, "step": 1},
        {"name": "loss", "value": None, "nonfinite": "nan", "step": 2},
        {"name": "eval_accuracy", "value": 0.9, "epoch": 1.0},
    ]
    lines = [json.dumps({"ts": 100.0, **p}) for p in points]
    append_lines(sink, job.pk, "master", 0, "node-1", lines, contract.STREAM_METRIC)
    worker = next(r for r in replicas if r.role == "worker")
    assert worker.node is not None
    with django_capture_on_commit_callbacks(execute=True):
        reports.replica_exited(
            job.pk, "worker", worker.index, worker.node.name, "failed", 1, "exited", ["boom"],
            attempt=0,
        )  # fmt: skip
    job.refresh_from_db()
    assert job.state == Job.State.RESTARTING and job.attempts.count() == 2
    return job


def test_every_key_of_a_real_answer_is_in_the_openapi_document(
    alice: User, charlie_admin: User, django_capture_on_commit_callbacks: Any
) -> None:
    job = a_job_with_a_history(alice, django_capture_on_commit_callbacks)
    calls = {
        f"/api/v1/jobs/{job.pk}/logs?after=0": "/api/v1/jobs/{job_id}/logs",
        f"/api/v1/jobs/{job.pk}/logs?before=3": "/api/v1/jobs/{job_id}/logs",
        f"/api/v1/jobs/{job.pk}/logs/counts": "/api/v1/jobs/{job_id}/logs/counts",
        f"/api/v1/jobs/{job.pk}/metrics?after=0": "/api/v1/jobs/{job_id}/metrics",
        f"/api/v1/jobs/{job.pk}/metrics/summary": "/api/v1/jobs/{job_id}/metrics/summary",
        f"/api/v1/jobs/{job.pk}": "/api/v1/jobs/{job_id}",
        f"/api/v1/jobs/{job.pk}/request": "/api/v1/jobs/{job_id}/request",
        "/api/v1/jobs": "/api/v1/jobs",
        "/api/v1/catalog": "/api/v1/catalog",
        "/api/v1/me": "/api/v1/me",
        "/api/v1/nodes": "/api/v1/nodes",
        "/api/v1/queue": "/api/v1/queue",
        "/api/v1/snapshots": "/api/v1/snapshots",
    }
    for user in (alice, charlie_admin):  # an administrator's answers say more (nodes, users)
        client = Client(headers={"Authorization": f"Token {ApiToken.issue(user)}"})
        document = client.get("/api/v1/openapi.json").json()
        for url, path in calls.items():
            check(client, document, "get", url, path, 200)


def test_every_key_of_a_real_write_or_refusal_is_in_the_openapi_document(
    alice: User, charlie_admin: User, django_capture_on_commit_callbacks: Any
) -> None:
    job = a_job_with_a_history(alice, django_capture_on_commit_callbacks)
    other = submit_job(alice, check_job_request(job_request(instances=2)))
    client = Client(headers={"Authorization": f"Token {ApiToken.issue(alice)}"})
    document = client.get("/api/v1/openapi.json").json()
    set_quota(alice, cpu=1)
    check(client, document, "post", "/api/v1/jobs", "/api/v1/jobs", 400, job_request(instances=3))
    check(client, document, "post", f"/api/v1/jobs/{job.pk}/retention",
          "/api/v1/jobs/{job_id}/retention", 200, {"keep": True})  # fmt: skip
    check(client, document, "post", f"/api/v1/jobs/{other.pk}/baseline",
          "/api/v1/jobs/{job_id}/baseline", 200, {"baseline": job.pk})  # fmt: skip
    check(client, document, "post", f"/api/v1/jobs/{other.pk}/cancel",
          "/api/v1/jobs/{job_id}/cancel", 200)  # fmt: skip
    check(client, document, "get", f"/api/v1/compare?jobs={job.pk},{other.pk}", "/api/v1/compare",
          200)  # fmt: skip
    admin = Client(headers={"Authorization": f"Token {ApiToken.issue(charlie_admin)}"})
    check(admin, document, "post", "/api/v1/nodes/node-1/drain", "/api/v1/nodes/{name}/drain",
          200, {"evict": True, "grace_seconds": 5})  # fmt: skip
    check(admin, document, "post", "/api/v1/nodes/node-1/ready", "/api/v1/nodes/{name}/ready",
          200)  # fmt: skip


def test_the_walk_finds_an_undeclared_key_however_deep(alice: User) -> None:
    """The check itself: a key the document lacks is found in a nested object of a list."""
    client = Client(headers={"Authorization": f"Token {ApiToken.issue(alice)}"})
    document = client.get("/api/v1/openapi.json").json()
    schema = answer_schema(document, "/api/v1/jobs/{job_id}/logs")
    line = {"cursor": 1, "role": "master", "index": 0, "attempt": 0, "node": "node-1",
            "stream": "stdout", "ts": 1.0, "text": "x"}  # fmt: skip
    page = {"lines": [line], "next": 1, "complete": False}
    assert list(undeclared(page, schema, document)) == []
    page["lines"] = [line, {**line, "colour": "red"}]
    assert list(undeclared(page, schema, document)) == ["$.lines[1].colour"]
    assert list(undeclared({**page, "more": 1}, schema, document)) == [
        "$.lines[1].colour",
        "$.more",
    ]
