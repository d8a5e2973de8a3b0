"""A job's own environment variables: taken, refused when they name the platform's, passed to
every instance, and shown masked (where they look secret) to anyone but the owner."""

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from jobs.models import ApiToken, Job
from tests.unit.helpers import SentTasks, job_request
from workers import contract

pytestmark = pytest.mark.usefixtures("catalog", "code_root", "nodes", "redis_url", "sent_tasks")

ENV = {"DATA_DIR": "/mnt/data", "WANDB_API_KEY": "0123abcd", "HF_TOKEN": "hf_x", "SEED": "7"}


def submit(client: Client, user: User, env: Any) -> Any:
    return client.post(
        "/api/v1/jobs",
        job_request(instances=2, env=env),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Token {ApiToken.issue(user)}",
    )


def as_seen_by(client: Client, user: User, job_id: int) -> dict[str, str]:
    response = client.get(
        f"/api/v1/jobs/{job_id}", HTTP_AUTHORIZATION=f"Token {ApiToken.issue(user)}"
    )
    assert response.status_code == 200
    env: dict[str, str] = response.json()["env"]
    return env


def test_every_instance_gets_the_jobs_variables(
    client: Client,
    alice: User,
    sent_tasks: SentTasks,
    django_capture_on_commit_callbacks: Any,
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        response = submit(client, alice, ENV)
    assert response.status_code == 201, response.content
    assert Job.objects.get().env == ENV
    specs = [kw["spec"] for _, kw, _ in sent_tasks.named(contract.TASK_START_REPLICA)]
    # Under the image's defaults (tests/unit/test_image_env.py).
    assert [s["extra_env"] for s in specs] == [{"ACCELERATE_USE_CPU": "true", **ENV}] * 2


def test_the_owner_sees_the_values_and_an_admin_sees_secrets_masked(
    client: Client, alice: User, charlie_admin: User
) -> None:
    job_id = submit(client, alice, ENV).json()["id"]
    assert as_seen_by(client, alice, job_id) == ENV
    assert as_seen_by(client, charlie_admin, job_id) == {
        "DATA_DIR": "/mnt/data",
        "WANDB_API_KEY": "••••••••",
        "HF_TOKEN": "••••••••",
        "SEED": "7",
    }
    listed = client.get(
        "/api/v1/jobs", HTTP_AUTHORIZATION=f"Token {ApiToken.issue(charlie_admin)}"
    ).json()
    assert listed["jobs"][0]["env"]["HF_TOKEN"] == "••••••••"


@pytest.mark.parametrize(
    ("env", "field", "message"),
    [
        (
            {"MASTER_ADDR": "10.0.0.1"},
            "env",
            "MASTER_ADDR is set by the platform (see the README's \"What a trainer process "
            'gets"); pick another name.',
        ),
        (
            {"TORCHELASTIC_RUN_ID": "x"},
            "env",
            "TORCHELASTIC_RUN_ID is set by the platform (see the README's \"What a trainer "
            'process gets"); pick another name.',
        ),
        (
            {"1BAD": "x"},
            "env",
            "'1BAD' is not a variable name (letters, digits and _, not starting with a digit).",
        ),
        *(
            (
                {name: "/work/.code/evil.so"},
                "env",
                f"{name} is read by the dynamic loader or the C library, so a job may not set "
                "it; an admin may set it in the image's defaults (see docs/security.md).",
            )
            for name in (
                "LD_PRELOAD",
                "LD_LIBRARY_PATH",
                "LD_AUDIT",
                "GCONV_PATH",
                "GLIBC_TUNABLES",
                "MALLOC_CHECK_",
                "LOCPATH",
            )
        ),
        ({"SEED": 7}, "env.SEED", "Values of environment variables are strings."),
        (["SEED=7"], "env", "Give the environment as {NAME: value}, values as strings."),
    ],
)
def test_a_bad_variable_is_refused_and_nothing_is_created(
    client: Client, alice: User, env: Any, field: str, message: str
) -> None:
    response = submit(client, alice, env)
    assert response.status_code == 400
    assert response.json()["errors"][field] == [message]
    assert Job.objects.count() == 0
