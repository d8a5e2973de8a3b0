"""Retention (jobs.services.retention, `manage.py prune`, POST /api/v1/jobs/ID/retention), with
the clock moved forward: `now` handed to the service, or the jobs' end times set in the past."""

import io
import tarfile
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

from jobs.models import ApiToken, CodeSnapshot, CodeUpload, Job, LogChunk, MetricPoint, Node
from jobs.services import deletion, retention, snapshots, storage
from tests.unit.helpers import SentTasks, job_request
from workers import contract

pytestmark = pytest.mark.usefixtures("catalog", "nodes", "redis_url", "sent_tasks")

DAY = timedelta(days=1)


@pytest.fixture(autouse=True)
def default_days(settings: Any) -> None:
    settings.TRAINYARD_LOG_RETENTION_DAYS = 90


def auth(user: User) -> dict[str, Any]:
    return {"HTTP_AUTHORIZATION": f"Token {ApiToken.issue(user)}"}


def submitted(client: Client, user: User, **overrides: Any) -> Job:
    response = client.post(
        "/api/v1/jobs",
        job_request(instances=2, **overrides),
        content_type="application/json",
        **auth(user),
    )
    assert response.status_code == 201, response.content
    return Job.objects.get(pk=response.json()["id"])


def ended(job: Job, at: datetime, **fields: Any) -> Job:
    """The job as if it had succeeded at `at`, with a log and metrics archived."""
    Job.objects.filter(pk=job.pk).update(
        state=Job.State.SUCCEEDED, finished=at, log_complete=True, log_archived=True, **fields
    )
    for cursor in (1, 2):
        LogChunk.objects.create(
            job=job, first_cursor=cursor, last_cursor=cursor, role="master", text="loss 0.5"
        )
        MetricPoint.objects.create(
            job=job, cursor=100 + cursor, role="master", index=0, name="loss", value=0.5, ts=1.0
        )
    job.refresh_from_db()
    return job


def finished_at(job: Job) -> datetime:
    assert job.finished is not None
    return job.finished


def archived(job: Job) -> tuple[int, int]:
    return (
        LogChunk.objects.filter(job=job).count(),
        MetricPoint.objects.filter(job=job).count(),
    )


def test_it_removes_expired_logs_and_metrics_and_spares_kept_and_recent_jobs(
    client: Client, alice: User
) -> None:
    now = timezone.now()
    old = ended(submitted(client, alice), now - 10 * DAY)
    kept = ended(submitted(client, alice), now - 10 * DAY, keep=True)
    forever = ended(submitted(client, alice), now - 10 * DAY, log_retention_days=0)
    longer = ended(submitted(client, alice), now - 10 * DAY, log_retention_days=200)
    shorter = ended(submitted(client, alice), now - 10 * DAY, log_retention_days=3)
    recent = ended(submitted(client, alice), now - DAY)
    running = submitted(client, alice)

    # Today only the job with 3 days of its own has expired; 85 days on, the one that ended ten
    # days ago under the default 90 too, but not the one that ended yesterday.
    assert [item.job_id for item in retention.plan(now).logs] == [shorter.pk]
    later = now + 85 * DAY
    gone = retention.prune(later)

    assert sorted(item.job_id for item in gone.logs) == sorted([old.pk, shorter.pk])
    for job in (old, shorter):
        assert archived(job) == (0, 0)
        job.refresh_from_db()
        assert job.logs_pruned == later  # the Job row stays, and says when they went
    for job in (kept, forever, longer, recent):
        assert archived(job) == (2, 2)
    for job in (kept, forever, longer, recent, running):
        job.refresh_from_db()
        assert job.logs_pruned is None
    # A second pass finds nothing more: what went is not listed again.
    assert retention.plan(later).empty


def test_it_keeps_a_job_kept_between_the_listing_and_the_removal(
    client: Client, alice: User
) -> None:
    now = timezone.now()
    job = ended(submitted(client, alice), now - 100 * DAY)
    assert [item.job_id for item in retention.plan(now).logs] == [job.pk]
    planned = retention.plan(now)
    retention.set_retention(job.pk, keep=True, days=None)
    assert all(not retention._remove_log(item, now) for item in planned.logs)
    assert archived(job) == (2, 2)


def folder_archive(tmp_path: Path, version: str) -> bytes:
    root = tmp_path / version
    root.mkdir()
    (root / "train.py").write_text(f"print('version {version}')\n")
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:gz") as tar:
        tar.add(root, arcname=".")
    return data.getvalue()


