"""The New-job form's JSON (the health-rules box, and the editor's check of it) goes through the
API's depth and size limits (jobs/json_limits.py): a hostile value is a message beside the
field, never a 500, and nothing is created. Before, 2,000 levels of [ raised RecursionError."""

import pytest
from django.contrib.auth.models import User
from django.test import Client

from jobs.forms import MAX_HEALTH_RULES_CHARS
from jobs.json_limits import MAX_JSON_DEPTH
from jobs.models import Job, Node
from tests.unit.helpers import SentTasks

DEEP = "[" * 2000 + "]" * 2000
LONG = '[{"kind": "non-finite", "action": "warn", "name": "' + "x" * MAX_HEALTH_RULES_CHARS + '"}]'
FORM = {"name": "digits", "image": "pytorch:2.13-cpu", "script": "digits-ddp",
        "script_path": "", "args": "", "package": "cpu-1", "instances": "2"}  # fmt: skip


@pytest.mark.parametrize(
    ("rules", "message"),
    [
        (DEEP, f"The rules are nested too deeply (more than {MAX_JSON_DEPTH} levels)."),
        (LONG, f"at most {MAX_HEALTH_RULES_CHARS:,}."),
    ],
)
def test_the_form_refuses_hostile_rules_beside_the_box(
    nodes: list[Node], alice: User, sent_tasks: SentTasks, rules: str, message: str
) -> None:
    client = Client()
    client.force_login(alice)
    answer = client.post("/jobs/new/", {**FORM, "health_rules": rules})
    assert answer.status_code == 200
    page = answer.content.decode()
    field = page[page.index('id="field-health_rules"') :]
    assert message in field[: field.index("</div>")]
    assert not Job.objects.exists()


@pytest.mark.parametrize(
    ("rules", "message"),
    [
        (DEEP, f"The rules are nested too deeply (more than {MAX_JSON_DEPTH} levels)."),
        (LONG, f"at most {MAX_HEALTH_RULES_CHARS:,}."),
    ],
)
def test_the_editors_check_says_what_is_wrong(alice: User, rules: str, message: str) -> None:
    client = Client()
    client.force_login(alice)
    answer = client.post("/jobs/new/health-rules/", {"health_rules": rules})
    assert answer.status_code == 200
    assert message in answer.json()["error"]
    assert answer.json()["rules"] is None


def test_rules_as_deep_as_the_limit_are_still_read(alice: User) -> None:
    client = Client()
    client.force_login(alice)
    nested = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH
    answer = client.post("/jobs/new/health-rules/", {"health_rules": nested})
    assert "nested too deeply" not in (answer.json()["error"] or "")
