"""The health-rule editor's check (POST /jobs/new/health-rules/) and the kinds it is built from
(jobs.healthrules.describe_kinds): the server's parser is the one judge of a rule."""

import json
import re
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from jobs.healthrules import (
    ACTIONS,
    KINDS,
    PARAMS,
    describe_kinds,
    parse_rules,
)
from jobs.models import Job
from jobs.services.submission import check_job_request, submit_job
from tests.unit.helpers import job_request

URL = "/jobs/new/health-rules/"


def check(client: Client, text: str) -> Any:
    return client.post(URL, {"health_rules": text})


def test_it_reads_the_box_as_the_form_does_and_judges_each_rule(
    client: Client, alice: User
) -> None:
    client.force_login(alice)
    rules = [
        {"kind": "non-finite", "action": "stop"},
        {"kind": "no-progress", "action": "restart"},
        {"kind": "gpu-idle", "action": "warn", "below": 150},
    ]
    r = check(client, json.dumps(rules))
    assert r.status_code == 200
    assert r.json() == {
        "rules": rules,
        "verdicts": [
            {
                "name": "loss is not finite",
                "rule": {"kind": "non-finite", "action": "stop", "metric": "loss"},
            },
            {
                "error": "rule 2: a no-progress rule needs 'factor', 'minutes' or both, "
                'e.g. {"factor": 10, "minutes": 30}'
            },
            {"error": "rule 3: 'below' must be a percentage above 0 and up to 100, not 150"},
        ],
        "error": None,
    }


def test_it_says_what_is_wrong_with_the_list(client: Client, alice: User) -> None:
    client.force_login(alice)
    rule = {"kind": "non-finite", "action": "stop"}
    body = check(client, json.dumps([rule, rule])).json()
    assert [v.get("error") for v in body["verdicts"]] == [None, None]
    assert body["error"] == "rule 2: the same as rule 1"
    assert check(client, '{"kind": "non-finite"}').json()["error"] == (
        "health rules must be a list of rule objects, not an object"
    )


def test_an_empty_box_means_the_images_rules(client: Client, alice: User) -> None:
    client.force_login(alice)
    assert check(client, "  ").json() == {"rules": None, "verdicts": [], "error": None}


def test_bad_json_gets_the_forms_message(client: Client, alice: User) -> None:
    client.force_login(alice)
    body = check(client, "[{").json()
    assert body["rules"] is None
    assert body["error"].startswith("The rules are not valid JSON: ")


def test_a_request_without_the_box_is_refused(client: Client, alice: User) -> None:
    client.force_login(alice)
    r = client.post(URL, {"rules": "[]"})
    assert r.status_code == 400
    assert r.json() == {"errors": {"health_rules": ["Send the health_rules field."]}}
    assert not Job.objects.exists()


def test_it_refuses_anonymous_users(client: Client, db: None) -> None:
    r = check(client, "[]")
    assert r.status_code == 401
    assert r.json() == {"errors": {"auth": ["Log in again."]}}


def test_it_takes_only_posts_with_the_csrf_token(alice: User) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    assert client.get(URL).status_code == 405
    assert check(client, "[]").status_code == 403


def test_the_kinds_are_the_parsers_own() -> None:
    described = describe_kinds()
    assert [k["kind"] for k in described["kinds"]] == list(KINDS)
    assert [a["action"] for a in described["actions"]] == list(ACTIONS)
    for kind in described["kinds"]:
        assert tuple(p["name"] for p in kind["params"]) == PARAMS[kind["kind"]]
        assert kind["help"] and all(p["help"] for p in kind["params"])


@pytest.mark.parametrize("kind", KINDS)
def test_each_described_default_is_the_one_the_parser_fills(kind: str) -> None:
    described = next(k for k in describe_kinds()["kinds"] if k["kind"] == kind)
    # The least each kind needs: its required parameters, and for no-progress one of two.
    least: dict[str, object] = {"kind": kind, "action": "warn"}
    least |= {"pattern": "boom"} if kind == "log-pattern" else {}
    least |= {"factor": 10} if kind == "no-progress" else {}
    (rule,) = parse_rules([least])
    for param in described["params"]:
        if param["name"] not in least:
            assert param["default"] == rule.to_json().get(param["name"]), param["name"]
        assert param["required"] == (param["name"] == "pattern")


@pytest.mark.parametrize(
    ("kind", "param"),
    [
        ("no-progress", "factor"),
        ("no-progress", "minutes"),
        ("no-progress", "min_seconds"),
        ("throughput-drop", "fraction"),
        ("gpu-idle", "below"),
    ],
)
def test_the_described_bounds_are_the_parsers(kind: str, param: str) -> None:
    described = next(k for k in describe_kinds()["kinds"] if k["kind"] == kind)
    bounds = next(p for p in described["params"] if p["name"] == param)
    base: dict[str, object] = {"kind": kind, "action": "warn", "minutes": 5}
    if kind != "no-progress":
        base.pop("minutes")

    def accepted(value: float) -> bool:
        try:
            parse_rules([{**base, param: value}])
        except ValueError:
            return False
        return True

    assert accepted(bounds["max"]) and not accepted(bounds["max"] + 0.001)
    assert accepted(bounds["min"]) == bounds["min_inclusive"]
    assert accepted(bounds["min"] + 0.001)


@pytest.mark.usefixtures("catalog", "code_root", "nodes", "redis_url", "sent_tasks")
def test_the_form_carries_the_kinds_and_the_job_page_lists_the_rules(
    client: Client, alice: User
) -> None:
    client.force_login(alice)
    html = client.get("/jobs/new/").content.decode()
    block = re.search(
        r'<script id="health-rule-kinds" type="application/json">(.*?)</script>', html
    )
    assert block is not None and json.loads(block[1]) == describe_kinds()
    rules = [{"kind": "log-pattern", "pattern": "<b>boom</b>", "action": "stop"}]
    job = submit_job(alice, check_job_request(job_request(health_rules=rules)))
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert "log matches &#x27;&lt;b&gt;boom&lt;/b&gt;&#x27; → stop" in page
