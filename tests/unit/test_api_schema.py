"""API v1 on django-ninja: the OpenAPI document, its docs page (served with no internet), the
job list's pages, what a list costs in queries, and schema errors in words."""

import json
import re
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from openapi_spec_validator import validate

from jobs.api import catalog_for, job_as_dict
from jobs.models import ApiToken, FrameworkImage, HealthEvent, Job
from jobs.services.submission import check_job_request, submit_job
from tests.conftest import set_quota
from tests.unit.helpers import job_request

pytestmark = pytest.mark.usefixtures("catalog", "code_root", "nodes", "redis_url", "sent_tasks")

# Every API path of console/urls.py before the move to ninja, with the methods each took:
# the contract that existing clients rely on.
API_V1 = {
    "/api/v1/catalog": {"get"},
    "/api/v1/nodes": {"get"},
    "/api/v1/nodes/{name}/drain": {"post"},
    "/api/v1/nodes/{name}/ready": {"post"},
    "/api/v1/jobs": {"get", "post"},
    "/api/v1/jobs/{job_id}": {"get"},
    "/api/v1/jobs/{job_id}/cancel": {"post"},
    "/api/v1/jobs/{job_id}/logs": {"get"},
    "/api/v1/jobs/{job_id}/logs/counts": {"get"},
    "/api/v1/jobs/{job_id}/logs.txt": {"get"},
    "/api/v1/jobs/{job_id}/metrics": {"get"},
    "/api/v1/jobs/{job_id}/metrics/summary": {"get"},
    "/api/v1/jobs/{job_id}/metrics.csv": {"get"},
    "/api/v1/jobs/{job_id}/metrics.tensorboard.tar.gz": {"get"},
    "/api/v1/jobs/{job_id}/baseline": {"post"},
    "/api/v1/jobs/{job_id}/baseline-run": {"post"},
}


def token_of(user: User) -> dict[str, str]:
    return {"HTTP_AUTHORIZATION": f"Token {ApiToken.issue(user)}"}


def roomy(user: User) -> None:
    """A quota that holds dozens of jobs: these tests are about lists, not admission."""
    set_quota(user, cpu=1000, memory_gb=10_000, jobs=1000)


def openapi(client: Client, alice: User) -> dict[str, Any]:
    client.force_login(alice)
    response = client.get("/api/v1/openapi.json")
    assert response.status_code == 200
    document: dict[str, Any] = response.json()
    return document


def test_it_serves_a_valid_openapi_3_document(client: Client, alice: User) -> None:
    document = openapi(client, alice)
    validate(document)  # raises on anything that is not valid OpenAPI 3
    assert document["openapi"].startswith("3.")
    assert document["info"] == {**document["info"], "title": "Trainyard API", "version": "1"}


def test_api_clients_fetch_the_document_with_their_token(client: Client, alice: User) -> None:
    assert client.get("/api/v1/openapi.json").status_code == 302  # to the login page
    response = client.get("/api/v1/openapi.json", **token_of(alice))  # type: ignore[arg-type]
    assert response.status_code == 200
    assert "/api/v1/jobs" in response.json()["paths"]
    wrong = client.get("/api/v1/openapi.json", HTTP_AUTHORIZATION="Token nope")
    assert wrong.status_code == 302


def test_the_document_lists_every_path_and_method_of_api_v1(client: Client, alice: User) -> None:
    paths = openapi(client, alice)["paths"]
    for path, methods in API_V1.items():
        assert path in paths, path
        assert methods <= set(paths[path]), (path, set(paths[path]))


def test_every_operation_documents_its_error_answers(client: Client, alice: User) -> None:
    document = openapi(client, alice)
    for path, methods in API_V1.items():
        for method in methods:
            responses = document["paths"][path][method]["responses"]
            for code in ("400", "401", "403", "404", "409", "413"):
                schema = responses[code]["content"]["application/json"]["schema"]
                assert schema == {"$ref": "#/components/schemas/ErrorsOut"}, (path, code)
    downloads = {"logs.txt": "text/plain", "metrics.csv": "text/csv"}
    for name, content_type in downloads.items():
        ok = document["paths"][f"/api/v1/jobs/{{job_id}}/{name}"]["get"]["responses"]["200"]
        assert content_type in ok["content"], name
    job = document["components"]["schemas"]["JobIn"]
    assert set(job["required"]) == {"name", "image", "program", "roles"}


