"""Bad input gets a clear 4xx and changes nothing, never a 500: every field of a valid request,
at every depth, replaced by a value of every JSON type (or left out), plus bodies too large or
nested too deep. The four 500s a probe once found (a package given as a list or an object, and a
5,000-deep body) are among the cases."""

import json
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from jobs.models import ApiToken, Job, Node
from tests.json_documents import paths, removed, replaced
from tests.unit.helpers import job_request

pytestmark = pytest.mark.usefixtures("catalog", "code_root", "nodes", "redis_url", "sent_tasks")

# One value of each JSON type, and the shapes that once broke a dict lookup.
WRONG_VALUES: list[Any] = [
    None,
    True,
    0,
    -1,
    10**30,
    1.5,
    "",
    "x" * 300,
    [],
    ["cpu-1"],
    {},
    {"a": 1},
]


def kvstore_request() -> dict[str, Any]:
    return {
        "name": "ps",
        "image": "kvstore-ps:2.13",
        "program": {"script": "digits-ps", "args": []},
        "kvstore": "dist_sync",
        "roles": {
            "server": {"package": "server-2c12g", "instances": 1},
            "worker": {"package": "cpu-1", "instances": 2},
        },
        "restart": {"policy": "on-failure", "max_restarts": 1, "backoff_seconds": 0},
        "health_rules": [],
        "metrics": [{"name": "loss", "regex": "loss=(?P<value>[0-9.]+)"}],
    }


VALID = [job_request(), kvstore_request()]
MUTANTS = [
    (f"{i}:{'.'.join(map(str, path))}={value!r}"[:120], replaced(doc, path, value))
    for i, doc in enumerate(VALID)
    for path in paths(doc)
    for value in WRONG_VALUES
] + [
    (f"{i}:{'.'.join(map(str, path))} left out", removed(doc, path))
    for i, doc in enumerate(VALID)
    for path in paths(doc)
]


@pytest.fixture
def token(alice: User) -> str:
    return ApiToken.issue(alice)


def post(client: Client, path: str, token: str, raw: bytes) -> Any:
    return client.post(
        path, data=raw, content_type="application/json", HTTP_AUTHORIZATION=f"Token {token}"
    )


def assert_clear_refusal_or_success(response: Any) -> None:
    assert response.status_code < 500, response.content[:500]
    body = response.json()
    if response.status_code >= 400:
        errors = body["errors"]
        assert errors and all(
            isinstance(field, str)
            and isinstance(messages, list)
            and messages
            and all(isinstance(m, str) and m for m in messages)
            for field, messages in errors.items()
        ), body


def test_the_valid_requests_are_accepted(client: Client, token: str) -> None:
    for request in VALID:
        response = post(client, "/api/v1/jobs", token, json.dumps(request).encode())
        assert response.status_code == 201, response.content


def test_every_malformed_submission_gets_a_clear_4xx_and_creates_nothing(
    client: Client, token: str
) -> None:
    """Several hundred bodies in one test: one test each would cost a database each."""
    outcomes: dict[int, int] = {}
    failures: list[str] = []
    for label, body in MUTANTS:
        before = Job.objects.count()
        try:
            response = post(client, "/api/v1/jobs", token, json.dumps(body).encode())
            assert_clear_refusal_or_success(response)
        except Exception as failure:  # every case is reported, not only the first
            failures.append(f"{label}: {type(failure).__name__}: {str(failure)[:200]}")
            continue
        created = Job.objects.count() - before
        assert created == (1 if response.status_code == 201 else 0), label
        if created:
            # Accepted: something harmless (an unknown extra, a name of another length).
            Job.objects.filter(pk=response.json()["id"]).update(state=Job.State.CANCELLED)
        outcomes[response.status_code] = outcomes.get(response.status_code, 0) + 1
    assert failures == []
    assert outcomes.get(400, 0) > len(MUTANTS) // 2, outcomes
    print(f"\n{len(MUTANTS)} malformed submissions: {outcomes}")


