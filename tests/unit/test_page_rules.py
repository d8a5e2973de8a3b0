"""The rules block every console page carries for its scripts (jobs/page_rules.py)."""

import json
import re

import pytest
from django.contrib.auth.models import User
from django.test import Client

from jobs import consumers
from jobs.models import Job
from jobs.page_rules import page_rules
from jobs.services.submission import check_job_request, submit_job
from tests.conftest import set_quota
from tests.unit.helpers import job_request
from workers.contract import tag_of

pytestmark = pytest.mark.usefixtures("catalog", "code_root", "nodes", "redis_url", "sent_tasks")

RULES_BLOCK = re.compile(r'<script id="trainyard-rules" type="application/json">(.*?)</script>')


def rules_on(client: Client, path: str) -> dict[str, object]:
    response = client.get(path)
    assert response.status_code == 200, path
    found = RULES_BLOCK.findall(response.content.decode())
    assert len(found) == 1, path
    rules: dict[str, object] = json.loads(found[0])
    return rules


def test_every_page_with_a_script_carries_the_servers_rules(client: Client, alice: User) -> None:
    set_quota(alice)
    job = submit_job(alice, check_job_request(job_request(instances=2)))
    client.force_login(alice)
    for path in ("/", "/jobs/new/", f"/jobs/{job.pk}/", "/nodes/", "/quotas/"):
        assert rules_on(client, path) == page_rules(), path


def test_the_rules_are_the_ones_the_server_applies() -> None:
    rules = page_rules()
    tags = rules["tags"]
    for role, index in (("master", 0), ("scheduler", 0), ("worker", 3), ("server", 0)):
        solo = role in tags["solo_roles"]
        by_rule = role if solo else tags["format"].format(role=role, index=index)
        assert by_rule == tag_of(role, index)
    assert rules["states"]["terminal"] == ["succeeded", "failed", "cancelled"]
    assert set(rules["states"]["terminal"]) == set(Job.TERMINAL_STATES)
    assert set(rules["states"]["waiting"]) == {"pending", "queued"}
    assert [r["key"] for r in rules["quota"]["resources"]] == ["cpu", "gpus", "memory_gb"]
    assert rules["close_codes"] == {
        "unauthenticated": consumers.CLOSE_UNAUTHENTICATED,
        "not_found": consumers.CLOSE_NOT_FOUND,
        "too_slow": consumers.CLOSE_TOO_SLOW,
    }