def test_every_json_answer_is_a_named_schema_a_client_can_generate_code_from(
    client: Client, alice: User
) -> None:
    """Not a bare "object": the log counts, the training report and the baseline answer were."""
    document = openapi(client, alice)
    named = {}
    for path, methods in API_V1.items():
        for method in methods:
            for code, answer in document["paths"][path][method]["responses"].items():
                schema = answer.get("content", {}).get("application/json", {}).get("schema")
                if schema is not None and code in ("200", "201"):
                    assert "$ref" in schema, (method, path, code, schema)
                    named[f"{method} {path}"] = schema["$ref"].rsplit("/", 1)[1]
    assert named["get /api/v1/jobs/{job_id}/logs/counts"] == "LogCountsOut"
    assert named["get /api/v1/jobs/{job_id}/metrics/summary"] == "TrainingReportOut"
    assert named["post /api/v1/jobs/{job_id}/baseline"] == "TrainingReportOut"
    report = document["components"]["schemas"]["TrainingReportOut"]
    assert {"throughput", "progress", "baseline", "scaling", "cost_so_far"} <= set(
        report["required"]
    )


def untyped_parts(document: dict[str, Any]) -> list[str]:
    """Where an answer's schema says nothing of a value: a property with no type (Any), or an
    object with neither properties nor a type for its values."""
    schemas = document["components"]["schemas"]
    found: list[str] = []

    def walk(schema: dict[str, Any], where: str, seen: frozenset[str]) -> None:
        if "$ref" in schema:
            name = schema["$ref"].rsplit("/", 1)[1]
            if name not in seen:
                walk(schemas[name], name, seen | {name})
            return
        words = {"title", "description", "default"}
        if set(schema) <= words or (
            schema.get("type") == "object"
            and "properties" not in schema
            and not isinstance(schema.get("additionalProperties"), dict)
        ):
            found.append(where)
        for key, inner in schema.get("properties", {}).items():
            walk(inner, f"{where}.{key}", seen)
        for inner in schema.get("anyOf", []):
            walk(inner, where, seen)
        for key in ("items", "additionalProperties"):
            if isinstance(schema.get(key), dict):
                walk(schema[key], f"{where}[]", seen)

    for path, methods in API_V1.items():
        for method in methods:
            for code, answer in document["paths"][path][method]["responses"].items():
                schema = answer.get("content", {}).get("application/json", {}).get("schema")
                if schema is not None:
                    walk(schema, f"{method} {path} {code}", frozenset())
    return found


def test_no_answer_has_a_part_a_client_cannot_type(client: Client, alice: User) -> None:
    """The catalog's quota and restart defaults, a job's metric definitions, health rules and
    attempts' nodes, and a health event's value were free-form objects or Any."""
    document = openapi(client, alice)
    assert untyped_parts(document) == []
    schemas = document["components"]["schemas"]
    assert schemas["QuotaOut"]["properties"]["left"]["$ref"].endswith("/ResourcesOut")
    assert set(schemas["ResourcesOut"]["required"]) == {"cpu", "gpus", "memory_gb", "jobs"}
    assert set(schemas["HealthRuleOut"]["required"]) == {"kind", "action"}
    assert {"metric", "factor", "minutes", "pattern", "below"} <= set(
        schemas["HealthRuleOut"]["properties"]
    )


def as_text(value: Any) -> str:
    """JSON to compare: keys in any order (a schema lists its fields first), but 30 is not
    30.0 and an absent key is not a null."""
    return json.dumps(value, sort_keys=True)


def test_the_typed_answers_keep_the_shapes_the_presenters_give(client: Client, alice: User) -> None:
    """Typing the answers changed no JSON: a health rule gets no null for a parameter its kind
    does not take, and a whole number stays whole (30, not 30.0)."""
    roomy(alice)
    rules = [
        {"kind": "no-progress", "action": "warn", "factor": 10, "minutes": 30},
        {"kind": "log-pattern", "action": "stop", "name": "OOM", "pattern": "out of memory"},
    ]
    image = FrameworkImage.objects.get(name="pytorch:2.13-cpu")
    image.health_rules = [{"kind": "gpu-idle", "action": "warn", "below": 50}]
    image.save()
    metrics = [{"name": "loss", "regex": r"loss=(\S+)"}]
    job = submit_job(alice, check_job_request(job_request(health_rules=rules, metrics=metrics)))
    job.attempts.update(nodes=["node-1", "node-2"])
    for value in (0.25, 3, "nan", None):
        HealthEvent.objects.create(
            job=job, attempt=0, rule="no progress", action="warn", role="master",
            value=value, message="m", outcome="warned",
        )  # fmt: skip
    client.force_login(alice)
    answer = client.get(f"/api/v1/jobs/{job.pk}")
    assert as_text(answer.json()) == as_text(job_as_dict(job, alice))
    assert answer.json()["health_rules"] == [
        {"kind": "no-progress", "action": "warn", "factor": 10, "minutes": 30, "min_seconds": 30},
        {"kind": "log-pattern", "action": "stop", "name": "OOM", "pattern": "out of memory",
         "stream": "any"},
    ]  # fmt: skip
    assert [e["value"] for e in answer.json()["health_events"]] == [0.25, 3, "nan", None]
    catalog = client.get("/api/v1/catalog")
    assert as_text(catalog.json()) == as_text(catalog_for(alice))
    images = {i["name"]: i for i in catalog.json()["images"]}
    assert images[image.name]["health_rules"] == image.health_rules
    assert set(catalog.json()["quota"]["scopes"][0]) == {
        "kind", "name", "limit", "used", "left", "max_priority"
    }  # fmt: skip


