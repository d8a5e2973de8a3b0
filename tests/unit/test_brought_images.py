"""Where a job's trainers run, and images users bring: a reference checked as an OCI reference
and against its framework image's allow-list, fixed on the job at submission (an admin who
moves the image to a new tag changes later jobs only), sent to the agents, shown on the form,
the job page, the API and the catalog, and copied by Run again."""

import importlib
from io import StringIO
from typing import Any

import pytest
from django.apps import apps
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.core.management import CommandError, call_command
from django.test import Client

from jobs import container_refs
from jobs.models import FrameworkImage, Job, SlurmPool
from jobs.services import rerun
from jobs.services.submission import ValidationFailed, check_job_request
from tests.unit.helpers import SentTasks, job_request
from tests.unit.helpers import api_submit as submit
from workers import contract

pytestmark = pytest.mark.usefixtures("catalog", "code_root", "nodes", "redis_url", "sent_tasks")

STARTER = "pytorch:2.13-cpu"
TEAM = "registry.example.com/team-a"


@pytest.mark.parametrize(
    "reference",
    [
        "registry.example.com/team-a/bert:1.0",
        "localhost:5000/trainer",
        "nvcr.io/nvidia/pytorch:24.05-py3",
        "pytorch/pytorch@sha256:" + "a" * 64,
        "registry.example.com/x/y/z:v1@sha256:" + "0f" * 32,
    ],
)
def test_an_oci_reference_is_one(reference: str) -> None:
    assert container_refs.reference_problem(reference) is None


@pytest.mark.parametrize(
    "reference",
    [
        "--privileged",  # read as the runtime's option, were it handed on
        "-v=/:/host",
        "registry.example.com/team a/x",
        "registry.example.com/Team/x",  # path components are lower case
        "x:tag;id",
        "x:" + "t" * 129,
        "a/" * 200 + "b",
        "",
    ],
)
def test_what_is_not_an_oci_reference_is_refused(reference: str) -> None:
    assert container_refs.reference_problem(reference)


def test_a_prefix_allows_at_a_boundary_only() -> None:
    assert container_refs.allowed_by(f"{TEAM}/bert:1", [TEAM])
    assert container_refs.allowed_by(f"{TEAM}:2", [TEAM])
    assert container_refs.allowed_by(f"{TEAM}/bert:1", [f"{TEAM}/"])
    assert not container_refs.allowed_by(f"{TEAM}b/bert:1", [TEAM])
    assert not container_refs.allowed_by("registry.example.com/team-b/x", [TEAM, "nvcr.io/"])
    assert not container_refs.allowed_by(f"{TEAM}/bert:1", [])


def letting_in(*prefixes: str, own: str = "") -> FrameworkImage:
    image = FrameworkImage.objects.get(name=STARTER)
    image.user_image_prefixes, image.container_image = list(prefixes), own
    image.save()
    return image


def errors_of(**overrides: Any) -> list[str]:
    with pytest.raises(ValidationFailed) as caught:
        check_job_request(job_request(**overrides))
    assert Job.objects.count() == 0
    return caught.value.errors["container_image"]


def test_an_image_that_lets_none_in_says_so() -> None:
    letting_in(own="registry.example.com/ml/pytorch:2.13")
    assert errors_of(container_image=f"{TEAM}/bert:1") == [
        f"{STARTER} runs in its own image registry.example.com/ml/pytorch:2.13: its admin lets "
        "no image of yours in."
    ]
    letting_in()
    assert errors_of(container_image=f"{TEAM}/bert:1") == [
        f"{STARTER} runs in the host's interpreter: its admin lets no image of yours in."
    ]


def test_a_reference_outside_the_allow_list_or_not_a_reference_is_refused() -> None:
    letting_in(f"{TEAM}/", "nvcr.io/nvidia/")
    assert errors_of(container_image="docker.io/evil/miner:1") == [
        f"docker.io/evil/miner:1 is not among the images {STARTER} lets in: references "
        f"starting with {TEAM}/, nvcr.io/nvidia/."
    ]
    assert "is not an image reference" in errors_of(container_image="--privileged")[0]


def test_an_image_of_ones_own_is_not_for_a_slurm_pool() -> None:
    pool = SlurmPool.objects.create(name="hpc", partition="gpu")
    image = letting_in(f"{TEAM}/")
    image.slurm_pools.add(pool)
    problems = errors_of(container_image=f"{TEAM}/bert:1", pool="hpc")
    assert problems == [
        "The Slurm pool 'hpc' runs the host's interpreter: an image of your own runs on "
        "Trainyard's own nodes (leave the pool empty)."
    ]


def started_in(sent_tasks: SentTasks) -> list[str]:
    return [
        kw["spec"]["container_image"] for _, kw, _ in sent_tasks.named(contract.TASK_START_REPLICA)
    ]


def test_a_brought_image_runs_the_job_and_is_shown_and_copied(
    client: Client, alice: User, sent_tasks: SentTasks, django_capture_on_commit_callbacks: Any
) -> None:
    letting_in(f"{TEAM}/", own="registry.example.com/ml/pytorch:2.13")
    with django_capture_on_commit_callbacks(execute=True):
        answer = submit(client, alice, container_image=f"{TEAM}/bert:1")
    assert answer.status_code == 201, answer.json()
    assert answer.json()["container_image"] == f"{TEAM}/bert:1"
    assert started_in(sent_tasks) == [f"{TEAM}/bert:1"] * 2
    job = Job.objects.get(pk=answer.json()["id"])
    assert rerun.request_of(job, alice)["container_image"] == f"{TEAM}/bert:1"
    client.force_login(alice)
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert (
        f'<span id="job-runs-in">in the container image <code>{TEAM}/bert:1</code> '
        '<span class="muted">(not the image\'s own)</span></span>'
    ) in page


