"""Browser pages through Django's test client: the form, its errors, access to job pages."""

import pytest
from django.contrib.auth.models import User
from django.test import Client

from jobs.models import Job
from jobs.services.submission import check_job_request, submit_job
from tests.conftest import set_quota
from tests.unit.helpers import job_request

pytestmark = pytest.mark.usefixtures("catalog", "code_root", "nodes", "redis_url", "sent_tasks")

FORM = {
    "name": "digits",
    "image": "pytorch:2.13-cpu",
    "script": "digits-ddp",
    "script_path": "",
    "args": "--epochs 3",
    "package": "cpu-1",
    "instances": "3",
}


def test_it_sends_anonymous_users_to_log_in(client: Client) -> None:
    r = client.get("/jobs/new/")
    assert r.status_code == 302 and r["Location"].startswith("/accounts/login/")


def test_it_shows_the_form_with_quota_and_totals(client: Client, alice: User) -> None:
    client.force_login(alice)
    r = client.get("/jobs/new/")
    assert r.status_code == 200
    html = r.content.decode()
    assert 'id="totals"' in html and '"left": {"cpu": 32' in html
    assert 'value="2"' in html  # two instances by default


def test_it_launches_a_job_from_the_form(client: Client, alice: User) -> None:
    client.force_login(alice)
    r = client.post("/jobs/new/", FORM)
    job = Job.objects.get()
    assert r.status_code == 302 and r["Location"] == f"/jobs/{job.pk}/"
    assert job.args == ["--epochs", "3"]
    assert job.replicas.count() == 3


def test_it_says_which_resource_is_over_quota(client: Client, alice: User) -> None:
    set_quota(alice, cpu=2)
    client.force_login(alice)
    r = client.post("/jobs/new/", FORM)
    assert r.status_code == 200
    assert "Over quota on CPU cores: this job needs 3, you have 2 left of 2 (over by 1)." in (
        r.content.decode()
    )
    assert Job.objects.count() == 0


def test_it_keeps_arguments_as_argv_not_shell(client: Client, alice: User) -> None:
    client.force_login(alice)
    client.post("/jobs/new/", dict(FORM, args="--tag '$(whoami); rm -rf /' --x"))
    assert Job.objects.get().args == ["--tag", "$(whoami); rm -rf /", "--x"]


def test_it_reports_unbalanced_quotes(client: Client, alice: User) -> None:
    client.force_login(alice)
    r = client.post("/jobs/new/", dict(FORM, args="--tag 'open"))
    assert "Could not split the arguments" in r.content.decode()
    assert Job.objects.count() == 0


def test_it_refuses_a_script_outside_the_code_root(client: Client, alice: User) -> None:
    client.force_login(alice)
    r = client.post("/jobs/new/", dict(FORM, script="__path__", script_path="../../setup.py"))
    assert "may not contain" in r.content.decode()
    assert Job.objects.count() == 0


def test_it_escapes_job_names(client: Client, alice: User) -> None:
    client.force_login(alice)
    client.post("/jobs/new/", dict(FORM, name="<img src=x onerror=alert(1)>"))
    job = Job.objects.get()
    html = client.get(f"/jobs/{job.pk}/").content.decode()
    assert "<img src=x" not in html and "&lt;img src=x" in html


def test_it_hides_other_users_job_pages(client: Client, alice: User, bob: User) -> None:
    job = submit_job(bob, check_job_request(job_request()))
    client.force_login(alice)
    assert client.get(f"/jobs/{job.pk}/").status_code == 404
    assert client.post(f"/jobs/{job.pk}/cancel/").status_code == 404
    job.refresh_from_db()
    assert job.state == Job.State.QUEUED


def test_it_cancels_from_the_job_page(client: Client, alice: User) -> None:
    job = submit_job(alice, check_job_request(job_request()))
    client.force_login(alice)
    r = client.post(f"/jobs/{job.pk}/cancel/")
    assert r.status_code == 302
    job.refresh_from_db()
    assert job.state == Job.State.CANCELLED


def test_it_expands_the_formula_per_role_for_the_term_that_is_over(
    client: Client, alice: User
) -> None:
    set_quota(alice, cpu=2)
    client.force_login(alice)
    html = client.post("/jobs/new/", FORM).content.decode()
    assert "CPU_total = master 1×1 + worker 1×2 = 3 &gt; 2 left (you): over by 1" in html
    assert "It fits with 1 worker (2 instances in all)." in html


