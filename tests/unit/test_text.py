"""Text that is text (jobs.text): every string the console takes is one a process argument, an
environment variable and the database can hold, and a name shows what it is. What breaks the
rules is refused with a 4xx that names the field, in the API, the forms and the query string;
never a 500, never accepted to fail later. A job stored before the rules still renders."""

import json
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from jobs import text
from jobs.models import ApiToken, CodeUpload, Job
from jobs.services import tokens
from jobs.services.submission import check_job_request, submit_job
from tests.unit.helpers import job_request

pytestmark = pytest.mark.usefixtures("catalog", "code_root", "nodes", "redis_url", "sent_tasks")

SURROGATE = "\ud800"
RLO = "\u202e"  # RIGHT-TO-LEFT OVERRIDE: "job\u202etxt.exe" reads as "jobexe.txt"


def test_the_rules_in_words() -> None:
    assert text.text_problem("loss=0.5 ✓ 训练") is None
    assert text.name_problem("résumé 训练 🚀") is None
    assert "NUL" in (text.text_problem("a\x00b") or "")
    assert "\\ud800" in (text.text_problem(f"a{SURROGATE}") or "")
    assert text.text_problem("line\nbreak") is None  # a value may hold a newline
    assert "U+000A" in (text.name_problem("line\nbreak") or "")
    assert "right-to-left override" in (text.name_problem(f"job{RLO}txt.exe") or "")
    for invisible in ("\u200b", "\u2066", "\ufeff", "\u2028", "\x1b"):
        assert text.name_problem(f"a{invisible}b"), repr(invisible)
    # A pair of surrogates as Python gets it from JSON is one character, and fine.
    assert text.text_problem(json.loads('"\\ud83d\\ude80"')) is None
    assert text.shown(f"a{SURROGATE}b") == "a\ufffdb"


@pytest.fixture
def token(alice: User) -> str:
    return ApiToken.issue(alice)


def post_json(client: Client, path: str, token: str, body: Any) -> Any:
    # json.dumps writes a lone surrogate as the escape \ud800, which is valid JSON text.
    return client.post(
        path, data=json.dumps(body), content_type="application/json",
        HTTP_AUTHORIZATION=f"Token {token}",
    )  # fmt: skip


def with_field(path: str, value: Any) -> dict[str, Any]:
    body = job_request(instances=1)
    target = body
    keys = path.split(".")
    for key in keys[:-1]:
        target = target.setdefault(key, {})
    target[keys[-1]] = value
    return body


BAD_BODIES = {
    "name": with_field("name", f"x{SURROGATE}"),
    "image": with_field("image", SURROGATE),
    "program.script": with_field("program.script", f"a{SURROGATE}.py"),
    "program.snapshot": with_field("program.snapshot", SURROGATE * 64),
    "program.args.1": with_field("program.args", ["--tag", f"x{SURROGATE}"]),
    "program.args.0": with_field("program.args", ["a\x00b"]),
    "env.GREETING": with_field("env", {"GREETING": f"hi{SURROGATE}"}),
    "env.A\\u0000B": with_field("env", {"A\x00B": "x"}),
    "health_rules.0.pattern": with_field(
        "health_rules", [{"kind": "log-pattern", "pattern": f"x{SURROGATE}", "action": "stop"}]
    ),
    "metrics.0.regex": with_field("metrics", [{"name": "loss", "regex": f"({SURROGATE})"}]),
    "roles.\ufffd": with_field("roles", {SURROGATE: {"package": "cpu-1", "instances": 1}}),
}


@pytest.mark.parametrize("field", list(BAD_BODIES))
def test_text_no_process_or_database_can_hold_is_refused_by_field(
    client: Client, token: str, field: str
) -> None:
    response = post_json(client, "/api/v1/jobs", token, BAD_BODIES[field])
    assert response.status_code == 400, response.content[:300]
    errors = response.json()["errors"]
    assert field in errors, errors
    assert "NUL" in errors[field][0] or "surrogate" in errors[field][0]
    assert Job.objects.count() == 0


