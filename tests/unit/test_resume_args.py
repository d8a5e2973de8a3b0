"""Arguments for later attempts (issue 47, item 3): what a restart runs with, checked at
submission, kept by Run again and the Edit-and-run-again form, and said per attempt."""

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from jobs.forms import NewJobForm
from jobs.models import Job, Node
from jobs.services import rerun
from jobs.services.submission import ValidationFailed, check_job_request, submit_job
from tests.unit.helpers import SentTasks, job_request
from tests.unit.test_restarts import exit_of, start_all
from workers import contract

pytestmark = pytest.mark.usefixtures("catalog", "code_root", "redis_url")

Capture = Callable[..., Any]
RESUME = ["--init_from=resume", "--epochs", "5"]


def started_args(sent: SentTasks) -> list[tuple[int, list[str]]]:
    return [
        (s["spec"]["attempt"], s["spec"]["args"])
        for _, s, _ in sent.named(contract.TASK_START_REPLICA)
    ]


def test_the_first_attempt_runs_the_jobs_arguments_and_a_restart_those_for_later_attempts(
    alice: User,
    nodes: list[Node],
    sent_tasks: SentTasks,
    django_capture_on_commit_callbacks: Capture,
    client: Client,
) -> None:
    capture = django_capture_on_commit_callbacks
    request = job_request(2)
    request["program"]["args"] = ["--init_from=scratch", "--epochs", "2"]
    request["restart"] = {"policy": "on-failure", "max_restarts": 1, "backoff_seconds": 0,
                          "args_on_resume": RESUME}  # fmt: skip
    with capture(execute=True):
        job = submit_job(alice, check_job_request(request))
    start_all(job, capture)
    exit_of(job, capture, "worker-1", "failed", 1, 0)
    exit_of(job, capture, "master", "stopped", -15, 0)
    start_all(job, capture)
    first = ["--init_from=scratch", "--epochs", "2"]
    later = ["--init_from=resume", "--epochs", "5"]
    assert started_args(sent_tasks) == [(0, first), (0, first), (1, later), (1, later)]

    client.force_login(alice)
    shown = client.get(f"/api/v1/jobs/{job.pk}").json()
    assert shown["restart"]["args_on_resume"] == RESUME
    assert [a["args"] for a in shown["attempts"]] == [first, later]
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert "<code>--init_from=resume --epochs 5</code>" in page


def test_run_again_and_the_edit_form_keep_them(alice: User, nodes: list[Node]) -> None:
    request = job_request(1, restart={"args_on_resume": ["--resume", "--tag", "it's"]})
    job = submit_job(alice, check_job_request(request))
    assert job.restart_policy == "never"  # the image's: arguments are kept whatever the policy
    body = rerun.request_of(job, alice)
    assert body["restart"]["args_on_resume"] == ["--resume", "--tag", "it's"]
    form = NewJobForm(user=alice)
    form.fill_from(body)
    assert form.initial["args_on_resume"] == "--resume --tag 'it'\"'\"'s'"
    # A job without them says nothing of them.
    plain = submit_job(alice, check_job_request(job_request(1)))
    assert "args_on_resume" not in rerun.request_of(plain, alice)["restart"]


def test_the_form_sends_them_split_as_a_shell_would(alice: User, nodes: list[Node]) -> None:
    form = NewJobForm(user=alice, data={
        "name": "n", "image": "pytorch:2.13-cpu", "script": "digits-ddp", "package": "cpu-1",
        "instances": 1, "args_on_resume": "--init_from=resume --note 'two words'",
    })  # fmt: skip
    assert form.is_valid(), form.errors
    assert form.as_request()["restart"] == {
        "args_on_resume": ["--init_from=resume", "--note", "two words"]
    }
    broken = NewJobForm(user=alice, data={**form.data, "args_on_resume": "--note 'unclosed"})
    assert not broken.is_valid()
    assert "Could not split the arguments" in broken.errors["args_on_resume"][0]


def test_bad_ones_are_refused_by_field(alice: User, nodes: list[Node]) -> None:
    request = job_request(1, restart={"args_on_resume": ["ok", "bad\x00"]})
    with pytest.raises(ValidationFailed) as refused:
        check_job_request(request)
    assert refused.value.errors == {
        "restart.args_on_resume.1": ["Text may not contain the NUL character (\\u0000)."]
    }
    too_many = job_request(1, restart={"args_on_resume": ["--x"] * 257})
    with pytest.raises(ValidationFailed) as refused:
        check_job_request(too_many)
    assert refused.value.errors == {"restart.args_on_resume": ["257 arguments; at most 256."]}
    assert not Job.objects.exists()