def test_the_node_page_shows_capacity_use_and_status(client: Client, alice: User) -> None:
    from jobs.models import Node
    from tests.conftest import make_stale

    make_stale(Node.objects.get(name="node-2"))
    job = submit_job(alice, check_job_request(job_request(instances=2)))
    from jobs.services.scheduler import scheduling

    scheduling.schedule()
    client.force_login(alice)
    html = client.get("/nodes/").content.decode()
    assert 'data-node="node-1"' in html and "state-ready" in html and "state-lost" in html
    assert f"#{job.pk}" in html and "2 / 8" in html


def test_the_quota_page_shows_use_against_limits(
    client: Client, alice: User, bob: User, charlie_admin: User
) -> None:
    from django.contrib.auth.models import Group

    from jobs.models import Quota

    team = Group.objects.create(name="ml-team")
    alice.groups.add(team)
    Quota.objects.create(group=team, cpu=3, gpus=0, memory_gb=64, running_jobs=5)
    submit_job(alice, check_job_request(job_request(instances=3)))
    client.force_login(alice)
    html = client.get("/quotas/").content.decode()
    assert 'data-name="alice"' in html and 'data-name="ml-team"' in html
    assert 'data-name="bob"' not in html  # users see themselves and their groups
    assert '<td class="full" data-resource="cpu">3 / 3</td>' in html
    assert '<td class="" data-resource="gpus">0 / 0</td>' in html  # none given: not "full"
    client.force_login(charlie_admin)
    html = client.get("/quotas/").content.decode()
    assert 'data-name="bob"' in html and 'data-name="charlie"' in html


def test_the_form_takes_environment_variables_one_a_line(client: Client, alice: User) -> None:
    client.force_login(alice)
    env = "DATA_DIR=/mnt/data\n# a comment\n\nHF_TOKEN=hf_a=b\n"
    r = client.post("/jobs/new/", dict(FORM, env=env))
    job = Job.objects.get()
    assert r.status_code == 302
    assert job.env == {"DATA_DIR": "/mnt/data", "HF_TOKEN": "hf_a=b"}
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert "<code>HF_TOKEN=hf_a=b</code>" in page  # its owner sees the value


def test_the_form_refuses_a_platform_variable_or_a_line_without_a_value(
    client: Client, alice: User
) -> None:
    client.force_login(alice)
    page = client.post("/jobs/new/", dict(FORM, env="RANK=3")).content.decode()
    assert "RANK is set by the platform" in page
    page = client.post("/jobs/new/", dict(FORM, env="DATA_DIR")).content.decode()
    assert "Line 1 is not NAME=value." in page
    assert Job.objects.count() == 0


def test_an_admin_sees_a_jobs_secret_looking_variables_masked(
    client: Client, alice: User, charlie_admin: User
) -> None:
    client.force_login(alice)
    client.post("/jobs/new/", dict(FORM, env="HF_TOKEN=hf_secret\nSEED=7"))
    job = Job.objects.get()
    client.force_login(charlie_admin)
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert "<code>HF_TOKEN=••••••••</code>" in page and "hf_secret" not in page
    assert "<code>SEED=7</code>" in page


def test_an_unknown_page_or_someone_elses_job_is_the_consoles_own_not_found_page(
    client: Client, alice: User
) -> None:
    bob = User.objects.create_user("bob-pages", password="pw")
    theirs = submit_job(bob, check_job_request(job_request(), bob))
    client.force_login(alice)
    for path in ("/jobs/", "/no-such-page/", f"/jobs/{theirs.pk}/"):
        r = client.get(path)
        html = r.content.decode()
        assert r.status_code == 404, path
        assert "<h1>Not found</h1>" in html and "trainyard/trainyard.css" in html, path
        assert "Log out alice" in html, path  # the console's own page, with its navigation
        assert "bob-pages" not in html and "digits" not in html, path
    # The API keeps its JSON answer.
    r = client.get("/api/v1/no-such-operation")
    assert r.status_code == 404 and r.json()["errors"]["request"]


def test_a_staff_page_tells_an_ordinary_user_no_in_the_consoles_own_page(
    client: Client, alice: User
) -> None:
    client.force_login(alice)
    r = client.get("/storage/")
    assert r.status_code == 403
    html = r.content.decode()
    assert "<h1>Not allowed</h1>" in html and "trainyard/trainyard.css" in html


def test_the_server_error_page_renders_with_nothing_from_the_request_or_the_database() -> None:
    from django.template.loader import render_to_string

    html = render_to_string("500.html")  # what Django's server_error does: no request context
    assert "Something went wrong on the console" in html and "trainyard/trainyard.css" in html