def test_it_collects_snapshots_that_no_job_and_no_upload_names(
    client: Client, alice: User, tmp_path: Path
) -> None:
    listed = snapshots.store_upload(alice, io.BytesIO(folder_archive(tmp_path, "listed")))
    run = snapshots.store_upload(alice, io.BytesIO(folder_archive(tmp_path, "run")))
    orphan = snapshots.store_upload(alice, io.BytesIO(folder_archive(tmp_path, "orphan")))
    program = {"script": "train.py", "args": []}
    runner = submitted(client, alice, program=program | {"snapshot": run.upload.snapshot.sha256})
    deleted = submitted(
        client, alice, program=program | {"snapshot": orphan.upload.snapshot.sha256}
    )
    # Forgotten by its uploader, the "run" one stays for the job that ran it; the orphan's last
    # job is then deleted (by an admin), so nothing names it any more.
    for stored in (run, orphan):
        assert snapshots.forget_upload(alice, stored.upload.snapshot.sha256)
    deleted.delete()
    # One that nothing names but that was stored a moment ago: an upload in progress.
    young_row = CodeSnapshot.objects.create(
        sha256="f" * 64, archive=b"x", size=1, unpacked_size=1, files=["a.py"]
    )
    CodeSnapshot.objects.exclude(pk=young_row.pk).update(created=timezone.now() - 2 * DAY)

    gone = retention.prune()

    assert [item.sha256 for item in gone.snapshots] == [orphan.upload.snapshot.sha256]
    remaining = set(CodeSnapshot.objects.values_list("sha256", flat=True))
    assert remaining == {
        listed.upload.snapshot.sha256,
        run.upload.snapshot.sha256,
        young_row.sha256,
    }
    assert CodeUpload.objects.filter(snapshot__sha256=listed.upload.snapshot.sha256).exists()
    assert Job.objects.filter(pk=runner.pk, snapshot__sha256=run.upload.snapshot.sha256).exists()


def test_prune_dry_run_lists_exactly_what_a_real_run_then_removes(
    client: Client, alice: User, bob: User, tmp_path: Path
) -> None:
    now = timezone.now()
    expired = [ended(submitted(client, user), now - 100 * DAY) for user in (alice, bob, alice)]
    ended(submitted(client, alice), now - 100 * DAY, keep=True)
    ended(submitted(client, bob), now - 5 * DAY)
    loose = snapshots.store_upload(bob, io.BytesIO(folder_archive(tmp_path, "loose")))
    job = submitted(
        client,
        bob,
        program={"script": "train.py", "args": [], "snapshot": loose.upload.snapshot.sha256},
    )
    snapshots.forget_upload(bob, loose.upload.snapshot.sha256)
    job.delete()
    CodeSnapshot.objects.update(created=now - 2 * DAY)
    before = (LogChunk.objects.count(), MetricPoint.objects.count(), CodeSnapshot.objects.count())

    dry = io.StringIO()
    call_command("prune", "--dry-run", stdout=dry)
    assert (
        LogChunk.objects.count(),
        MetricPoint.objects.count(),
        CodeSnapshot.objects.count(),
    ) == before  # a dry run removes nothing
    real = io.StringIO()
    call_command("prune", stdout=real)

    would = dry.getvalue().splitlines()
    did = real.getvalue().splitlines()
    assert len(would) == len(expired) + 1 + 1  # three jobs, one snapshot, the total
    assert [line.replace("would remove", "removed", 1) for line in would] == did
    for job in expired:
        assert f"job {job.pk} ({job.owner.username})" in real.getvalue()
        assert archived(job) == (0, 0)
    assert loose.upload.snapshot.sha256[:12] in real.getvalue()
    assert not CodeSnapshot.objects.filter(sha256=loose.upload.snapshot.sha256).exists()
    # Left: the kept job's and the recent job's log and metrics.
    assert (LogChunk.objects.count(), MetricPoint.objects.count()) == (4, 4)
    again = io.StringIO()
    call_command("prune", "--dry-run", stdout=again)
    assert again.getvalue().splitlines() == [
        "would remove the logs and metrics of 0 jobs and 0 code snapshots"
    ]