def test_a_job_keeps_the_image_it_was_submitted_with(
    client: Client, alice: User, sent_tasks: SentTasks, django_capture_on_commit_callbacks: Any
) -> None:
    letting_in(own="registry.example.com/ml/pytorch:2.13")
    answer = submit(client, alice)
    assert answer.json()["container_image"] == "registry.example.com/ml/pytorch:2.13"
    # The admin moves the image to a new tag while the job waits: it runs what it was given.
    letting_in(own="registry.example.com/ml/pytorch:2.14")
    job = Job.objects.get(pk=answer.json()["id"])
    assert job.container_image == "registry.example.com/ml/pytorch:2.13"
    # Run again takes the image's own of its time: the old tag is not let in.
    assert "container_image" not in rerun.request_of(job, alice)


def test_a_host_image_says_so_on_the_job_page_and_in_the_catalog(
    client: Client, alice: User
) -> None:
    letting_in(f"{TEAM}/")
    job_id = submit(client, alice).json()["id"]
    client.force_login(alice)
    page = client.get(f"/jobs/{job_id}/").content.decode()
    assert """<span id="job-runs-in">on each node's own Python, no container</span>""" in page
    catalog = client.get("/api/v1/catalog").json()
    starter = next(i for i in catalog["images"] if i["name"] == STARTER)
    assert (starter["container_image"], starter["user_image_prefixes"]) == ("", [f"{TEAM}/"])


def test_the_form_says_where_each_image_runs_and_takes_a_brought_one(
    client: Client, alice: User, sent_tasks: SentTasks
) -> None:
    letting_in(f"{TEAM}/", own="registry.example.com/ml/pytorch:2.13")
    client.force_login(alice)
    page = client.get("/jobs/new/").content.decode()
    assert (
        f'data-image="{STARTER}" hidden>Runs in the container image '
        "<code>registry.example.com/ml/pytorch:2.13</code>, pulled once per node.</small>"
    ) in page
    assert f'<option value="{STARTER}" selected>{STARTER} · container</option>' in page
    assert f"{STARTER} lets in references starting with <code>{TEAM}/</code>" in page
    form = {
        "name": "bert",
        "image": STARTER,
        "container_image": f"{TEAM}/bert:1",
        "script": "digits-ddp",
        "package": "cpu-1",
        "instances": "1",
    }
    answer = client.post("/jobs/new/", form)
    assert answer.status_code == 302, answer.content.decode()[:2000]
    assert Job.objects.get().container_image == f"{TEAM}/bert:1"
    refused = client.post("/jobs/new/", {**form, "container_image": "docker.io/x/y"})
    assert "is not among the images" in refused.content.decode()
    assert Job.objects.count() == 1


def test_the_admin_refuses_a_bad_prefix_or_reference() -> None:
    image = FrameworkImage.objects.get(name=STARTER)
    image.user_image_prefixes = ["-v", " registry.example.com/"]
    image.container_image = "--privileged"
    with pytest.raises(ValidationError) as caught:
        image.full_clean()
    assert set(caught.value.message_dict) == {"user_image_prefixes", "container_image"}


def test_the_migration_fixes_each_jobs_image_from_its_images_reference(
    client: Client, alice: User
) -> None:
    letting_in(own="registry.example.com/ml/pytorch:2.13")
    job_id = submit(client, alice).json()["id"]
    Job.objects.filter(pk=job_id).update(container_image="")
    migration = importlib.import_module("jobs.migrations.0041_container_image_per_job")
    migration.jobs_keep_their_images_reference(apps, None)
    assert Job.objects.get(pk=job_id).container_image == "registry.example.com/ml/pytorch:2.13"


def test_the_command_copies_an_image_into_a_container_and_retires_it() -> None:
    out = StringIO()
    call_command(
        "container_image", "pt-c", "--like", STARTER, "--reference", "localhost/t:1",
        "--lets-in", f"{TEAM}/", stdout=out,
    )  # fmt: skip
    assert out.getvalue() == "pt-c: runs in localhost/t:1\n"
    copy, starter = (
        FrameworkImage.objects.get(name="pt-c"),
        FrameworkImage.objects.get(name=STARTER),
    )
    assert (copy.framework, copy.default_env, copy.user_image_prefixes) == (
        starter.framework, starter.default_env, [f"{TEAM}/"]
    )  # fmt: skip
    call_command("container_image", "pt-c", "--disable", stdout=StringIO())
    copy.refresh_from_db()
    assert (copy.enabled, copy.container_image) == (False, "localhost/t:1")  # the rest kept
    with pytest.raises(CommandError, match="container_image: '--x' is not an image reference"):
        call_command("container_image", "pt-c", "--reference=--x", stdout=StringIO())
    with pytest.raises(CommandError, match=r"No image .nope.: --like names what to copy\."):
        call_command("container_image", "nope", "--disable")
