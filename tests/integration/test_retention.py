"""Retention over the real stack: jobs that really ran (logs and metrics archived by the log
keeper), their end moved 100 days back in the database, then `manage.py prune --dry-run` and
`manage.py prune`, and `trainyard retention` keeping a job."""

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import RunningStack, pytorch_request, wait_until
from tests.integration.test_cli import QUOTA, logged_in, run_cli

pytestmark = pytest.mark.integration


def ended_long_ago(stack: RunningStack, *job_ids: int) -> None:
    """The clock moved forward: the jobs as if they had ended 100 days ago."""
    stack.stack.manage(
        "shell",
        "-c",
        "from datetime import timedelta; from django.utils import timezone; "
        "from jobs.models import Job; "
        f"Job.objects.filter(pk__in={list(job_ids)!r})"
        ".update(finished=timezone.now() - timedelta(days=100))",
    )


def archived_counts(stack: RunningStack, job_id: int) -> tuple[int, int]:
    out = stack.stack.manage(
        "shell",
        "-c",
        "from jobs.models import LogChunk, MetricPoint; "
        f"print(LogChunk.objects.filter(job_id={job_id}).count(), "
        f"MetricPoint.objects.filter(job_id={job_id}).count())",
    )
    # The last line: `shell` may say first what it imported.
    chunks, points = out.strip().splitlines()[-1].split()
    return int(chunks), int(points)


def test_prune_removes_what_its_dry_run_listed_and_spares_a_kept_job(
    stack: RunningStack, tmp_path: Path
) -> None:
    config = tmp_path / "config"
    user: Any = logged_in(stack, "retention-user", config)
    expiring = user.submit(pytorch_request("expiring", "report_metrics.py", 2))["id"]
    kept = user.submit(pytorch_request("kept", "report_metrics.py", 2))["id"]
    for job_id in (expiring, kept):
        job = user.wait(job_id, lambda j: j["log_archived"])
        assert job["state"] == "succeeded", job
    assert all(n > 0 for n in archived_counts(stack, expiring))
    workdirs = stack.stack.var_dir / "agents" / "checkpoints" / "workdirs"
    (expiring_folder,) = workdirs.glob(f"job-{expiring}-*")
    (kept_folder,) = workdirs.glob(f"job-{kept}-*")

    keep = run_cli("retention", str(kept), "--keep", config_dir=config)
    assert keep.returncode == 0, keep.stderr
    assert keep.stdout.strip() == f"Job {kept}: kept (log and metrics are never removed)"
    ended_long_ago(stack, expiring, kept)
    kept_before = archived_counts(stack, kept)

    dry = stack.stack.manage("prune", "--dry-run").splitlines()
    assert archived_counts(stack, expiring) != (0, 0)  # a dry run removes nothing
    real = stack.stack.manage("prune").splitlines()

    assert [line.replace("would remove", "removed", 1) for line in dry] == real
    assert real[-1] == "removed the logs and metrics of 1 jobs and 0 code snapshots"
    assert real[0].startswith(f"removed job {expiring} (retention-user): log ")
    assert archived_counts(stack, expiring) == (0, 0)
    assert archived_counts(stack, kept) == kept_before
    # Its working folder goes with its log (its nodes are asked); the kept job's stays.
    wait_until(f"job {expiring}'s working folder to go", lambda: not expiring_folder.exists())
    assert kept_folder.is_dir()
    # The job stays, and says when its log and metrics went; the kept one never expires.
    assert user.job(expiring)["retention"]["pruned"] is not None
    assert user.job(kept)["retention"] | {"pruned": None} == {
        "keep": True,
        "days": 90,
        "own_days": False,
        "expires": None,
        "pruned": None,
    }
    shown = run_cli("retention", str(expiring), config_dir=config)
    assert shown.stdout.startswith(f"Job {expiring}: log and metrics removed "), shown.stdout


def test_deleting_a_job_has_an_agent_remove_its_checkpoints_and_working_folder(
    stack: RunningStack,
) -> None:
    user = stack.create_user("checkpoint-owner", "a-long-password-1", quota=QUOTA)
    job_id = user.submit(pytorch_request("checkpointed", "checkpointer.py", 2))["id"]
    assert user.wait_finished(job_id)["state"] == "succeeded"
    agents = stack.stack.var_dir / "agents"
    (folder,) = agents.glob(f"checkpoints/job-{job_id}-*")
    (work,) = agents.glob(f"checkpoints/workdirs/job-{job_id}-*")
    assert (folder / "state.txt").read_text() == "attempt 0"
    assert list(agents.glob(f"*/jobs/{job_id}"))  # kept for inspection: among the last 20

    asked = stack.stack.manage(
        "shell", "-c", f"from jobs.services import deletion; print(deletion.delete_job({job_id}))"
    )
    assert "node" in asked.strip().splitlines()[-1]  # the nodes it ran on were asked
    wait_until(f"job {job_id}'s checkpoint folder to go", lambda: not folder.exists())
    wait_until(f"job {job_id}'s working folder to go", lambda: not work.exists())
    assert user.http.get(f"/api/v1/jobs/{job_id}").status_code == 404