def test_it_sets_a_jobs_retention_through_the_api(client: Client, alice: User) -> None:
    job = ended(submitted(client, alice), timezone.now() - DAY)
    detail = client.get(f"/api/v1/jobs/{job.pk}", **auth(alice)).json()
    assert detail["retention"] == {
        "keep": False,
        "days": 90,
        "own_days": False,
        "expires": (finished_at(job) + 90 * DAY).isoformat(),
        "pruned": None,
    }

    response = client.post(
        f"/api/v1/jobs/{job.pk}/retention",
        {"keep": True},
        content_type="application/json",
        **auth(alice),
    )
    assert response.status_code == 200, response.content
    assert response.json()["retention"] | {"expires": "-"} == {
        "keep": True,
        "days": 90,
        "own_days": False,
        "expires": "-",
    } | {"pruned": None}
    assert response.json()["retention"]["expires"] is None
    job.refresh_from_db()
    assert (job.keep, job.log_retention_days) == (True, None)

    # Either field alone leaves the other as it was.
    response = client.post(
        f"/api/v1/jobs/{job.pk}/retention",
        {"days": 7},
        content_type="application/json",
        **auth(alice),
    )
    assert response.json()["retention"]["expires"] is None  # still kept
    job.refresh_from_db()
    assert (job.keep, job.log_retention_days) == (True, 7)
    response = client.post(
        f"/api/v1/jobs/{job.pk}/retention",
        {"keep": False},
        content_type="application/json",
        **auth(alice),
    )
    assert response.json()["retention"]["own_days"] is True
    finished = job.finished
    assert finished is not None
    assert response.json()["retention"]["expires"] == (finished + 7 * DAY).isoformat()
    job.refresh_from_db()
    assert (job.keep, job.log_retention_days) == (False, 7)
    response = client.post(
        f"/api/v1/jobs/{job.pk}/retention",
        {"days": None},
        content_type="application/json",
        **auth(alice),
    )
    assert response.json()["retention"]["days"] == 90
    job.refresh_from_db()
    assert (job.keep, job.log_retention_days) == (False, None)


@pytest.mark.parametrize(
    "body",
    [
        {"days": -1},
        {"days": 36501},
        {"days": "7"},
        {"keep": "yes"},
        {"keep": None},
        {"keep": True, "forever": 1},
    ],
)
def test_it_refuses_bad_retention_and_changes_nothing(
    client: Client, alice: User, body: dict[str, Any]
) -> None:
    job = ended(submitted(client, alice), timezone.now() - DAY)
    response = client.post(
        f"/api/v1/jobs/{job.pk}/retention", body, content_type="application/json", **auth(alice)
    )
    assert response.status_code == 400, response.content
    field = next(name for name in ("forever", "days", "keep") if name in body)
    assert response.json()["errors"] == {
        "request" if field == "forever" else field: [
            {
                "days": "Give a whole number of days from 0 (forever) to 36500, or null for "
                "the default.",
                "keep": "Give true or false.",
                "forever": "Unknown field(s): forever.",
            }[field]
        ]
    }
    job.refresh_from_db()
    assert (job.keep, job.log_retention_days) == (False, None)


def test_it_does_not_let_another_user_keep_a_job(client: Client, alice: User, bob: User) -> None:
    job = ended(submitted(client, alice), timezone.now() - DAY)
    response = client.post(
        f"/api/v1/jobs/{job.pk}/retention",
        {"keep": True},
        content_type="application/json",
        **auth(bob),
    )
    assert response.status_code == 404
    job.refresh_from_db()
    assert job.keep is False


def test_the_workers_loop_prunes(client: Client, alice: User) -> None:
    job = ended(submitted(client, alice), timezone.now() - 100 * DAY)
    outcome = retention.RetentionLoop(3600).run_once()
    assert outcome is not None and [item.job_id for item in outcome.logs] == [job.pk]
    assert archived(job) == (0, 0)


def test_admins_see_storage_per_user_and_per_job_and_when_it_goes(
    client: Client, alice: User, bob: User, tmp_path: Path
) -> None:
    now = timezone.now()
    alices = ended(submitted(client, alice), now - DAY)
    kept = ended(submitted(client, alice), now - DAY, keep=True)
    bobs = ended(submitted(client, bob), now - DAY)
    stored = snapshots.store_upload(bob, io.BytesIO(folder_archive(tmp_path, "bob")))

    jobs = {row.job_id: row for row in storage.per_job()}
    assert set(jobs) == {alices.pk, kept.pk, bobs.pk}
    assert (jobs[alices.pk].log_characters, jobs[alices.pk].metric_points) == (16, 2)
    assert jobs[alices.pk].expires == finished_at(alices) + 90 * DAY
    assert jobs[kept.pk].expires is None
    users = {row.owner: row for row in storage.per_user()}
    assert (users["alice"].jobs, users["alice"].log_characters, users["alice"].snapshots) == (
        2,
        32,
        0,
    )
    assert (users["bob"].jobs, users["bob"].snapshot_bytes) == (1, stored.upload.snapshot.size)

    out = io.StringIO()
    call_command("storage", stdout=out)
    printed = out.getvalue()
    assert "alice" in printed and "bob" in printed
    assert f"{(finished_at(alices) + 90 * DAY):%Y-%m-%d %H:%M}" in printed
    assert "never" in printed  # the kept job


