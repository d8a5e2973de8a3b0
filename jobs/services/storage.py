"""What the database holds for each job and each user, and when retention removes it: the
admins' view of storage (`manage.py storage`). Sizes of logs are in characters, as the
database stores text; a code snapshot's is its archive's bytes."""

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime

from django.db.models import Count, Sum
from django.db.models.functions import Length

from jobs.models import CodeUpload, Job, LogChunk, MetricPoint
from jobs.services import retention


@dataclass(frozen=True)
class JobStorage:
    job_id: int
    owner: str
    state: str
    log_characters: int
    metric_points: int
    # When its log and metrics go; None: never (kept, 0 days), or not yet known (it runs).
    expires: datetime | None
    pruned: datetime | None


@dataclass(frozen=True)
class UserStorage:
    owner: str
    jobs: int
    log_characters: int
    metric_points: int
    # The snapshots the user lists (one held by several users counts for each of them).
    snapshots: int
    snapshot_bytes: int


def per_job() -> list[JobStorage]:
    """Every job that holds a log or metrics, the largest log first."""
    logs = dict(
        LogChunk.objects.values("job").annotate(n=Sum(Length("text"))).values_list("job", "n")
    )
    points = dict(MetricPoint.objects.values("job").annotate(n=Count("id")).values_list("job", "n"))
    jobs = Job.objects.filter(pk__in=set(logs) | set(points)).select_related("owner")
    rows = [
        JobStorage(
            job_id=job.pk,
            owner=job.owner.get_username(),
            state=job.state,
            log_characters=logs.get(job.pk) or 0,
            metric_points=points.get(job.pk) or 0,
            expires=retention.expires_at(job),
            pruned=job.logs_pruned,
        )
        for job in jobs
    ]
    return sorted(rows, key=lambda r: (-r.log_characters, -r.metric_points, r.job_id))


def per_user(jobs: list[JobStorage] | None = None) -> list[UserStorage]:
    """Each user who holds jobs' logs, metrics or code snapshots, the largest first."""
    jobs = per_job() if jobs is None else jobs
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0, 0])
    for row in jobs:
        total = totals[row.owner]
        total[0] += 1
        total[1] += row.log_characters
        total[2] += row.metric_points
    uploads = CodeUpload.objects.values_list("owner__username", "snapshot__size")
    for owner, size in uploads:
        totals[owner][3] += 1
        totals[owner][4] += size
    rows = [UserStorage(owner, *numbers) for owner, numbers in totals.items()]
    return sorted(rows, key=lambda r: (-(r.log_characters + r.snapshot_bytes), r.owner))