@pytest.mark.parametrize(
    "package", [["cpu-1"], {"name": "cpu-1"}], ids=["package-as-list", "package-as-object"]
)
def test_a_package_given_as_a_list_or_an_object_is_refused_by_name(
    client: Client, token: str, package: Any
) -> None:
    body = job_request(package=package)
    response = post(client, "/api/v1/jobs", token, json.dumps(body).encode())
    assert response.status_code == 400
    assert response.json()["errors"]["roles.master.package"] == [
        'Give the package\'s name, e.g. "cpu-1".'
    ]
    assert Job.objects.count() == 0


@pytest.mark.parametrize("depth", [64, 5_000, 100_000])
def test_a_deeply_nested_body_is_refused_with_400(client: Client, token: str, depth: int) -> None:
    raw = b'{"name": ' + b"[" * depth + b"]" * depth + b"}"
    response = post(client, "/api/v1/jobs", token, raw)
    assert response.status_code == 400
    assert response.json()["errors"]["request"] == [
        "The body is nested too deeply (more than 32 levels)."
    ]
    assert Job.objects.count() == 0


def test_a_body_over_the_size_limit_is_refused_with_413(
    client: Client, token: str, settings: Any
) -> None:
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 10_000
    body = job_request(name="x" * 20_000)
    response = post(client, "/api/v1/jobs", token, json.dumps(body).encode())
    assert response.status_code == 413
    assert response.json()["errors"]["request"] == [
        "The body is larger than 10,000 bytes; send less."
    ]
    assert Job.objects.count() == 0


@pytest.mark.parametrize(
    "raw",
    [b"", b"null", b"[]", b'"x"', b"1", b"{", b"\xff\xfe", b'{"evict": "yes"}',
     b'{"evict": true, "grace_seconds": -5}', b'{"evict": true, "grace_seconds": [1]}',
     b'{"evict": true, "grace_seconds": 1e400}'],
)  # fmt: skip
def test_a_malformed_drain_is_refused_and_leaves_the_node_ready(
    client: Client, charlie_admin: User, raw: bytes
) -> None:
    response = post(client, "/api/v1/nodes/node-1/drain", ApiToken.issue(charlie_admin), raw)
    if raw in (b"", b"null"):
        # No body is the documented "drain only".
        assert response.status_code == 200
        assert Node.objects.get(name="node-1").state == Node.State.DRAINING
        return
    assert response.status_code == 400, response.content
    assert_clear_refusal_or_success(response)
    assert Node.objects.get(name="node-1").state == Node.State.READY


@pytest.mark.parametrize(
    "query",
    ["after=x", "after=-1", "after=1e3", f"after={10**40}", "limit=0", "limit=-5",
     f"limit={10**40}", "role=%00", "stream=neither", "index=x", "tail=x"],
)  # fmt: skip
def test_malformed_log_queries_are_refused_or_served_never_a_500(
    client: Client, token: str, query: str
) -> None:
    job = post(client, "/api/v1/jobs", token, json.dumps(job_request()).encode()).json()
    response = client.get(
        f"/api/v1/jobs/{job['id']}/logs?{query}", HTTP_AUTHORIZATION=f"Token {token}"
    )
    assert_clear_refusal_or_success(response)


@pytest.mark.parametrize(
    "raw", [b"null", b"[]", b'{"baseline": "x"}', b'{"baseline": [1]}', b'{"baseline": 1e400}',
            b'{"baseline": 99999999999999999999999}', b'{"baseline": true}'],
)  # fmt: skip
def test_a_malformed_baseline_is_refused(client: Client, token: str, raw: bytes) -> None:
    job = post(client, "/api/v1/jobs", token, json.dumps(job_request()).encode()).json()
    response = post(client, f"/api/v1/jobs/{job['id']}/baseline", token, raw)
    assert response.status_code == 400, response.content
    assert_clear_refusal_or_success(response)
    assert Job.objects.get(pk=job["id"]).baseline_id is None
