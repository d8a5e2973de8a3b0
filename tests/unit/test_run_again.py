"""Run again and Edit and run again: the job page's buttons, the filled form, and the API's
request of a job (what `trainyard rerun` and `show --job-file` read)."""

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from jobs.models import ApiToken, Job, Quota
from jobs.services.submission import check_job_request, submit_job
from tests.conftest import set_quota
from tests.unit.helpers import job_request

pytestmark = pytest.mark.usefixtures("catalog", "code_root", "nodes", "redis_url", "sent_tasks")

ENV = {"WANDB_MODE": "offline", "HF_TOKEN": "hf_secret_value"}


@pytest.fixture
def job(alice: User) -> Job:
    set_quota(alice, cpu=100, memory_gb=1000, jobs=100)
    return submit_job(
        alice,
        check_job_request(
            job_request(
                instances=3,
                name="sweep",
                program={"script": "digits-ddp", "args": ["--epochs", "3", "--lr", "0.1"]},
                env=ENV,
                restart={"policy": "on-failure", "max_restarts": 2, "backoff_seconds": 5},
                health_rules=[{"kind": "non-finite", "metric": "loss", "action": "stop"}],
            )
        ),
    )


def request_of(client: Client, user: User, job_id: int) -> Any:
    auth = {"HTTP_AUTHORIZATION": f"Token {ApiToken.issue(user)}"}
    return client.get(f"/api/v1/jobs/{job_id}/request", **auth)  # type: ignore[arg-type]


def test_it_gives_the_owner_the_request_that_submits_the_job_again(
    client: Client, alice: User, job: Job
) -> None:
    r = request_of(client, alice, job.pk)
    assert r.status_code == 200
    body = r.json()
    assert body["program"] == {"script": "digits-ddp", "args": ["--epochs", "3", "--lr", "0.1"]}
    assert body["roles"] == {
        "master": {"package": "cpu-1", "instances": 1},
        "worker": {"package": "cpu-1", "instances": 2},
    }
    assert body["env"] == ENV
    assert body["restart"]["policy"] == "on-failure" and body["restart"]["max_restarts"] == 2
    assert body["health_rules"][0]["kind"] == "non-finite"
    again = submit_job(alice, check_job_request(body))  # it is a request the API takes
    assert (again.args, again.env, again.max_restarts) == (job.args, job.env, 2)


def test_masked_values_are_never_copied_to_another_user(
    client: Client, charlie_admin: User, bob: User, job: Job
) -> None:
    body = request_of(client, charlie_admin, job.pk).json()
    assert body["env"] == {"WANDB_MODE": "offline"}
    client.force_login(charlie_admin)
    html = client.get(f"/jobs/{job.pk}/again/").content.decode()
    assert "WANDB_MODE=offline" in html and "HF_TOKEN" not in html and "hf_secret" not in html
    assert request_of(client, bob, job.pk).status_code == 404
    client.force_login(bob)
    assert client.get(f"/jobs/{job.pk}/again/").status_code == 404
    assert client.post(f"/jobs/{job.pk}/run-again/").status_code == 404


def test_edit_and_run_again_opens_the_form_filled_from_the_job(
    client: Client, alice: User, job: Job
) -> None:
    client.force_login(alice)
    page = client.get(f"/jobs/{job.pk}/")
    assert f'href="/jobs/{job.pk}/again/"' in page.content.decode()
    form = client.get(f"/jobs/{job.pk}/again/")
    html = form.content.decode()
    assert form.status_code == 200 and f'from <a href="/jobs/{job.pk}/">#{job.pk}</a>' in html
    initial = form.context["form"].initial
    assert initial["args"] == "--epochs 3 --lr 0.1"
    assert (initial["script"], initial["package"], initial["instances"]) == (
        "digits-ddp",
        "cpu-1",
        3,
    )
    assert initial["env"] == "WANDB_MODE=offline\nHF_TOKEN=hf_secret_value"
    assert (initial["restart_policy"], initial["max_restarts"]) == ("on-failure", 2)
    assert '"non-finite"' in initial["health_rules"]


def test_launching_the_edited_form_makes_a_new_job_and_leaves_the_old(
    client: Client, alice: User, job: Job
) -> None:
    client.force_login(alice)
    fields = {k: v for k, v in client.get(f"/jobs/{job.pk}/again/").context["form"].initial.items()}
    fields.update(args="--epochs 3 --lr 0.05", script_path="", exclude_failed_node="")
    r = client.post(f"/jobs/{job.pk}/again/", {k: v for k, v in fields.items() if v is not None})
    again = Job.objects.exclude(pk=job.pk).get()
    assert r.status_code == 302 and r["Location"] == f"/jobs/{again.pk}/"
    assert again.args == ["--epochs", "3", "--lr", "0.05"]
    assert (again.env, again.max_restarts, again.health_rules) == (job.env, 2, job.health_rules)
    job.refresh_from_db()
    assert job.args == ["--epochs", "3", "--lr", "0.1"]


def test_run_again_submits_the_same_job_at_once(client: Client, alice: User, job: Job) -> None:
    client.force_login(alice)
    r = client.post(f"/jobs/{job.pk}/run-again/")
    again = Job.objects.exclude(pk=job.pk).get()
    assert r.status_code == 302 and r["Location"] == f"/jobs/{again.pk}/"
    assert (again.name, again.args, again.env) == (job.name, job.args, job.env)


def test_a_refused_run_again_opens_the_filled_form_with_the_reason(
    client: Client, alice: User, job: Job
) -> None:
    Quota.objects.filter(user=alice).update(cpu=1)
    client.force_login(alice)
    r = client.post(f"/jobs/{job.pk}/run-again/", follow=True)
    assert r.redirect_chain[-1][0] == f"/jobs/{job.pk}/again/"
    assert "Over quota" in r.content.decode()
    assert Job.objects.count() == 1