@pytest.mark.parametrize(
    "name", [f"job{RLO}txt.exe", "two\nlines", "tab\there", "bell\x07", "zero\u200bwidth"]
)
def test_a_job_name_that_hides_what_it_is_is_refused(client: Client, token: str, name: str) -> None:
    response = post_json(client, "/api/v1/jobs", token, job_request(instances=1, name=name))
    assert response.status_code == 400
    assert "invisible or control characters" in response.json()["errors"]["name"][0]
    assert Job.objects.count() == 0


def test_a_job_name_in_any_script_is_accepted(client: Client, token: str) -> None:
    name = "训练 résumé 🚀"
    response = post_json(client, "/api/v1/jobs", token, job_request(instances=1, name=name))
    assert response.status_code == 201, response.content
    assert Job.objects.get().name == name


@pytest.mark.parametrize("query", ["?search=%00", "?state=%00", "?%00=1", "?limit=1%002"], ids=str)
def test_a_nul_in_the_query_string_is_refused(client: Client, token: str, query: str) -> None:
    response = client.get(f"/api/v1/jobs{query}", HTTP_AUTHORIZATION=f"Token {token}")
    assert response.status_code == 400
    assert "NUL" in json.dumps(response.json()["errors"])


def test_a_nul_in_a_path_or_a_page_query_is_refused(
    client: Client, token: str, alice: User
) -> None:
    response = client.post("/api/v1/nodes/node%00-1/drain", HTTP_AUTHORIZATION=f"Token {token}")
    assert response.status_code == 400
    assert "NUL" in response.json()["errors"]["path"][0]
    client.force_login(alice)
    page = client.get("/?q=%00")
    assert page.status_code == 400
    assert b"NUL" in page.content


def test_token_and_upload_names_that_hide_what_they_are_are_refused(
    client: Client, alice: User
) -> None:
    with pytest.raises(tokens.BadTokenName, match="invisible or control"):
        tokens.issue(alice, f"laptop{RLO}")
    client.force_login(alice)
    page = client.post("/account/tokens/", {"name": f"laptop{RLO}"})
    assert "invisible or control characters" in page.content.decode()
    assert not ApiToken.objects.filter(user=alice).exists()


def test_the_new_job_form_refuses_a_hidden_name_beside_the_field(
    client: Client, alice: User
) -> None:
    client.force_login(alice)
    page = client.post(
        "/jobs/new/",
        {"name": f"job{RLO}", "image": "pytorch:2.13-cpu", "script": "digits-ddp",
         "package": "cpu-1", "instances": 1},
    )  # fmt: skip
    assert page.status_code == 200
    assert "invisible or control characters" in page.content.decode()
    assert Job.objects.count() == 0


def test_a_job_stored_before_the_rules_still_renders(client: Client, alice: User) -> None:
    """Arguments, variables and rules are JSON in the database, which stored a lone surrogate
    before the rules; the page and the API show it as U+FFFD instead of answering 500."""
    job = submit_job(alice, check_job_request(job_request(instances=1, env={"GREETING": "hi"})))
    Job.objects.filter(pk=job.pk).update(
        args=["--tag", f"x{SURROGATE}"], env={"GREETING": f"hi{SURROGATE}"}
    )
    client.force_login(alice)
    page = client.get(f"/jobs/{job.pk}/")
    assert page.status_code == 200
    assert "x\ufffd" in page.content.decode()
    answer = client.get(f"/api/v1/jobs/{job.pk}")
    assert answer.status_code == 200
    assert CodeUpload.objects.count() == 0


def test_the_new_job_form_refuses_nul_in_any_field(client: Client, alice: User) -> None:
    client.force_login(alice)
    page = client.post(
        "/jobs/new/",
        {"name": "ok", "image": "pytorch:2.13-cpu", "script": "digits-ddp", "package": "cpu-1",
         "instances": 1, "args": "--tag a\x00b", "env": "GREETING=a\x00b"},
    )  # fmt: skip
    assert page.status_code == 200
    assert page.content.decode().count("Null characters are not allowed.") == 2
    assert Job.objects.count() == 0


def test_an_admin_cannot_name_an_image_or_package_with_hidden_characters() -> None:
    from django.core.exceptions import ValidationError

    from jobs.models import FrameworkImage, Package

    image = FrameworkImage.objects.first()
    package = Package.objects.first()
    assert image is not None and package is not None
    for item in (image, package):
        item.name = f"cpu{RLO}-1"
        with pytest.raises(ValidationError, match="invisible or control"):
            item.full_clean()