def test_it_keeps_a_job_from_its_page(client: Client, alice: User) -> None:
    job = ended(submitted(client, alice), timezone.now() - DAY)
    client.force_login(alice)
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert "log and metrics removed after" in page
    response = client.post(f"/jobs/{job.pk}/retention/", {"keep": "on", "days": ""})
    assert response.status_code == 302
    job.refresh_from_db()
    assert (job.keep, job.log_retention_days) == (True, None)
    assert (
        "its log and metrics are never removed" in client.get(f"/jobs/{job.pk}/").content.decode()
    )
    client.post(f"/jobs/{job.pk}/retention/", {"days": "0"})
    job.refresh_from_db()
    assert (job.keep, job.log_retention_days) == (False, 0)
    assert "log and metrics kept forever" in client.get(f"/jobs/{job.pk}/").content.decode()


def test_the_page_refuses_bad_days_and_changes_nothing(client: Client, alice: User) -> None:
    job = ended(submitted(client, alice), timezone.now() - DAY)
    client.force_login(alice)
    response = client.post(f"/jobs/{job.pk}/retention/", {"keep": "on", "days": "-3"}, follow=True)
    assert "days: Ensure this value is greater than or equal to 0." in response.content.decode()
    job.refresh_from_db()
    assert (job.keep, job.log_retention_days) == (False, None)


def test_the_page_says_when_the_log_went(client: Client, alice: User) -> None:
    job = ended(submitted(client, alice), timezone.now() - 100 * DAY)
    retention.prune()
    client.force_login(alice)
    assert "log and metrics removed <time" in client.get(f"/jobs/{job.pk}/").content.decode()
    other = client.post(f"/jobs/{job.pk}/retention/", {"keep": "on"})
    assert other.status_code == 302


def test_another_user_cannot_keep_a_job_from_the_page(
    client: Client, alice: User, bob: User
) -> None:
    job = ended(submitted(client, alice), timezone.now() - DAY)
    client.force_login(bob)
    assert client.post(f"/jobs/{job.pk}/retention/", {"keep": "on"}).status_code == 404
    job.refresh_from_db()
    assert job.keep is False


def test_deleting_an_ended_job_asks_its_nodes_to_remove_its_checkpoints(
    client: Client,
    alice: User,
    charlie_admin: User,
    sent_tasks: SentTasks,
    django_capture_on_commit_callbacks: Any,
) -> None:
    job = ended(submitted(client, alice), timezone.now() - DAY)
    # It ran on both nodes.
    first, second = Node.objects.order_by("name")[:2]
    job.replicas.filter(role="master").update(node=first)
    job.replicas.filter(role="worker").update(node=second)
    nodes = [first.name, second.name]
    client.force_login(charlie_admin)
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(f"/admin/jobs/job/{job.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302
    assert not Job.objects.filter(pk=job.pk).exists()
    asked = sent_tasks.named(contract.TASK_REMOVE_CHECKPOINTS)
    assert [(kwargs, queue) for _, kwargs, queue in asked] == [
        ({"job_id": job.pk, "checkpoint_key": job.checkpoint_key}, contract.node_queue(node))
        for node in nodes
    ]


def test_an_expired_jobs_nodes_are_asked_to_remove_its_working_folder(
    client: Client,
    alice: User,
    sent_tasks: SentTasks,
    django_capture_on_commit_callbacks: Any,
) -> None:
    now = timezone.now()
    job = ended(submitted(client, alice), now - 100 * DAY)
    first, second = Node.objects.order_by("name")[:2]
    job.replicas.filter(role="master").update(node=first)
    job.replicas.filter(role="worker").update(node=second)
    kept = ended(submitted(client, alice), now - 100 * DAY, keep=True)
    kept.replicas.update(node=first)
    with django_capture_on_commit_callbacks(execute=True):
        assert [item.job_id for item in retention.prune(now).logs] == [job.pk]
    asked = sent_tasks.named(contract.TASK_REMOVE_WORKING_FOLDER)
    assert [(kwargs, queue) for _, kwargs, queue in asked] == [
        ({"job_id": job.pk, "checkpoint_key": job.checkpoint_key}, contract.node_queue(node))
        for node in (first.name, second.name)
    ]  # and never the kept job's
    # Its checkpoints stay until the job is deleted.
    assert sent_tasks.named(contract.TASK_REMOVE_CHECKPOINTS) == []


def test_a_job_that_may_still_run_cannot_be_deleted(
    client: Client, alice: User, charlie_admin: User, sent_tasks: SentTasks
) -> None:
    job = submitted(client, alice)
    client.force_login(charlie_admin)
    response = client.post(f"/admin/jobs/job/{job.pk}/delete/", {"post": "yes"})
    assert response.status_code == 403
    with pytest.raises(deletion.JobStillActive):
        deletion.delete_job(job.pk)
    assert Job.objects.filter(pk=job.pk).exists()
    assert sent_tasks.named(contract.TASK_REMOVE_CHECKPOINTS) == []