def test_the_docs_page_needs_a_login_and_loads_nothing_from_the_internet(
    client: Client, alice: User
) -> None:
    response = client.get("/api/v1/docs")
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]
    client.force_login(alice)
    page = client.get("/api/v1/docs")
    assert page.status_code == 200
    html = page.content.decode()
    assert "Trainyard API" in html
    assert not re.search(r"(src|href)=\"(https?:)?//", html), "a CDN reference"
    assets = re.findall(r"(?:src|href)=\"(/static/ninja/[^\"]+)\"", html)
    assert {a.rsplit("/", 1)[1] for a in assets} >= {
        "swagger-ui.css",
        "swagger-ui-bundle.js",
        "swagger-ui-init.js",
    }
    for asset in assets:
        served = client.get(asset)
        assert served.status_code == 200, asset
        b"".join(served.streaming_content)  # type: ignore[attr-defined]


def test_the_job_list_is_paged(client: Client, alice: User) -> None:
    roomy(alice)
    ids = [submit_job(alice, check_job_request(job_request(instances=1))).pk for _ in range(5)]
    auth = token_of(alice)
    whole = client.get("/api/v1/jobs", **auth).json()  # type: ignore[arg-type]
    assert (whole["count"], whole["limit"], whole["offset"], whole["next"]) == (5, 50, 0, None)
    assert (whole["count_capped"], whole["previous"]) == (False, None)
    first = client.get("/api/v1/jobs?limit=2", **auth).json()  # type: ignore[arg-type]
    assert first["count"] == 5 and isinstance(first["next"], str)
    rest = client.get("/api/v1/jobs?limit=2&offset=4", **auth).json()  # type: ignore[arg-type]
    assert rest["next"] is None
    paged = [j["id"] for j in first["jobs"]] + [j["id"] for j in rest["jobs"]]
    assert paged == [j["id"] for j in whole["jobs"]][:2] + [j["id"] for j in whole["jobs"]][4:]
    assert sorted(j["id"] for j in whole["jobs"]) == sorted(ids)
    after = client.get(f"/api/v1/jobs?limit=2&cursor={first['next']}", **auth).json()  # type: ignore[arg-type]
    assert [j["id"] for j in after["jobs"]] == [j["id"] for j in whole["jobs"]][2:4]
    for query in ("limit=0", "limit=201", "offset=-1", "limit=x"):
        refused = client.get(f"/api/v1/jobs?{query}", **auth)  # type: ignore[arg-type]
        assert refused.status_code == 400, query
        assert set(refused.json()["errors"]) <= {"limit", "offset"}, refused.json()
    assert client.get("/api/v1/jobs?limit=200", **auth).status_code == 200  # type: ignore[arg-type]


def test_the_job_list_costs_the_same_queries_for_1_job_as_for_30(
    client: Client, alice: User
) -> None:
    roomy(alice)
    auth = token_of(alice)

    def listed() -> tuple[int, int]:
        with CaptureQueriesContext(connection) as queries:
            response = client.get("/api/v1/jobs", **auth)  # type: ignore[arg-type]
        assert response.status_code == 200
        return len(response.json()["jobs"]), len(queries)

    listed()  # a token's first use records when it was used: a write the list does not cost
    submit_job(alice, check_job_request(job_request(instances=2)))
    one, one_cost = listed()
    for _ in range(29):
        submit_job(alice, check_job_request(job_request(instances=2)))
    thirty, thirty_cost = listed()
    assert (one, thirty) == (1, 30)
    assert thirty_cost == one_cost, (one_cost, thirty_cost)


