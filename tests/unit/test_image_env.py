"""An image's default variables: set by admins (checked as a job's own are), listed in the
catalog and on the New job form, taken by every trainer of a job on the image under the job's
own variables, and frozen at submission; a rerun takes the image's defaults of its own time."""

import importlib
from typing import Any

import pytest
from django.apps import apps
from django.contrib.auth.models import User
from django.test import Client

from jobs.models import ApiToken, FrameworkImage, Job
from tests.unit.helpers import SentTasks
from tests.unit.helpers import api_submit as submit
from workers import contract

pytestmark = pytest.mark.usefixtures("catalog", "code_root", "nodes", "redis_url", "sent_tasks")

STARTER = "pytorch:2.13-cpu"
STARTER_DEFAULTS = {"ACCELERATE_USE_CPU": "true"}


def started_env(sent_tasks: SentTasks) -> list[dict[str, str]]:
    return [kw["spec"]["extra_env"] for _, kw, _ in sent_tasks.named(contract.TASK_START_REPLICA)]


def test_the_catalog_lists_an_images_defaults(client: Client, alice: User) -> None:
    catalog = client.get(
        "/api/v1/catalog", HTTP_AUTHORIZATION=f"Token {ApiToken.issue(alice)}"
    ).json()
    defaults = {i["name"]: i["default_env"] for i in catalog["images"]}
    assert defaults == {STARTER: STARTER_DEFAULTS, "kvstore-ps:2.13": {}}


def test_every_trainer_gets_the_images_defaults_under_the_jobs_own(
    client: Client, alice: User, sent_tasks: SentTasks, django_capture_on_commit_callbacks: Any
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        assert submit(client, alice).status_code == 201
    assert started_env(sent_tasks) == [STARTER_DEFAULTS] * 2
    sent_tasks.sent.clear()
    own = {"ACCELERATE_USE_CPU": "false", "SEED": "7"}
    with django_capture_on_commit_callbacks(execute=True):
        assert submit(client, alice, env=own).status_code == 201
    assert started_env(sent_tasks) == [own] * 2


def test_a_job_keeps_the_defaults_it_was_submitted_with_and_a_rerun_takes_todays(
    client: Client, alice: User
) -> None:
    job = Job.objects.get(pk=submit(client, alice).json()["id"])
    FrameworkImage.objects.filter(name=STARTER).update(default_env={"HF_HUB_OFFLINE": "1"})
    job.refresh_from_db()
    assert job.image_env == STARTER_DEFAULTS
    client.force_login(alice)
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert "<strong>From the image</strong> <code>ACCELERATE_USE_CPU=true</code>" in page
    client.post(f"/jobs/{job.pk}/run-again/")
    again = Job.objects.exclude(pk=job.pk).get()
    assert (again.env, again.image_env) == ({}, {"HF_HUB_OFFLINE": "1"})


def test_the_form_says_what_the_chosen_image_sets(client: Client, alice: User) -> None:
    client.force_login(alice)
    page = client.get("/jobs/new/").content.decode()
    assert (
        f'<small class="image-env" data-image="{STARTER}" hidden>This image sets: '
        "<code>ACCELERATE_USE_CPU=true</code>. Your own variables of the same name win.</small>"
    ) in page
    assert 'class="image-env" data-image="kvstore-ps:2.13"' not in page  # it sets none


def admin_form_data(client: Client, url: str) -> dict[str, Any]:
    """What the admin's change form would post back unchanged."""
    form = client.get(url).context["adminform"].form
    data = {}
    for name in form.fields:
        value = form[name].value()
        if value is not None and value is not False:
            data[name] = value
    return data


@pytest.mark.parametrize(
    ("default_env", "message"),
    [
        ('{"RANK": "3"}', "RANK is set by the platform (see the README&#x27;s &quot;What a"),
        ('{"1BAD": "x"}', "&#x27;1BAD&#x27; is not a variable name"),
        ('{"SEED": 7}', "The value of SEED must be text"),
        ('["SEED=7"]', "Give the variables as {&quot;NAME&quot;: &quot;value&quot;}."),
    ],
)
def test_an_admin_is_told_what_is_wrong_with_a_default_and_nothing_changes(
    client: Client, charlie_admin: User, default_env: str, message: str
) -> None:
    image = FrameworkImage.objects.get(name=STARTER)
    url = f"/admin/jobs/frameworkimage/{image.pk}/change/"
    client.force_login(charlie_admin)
    data = admin_form_data(client, url)
    assert client.post(url, {**data, "default_env": '{"HF_HUB_OFFLINE": "1"}'}).status_code == 302
    image.refresh_from_db()
    assert image.default_env == {"HF_HUB_OFFLINE": "1"}
    r = client.post(url, {**data, "default_env": default_env})
    assert r.status_code == 200 and message in r.content.decode()
    image.refresh_from_db()
    assert image.default_env == {"HF_HUB_OFFLINE": "1"}


def test_an_admin_may_set_what_the_loader_reads_in_an_images_defaults(
    client: Client, charlie_admin: User
) -> None:
    """A job may not set LD_LIBRARY_PATH (docs/security.md); an image's defaults may, for the
    image's own libraries: they are set for its trainers alone, after the privilege drop."""
    image = FrameworkImage.objects.get(name=STARTER)
    url = f"/admin/jobs/frameworkimage/{image.pk}/change/"
    client.force_login(charlie_admin)
    data = admin_form_data(client, url)
    default_env = '{"LD_LIBRARY_PATH": "/opt/cuda/lib64"}'
    assert client.post(url, {**data, "default_env": default_env}).status_code == 302
    image.refresh_from_db()
    assert image.default_env == {"LD_LIBRARY_PATH": "/opt/cuda/lib64"}


def test_the_migration_sets_accelerate_on_the_cpu_starter_unless_an_admin_set_defaults() -> None:
    migration = importlib.import_module("jobs.migrations.0020_image_default_env")
    images = FrameworkImage.objects
    images.filter(name=STARTER).update(default_env={})
    migration.set_the_cpu_starters_defaults(apps, None)
    assert images.get(name=STARTER).default_env == STARTER_DEFAULTS
    assert images.get(name="kvstore-ps:2.13").default_env == {}
    images.filter(name=STARTER).update(default_env={"MINE": "1"})
    migration.set_the_cpu_starters_defaults(apps, None)
    assert images.get(name=STARTER).default_env == {"MINE": "1"}
