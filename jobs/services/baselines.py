"""Baselines: the earlier run a job is compared with, and which runs are fair to compare.

Any earlier job can be a curve baseline ("curve fitting": a good run's curves, which a new run
should lie on); one on another trainer count is expected to draw other curves, and is judged on
its final accuracy instead. Speedup, efficiency and samples-per-dollar ratios only mean
something against a single-trainer run of the same image, program and package, so the console
says when a baseline is not one, and offers to launch one.
"""

import logging

from django.contrib.auth.models import User
from django.db import transaction

from jobs.access import visible_jobs
from jobs.models import Job, JobRole
from jobs.services import figures, rerun, submission

log = logging.getLogger(__name__)


class BaselineError(ValueError):
    pass


def compute_role(job: Job) -> JobRole | None:
    """The role whose instances do the training: workers where there are any, else the master.

    Reads job.roles.all(), so a caller comparing many jobs prefetches their roles once."""
    roles = {r.role: r for r in job.roles.all()}
    return roles.get("worker") or roles.get("master")


def worker_count(job: Job) -> int:
    """Trainers: every PyTorch instance (the master is rank 0 and trains like the others), or
    a parameter-server job's workers (its scheduler and servers do not train)."""
    roles = {r.role: r for r in job.roles.all()}
    if job.kvstore:
        return roles["worker"].instances if "worker" in roles else 0
    return sum(r.instances for r in roles.values())


def same_program(a: Job, b: Job) -> bool:
    role_a, role_b = compute_role(a), compute_role(b)
    return (
        a.image_id == b.image_id
        and a.script == b.script
        and a.kvstore == b.kvstore
        and role_a is not None
        and role_b is not None
        and role_a.package_id == role_b.package_id
    )


def why_not_a_speedup_baseline(job: Job, baseline: Job) -> str | None:
    """None when `baseline` is a single-worker run of the job's image, program and package."""
    if not same_program(job, baseline):
        return (
            f"job {baseline.pk} is not the same image, program and package as job {job.pk}, "
            "so throughput ratios would compare different things"
        )
    if worker_count(baseline) != 1:
        return (
            f"job {baseline.pk} ran {worker_count(baseline)} trainers; speedup needs a "
            "1-trainer run"
        )
    return None


def _trainers(n: int) -> str:
    return f"{n} trainer{'' if n == 1 else 's'}"


def curves_differ_by_design(job: Job, baseline: Job) -> figures.Different | None:
    """Why `baseline`'s loss and learning-rate curves are not expected to lie on the job's, or
    None where they are. On another trainer count each step averages another number of samples
    (another global batch) and takes another share of an epoch, and the examples scale their
    learning rate with it: the curves differ by design, while the final accuracy should not."""
    ours, theirs = worker_count(job), worker_count(baseline)
    if ours == theirs:
        return None
    return figures.Different(
        f"The baseline's curves differ by design: it ran {_trainers(theirs)} and this job "
        f"{_trainers(ours)}, so each step averaged a different global batch. The runs are "
        "compared on what should still match: the final accuracy, and the time to reach it."
    )


def set_baseline(user: User, job: Job, baseline_id: int | None) -> Job:
    """Compare `job` with an earlier job the user can see (or with none)."""
    if baseline_id is None:
        job.baseline = None
    else:
        baseline = visible_jobs(user).filter(pk=baseline_id).first()
        if baseline is None:
            raise BaselineError(f"No job {baseline_id} that you can see.")
        if baseline.pk == job.pk:
            raise BaselineError("A job cannot be its own baseline.")
        job.baseline = baseline
    job.save(update_fields=["baseline"])
    return job


def launch_single_worker_baseline(user: User, job: Job) -> Job:
    """Submit a 1-trainer copy of `job` (same image, program, arguments and package) and make it
    the job's baseline; quota rules apply as for any submission."""
    role = compute_role(job)
    if role is None:
        raise BaselineError("The job has no role to copy.")
    roles: dict[str, dict[str, object]]
    if job.kvstore:
        server = job.roles.get(role="server")
        roles = {
            "server": {"package": server.package.name, "instances": 1},
            "worker": {"package": role.package.name, "instances": 1},
        }
    else:
        roles = {"master": {"package": role.package.name, "instances": 1}}
    request = {
        "name": f"{job.name} · 1-trainer baseline"[:200],
        "image": job.image.name,
        "program": {
            "script": job.script,
            "args": list(job.args),
            "snapshot": job.program.get("snapshot"),
        },
        "roles": roles,
        "metrics": list(job.metric_definitions),
        # What "Run again" copies: another user's masked values stay theirs.
        "env": rerun.copyable_env(job, user),
    }
    if job.kvstore:
        request["kvstore"] = job.kvstore
    checked = submission.check_job_request(request, owner=user)
    with transaction.atomic():
        baseline = submission.submit_job(user, checked)
        set_baseline(user, job, baseline.pk)
    log.info("job %s: launched 1-trainer baseline %s", job.pk, baseline.pk)
    return baseline
