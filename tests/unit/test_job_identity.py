"""The Unix identity a job runs as, and the folders it names, on the console's side: resolved
at submission and kept on the job (so every attempt runs as the same person), sent to the
agents in every start, said on the job's page and in its API; refused at submission, by field,
where the person may not have them or the identity is root's or a system account's."""

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from jobs.forms import NewJobForm
from jobs.models import Node, UnixAccount
from jobs.services import rerun
from jobs.services.submission import ValidationFailed, check_job_request, submit_job
from tests.unit import test_named_folders
from tests.unit.helpers import SentTasks, job_request
from tests.unit.test_named_folders import TeamTree
from tests.unit.test_restarts import start_all
from trainyard_cli import jobfile
from workers import contract

pytestmark = pytest.mark.usefixtures("catalog", "code_root", "redis_url")

Capture = Callable[..., Any]
team_tree = test_named_folders.team_tree  # a team's folders, as a site makes them


def ada_account(user: User, uid: int = 20001) -> UnixAccount:
    return UnixAccount.objects.create(
        user=user, username="ada", uid=uid, gid=20001, groups=[30000, 30001], from_directory=True
    )


def test_a_person_with_a_unix_identity_has_every_start_sent_as_them(
    alice: User,
    nodes: list[Node],
    sent_tasks: SentTasks,
    django_capture_on_commit_callbacks: Capture,
    client: Client,
    tmp_path: Path,
) -> None:
    ada_account(alice)
    elsewhere = "/shared/datasets/vision"  # not on the console host: the nodes answer for it
    request = job_request(2, data=[elsewhere], results="/shared/results/vision")
    with django_capture_on_commit_callbacks(execute=True):
        job = submit_job(alice, check_job_request(request))
    assert (job.run_uid, job.run_gid, job.run_groups) == (20001, 20001, [20001, 30000, 30001])
    start_all(job, django_capture_on_commit_callbacks)
    specs = [s["spec"] for _, s, _ in sent_tasks.named(contract.TASK_START_REPLICA)]
    assert len(specs) == 2
    for spec in specs:
        assert (spec["run_uid"], spec["run_gid"], spec["run_groups"]) == (
            20001, 20001, [20001, 30000, 30001]
        )  # fmt: skip
        assert (spec["data_folders"], spec["results_folder"]) == (
            [elsewhere], "/shared/results/vision"
        )  # fmt: skip
    client.force_login(alice)
    shown = client.get(f"/api/v1/jobs/{job.pk}").json()
    assert shown["run_as"] == {"uid": 20001, "gid": 20001, "groups": [20001, 30000, 30001]}
    assert (shown["data"], shown["results"]) == ([elsewhere], "/shared/results/vision")
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert "uid 20001, gid 20001, groups 20001,30000,30001: the owner's Unix identity" in page
    assert f"<code>{elsewhere}</code>, read-only" in page
    # Run again keeps the folders, and so does the Edit-and-run-again form.
    body = rerun.request_of(job, alice)
    assert (body["data"], body["results"]) == ([elsewhere], "/shared/results/vision")
    form = NewJobForm(user=alice)
    form.fill_from(body)
    assert (form.initial["data_folders"], form.initial["results_folder"]) == (
        elsewhere, "/shared/results/vision"
    )  # fmt: skip


def test_without_a_unix_identity_a_job_runs_as_a_uid_of_trainyards_own_and_says_so(
    alice: User,
    nodes: list[Node],
    sent_tasks: SentTasks,
    django_capture_on_commit_callbacks: Capture,
    client: Client,
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        job = submit_job(alice, check_job_request(job_request(1)))
    start_all(job, django_capture_on_commit_callbacks)
    (spec,) = [s["spec"] for _, s, _ in sent_tasks.named(contract.TASK_START_REPLICA)]
    assert spec["run_uid"] == -1  # none: the agent gives its uid_base + the owner's id
    client.force_login(alice)
    assert client.get(f"/api/v1/jobs/{job.pk}").json()["run_as"] is None
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert "a uid of Trainyard's own on each node" in page
    with pytest.raises(ValidationFailed) as refused:
        submit_job(alice, check_job_request(job_request(1, data=["/shared/datasets/vision"])))
    assert "the console knows none of yours" in refused.value.errors["data"][0]


def test_root_or_a_system_account_never_gets_a_job_whatever_the_directory_says(
    alice: User, nodes: list[Node]
) -> None:
    ada_account(alice, uid=0)
    with pytest.raises(ValidationFailed) as refused:
        submit_job(alice, check_job_request(job_request(1)))
    assert refused.value.errors == {
        "identity": [
            "the Unix identity of alice has uid 0: root and system accounts (uid below 1000) "
            "never run jobs."
        ]
    }


def test_folder_names_are_checked_by_field(alice: User, nodes: list[Node]) -> None:
    request = job_request(1, data=["relative/path", "/a/../b", "/"], results="/shared/results/")
    with pytest.raises(ValidationFailed) as refused:
        check_job_request(request)
    assert refused.value.errors == {
        "data": [
            "Data folder: 'relative/path' is not an absolute path.",
            "Data folder: '/a/../b' is not in its plain form ('/b': no '..', '.', '//').",
            "Data folder: the whole file system is not a folder a job may name.",
        ],
        "results": [
            "Results folder: '/shared/results/' is not in its plain form ('/shared/results': "
            "no '..', '.', '//')."
        ],
    }
    # One folder may be given as a string, as a job file's `data: /shared/datasets/vision`.
    assert check_job_request(job_request(1, data="/x/y")).data_folders == ("/x/y",)


def test_the_form_and_the_cli_send_them(alice: User, nodes: list[Node]) -> None:
    form = NewJobForm(user=alice, data={
        "name": "n", "image": "pytorch:2.13-cpu", "script": "digits-ddp", "package": "cpu-1",
        "instances": 1, "data_folders": "/shared/a\n\n /shared/b \n",
        "results_folder": " /shared/out ",
    })  # fmt: skip
    assert form.is_valid(), form.errors
    request = form.as_request()
    assert (request["data"], request["results"]) == (["/shared/a", "/shared/b"], "/shared/out")
    body = jobfile.apply_flags(
        {"name": "n", "data": ["/from/file"]},
        name=None, image=None, script=None, args=[], roles=[], kvstore=None, env=[],
        restart_policy=None, max_restarts=None, data=["/shared/a"], results="/shared/out",
    )  # fmt: skip
    assert (body["data"], body["results"]) == (["/shared/a"], "/shared/out")


def test_a_folder_the_console_cannot_see_goes_through_only_where_they_could_look(
    alice: User, nodes: list[Node], team_tree: TeamTree
) -> None:
    UnixAccount.objects.create(user=alice, username="grace", uid=20002, gid=20002, groups=[30000])
    hidden = str(team_tree.vision / "not-there")
    with pytest.raises(ValidationFailed) as refused:
        submit_job(alice, check_job_request(job_request(1, data=[hidden])))
    assert refused.value.errors["data"] == [
        f"{hidden}: uid 20002, gid 20002, groups 30000 (the owner's own) may not read it, or it "
        "is no folder here."
    ]
    # Not on this host, and nothing closed to her above it: the nodes answer for it.
    assert submit_job(alice, check_job_request(job_request(1, data=["/nowhere/x"]))).pk