def test_a_list_shows_the_same_job_as_its_own_page(client: Client, alice: User) -> None:
    for _ in range(3):
        submit_job(alice, check_job_request(job_request(instances=3)))
    auth = token_of(alice)
    listed = client.get("/api/v1/jobs", **auth).json()["jobs"]  # type: ignore[arg-type]
    assert len(listed) == 3, listed
    for job in listed:
        alone = client.get(f"/api/v1/jobs/{job['id']}", **auth).json()  # type: ignore[arg-type]
        assert job == alone


INSTANCES_IN_WORDS = (
    'Instances must be a whole number, or {"min": N, "max": M} for elastic workers.'
)


@pytest.mark.parametrize(
    ("change", "field", "message"),
    [
        ({"instances": {"min": 1}}, "roles.worker.instances", INSTANCES_IN_WORDS),
        (
            {"instances": {"min": 1, "max": 3, "step": 1}},
            "roles.worker.instances",
            INSTANCES_IN_WORDS,
        ),
        ({"instances": True}, "roles.worker.instances", INSTANCES_IN_WORDS),
        ({"instances": "2"}, "roles.worker.instances", INSTANCES_IN_WORDS),
        ({"package": 7}, "roles.worker.package", 'Give the package\'s name, e.g. "cpu-1".'),
    ],
)
def test_type_errors_are_named_by_field_in_words(
    client: Client, alice: User, change: dict[str, Any], field: str, message: str
) -> None:
    body = job_request(instances=3)
    body["roles"]["worker"].update(change)
    response = client.post(
        "/api/v1/jobs",
        data=json.dumps(body),
        content_type="application/json",
        **token_of(alice),  # type: ignore[arg-type]
    )
    assert response.status_code == 400
    assert response.json() == {"errors": {field: [message]}}
    assert Job.objects.count() == 0


def test_unknown_fields_are_named(client: Client, alice: User) -> None:
    body = {**job_request(), "surprise": 1, "other": 2}
    body["program"] = {**body["program"], "env": {}}
    response = client.post(
        "/api/v1/jobs",
        data=json.dumps(body),
        content_type="application/json",
        **token_of(alice),  # type: ignore[arg-type]
    )
    assert response.json()["errors"] == {
        "request": ["Unknown field(s): other, surprise."],
        "program": ["Unknown field(s): env."],
    }


def test_an_anonymous_write_is_a_401_not_a_csrf_403() -> None:
    client = Client(enforce_csrf_checks=True)
    response = client.post("/api/v1/jobs", data="{}", content_type="application/json")
    assert response.status_code == 401
    assert response.json() == {"errors": {"auth": ["Log in or send Authorization: Token KEY."]}}


def test_a_session_write_with_the_csrf_token_is_accepted(alice: User) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    client.get("/jobs/new/")  # sets the csrftoken cookie, as the browser's page load does
    token = client.cookies["csrftoken"].value
    response = client.post(
        "/api/v1/jobs",
        data=json.dumps(job_request()),
        content_type="application/json",
        HTTP_X_CSRFTOKEN=token,
    )
    assert response.status_code == 201, response.content
    denied = Client(enforce_csrf_checks=True)
    denied.force_login(alice)
    refused = denied.post("/api/v1/jobs", data=json.dumps(job_request()), content_type="x/json")
    assert refused.status_code == 403
    assert refused.json()["errors"]["auth"] == ["CSRF check failed; send the X-CSRFToken header."]


def test_a_path_under_api_that_matches_no_operation_answers_in_the_api_form(
    client: Client, alice: User
) -> None:
    """Found by the fuzz (tests/integration/test_api_fuzz.py): `GET /api/v1/jobs/2.5` got
    Django's HTML 404 page, which no API client can parse."""
    client.force_login(alice)
    for path in ("/api/v1/jobs/2.5", "/api/v1/no-such-thing", "/api/v2/jobs"):
        response = client.get(path)
        assert (response.status_code, response["Content-Type"]) == (404, "application/json")
        assert response.json() == {
            "errors": {"request": [f"No API operation at {path}; see /api/v1/docs."]}
        }


def test_a_wrong_method_answers_405_in_the_api_form_with_allow(client: Client, alice: User) -> None:
    client.force_login(alice)
    response = client.get("/api/v1/jobs/1/cancel")
    assert (response.status_code, response["Content-Type"]) == (405, "application/json")
    assert response["Allow"] == "POST"
    assert response.json() == {
        "errors": {"request": ["GET is not allowed on /api/v1/jobs/1/cancel; allowed: POST."]}
    }
    # A 404 of an API view itself keeps its own message.
    assert client.get("/api/v1/jobs/999999").json() == {"errors": {"job": ["No such job."]}}
