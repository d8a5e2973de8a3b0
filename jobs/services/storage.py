"""What the database holds for each job and each user, and when retention removes it: the
admins' view of storage (`manage.py storage` and the Storage page, /storage/). Sizes of logs are
in characters of what the processes printed, as the database stores text (metrics are counted
in points); a code snapshot's is its archive's bytes."""

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime

from django.db.models import Count, Q, Sum
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

    @property
    def kept(self) -> bool:
        """It has ended and its log and metrics never go (kept, or 0 days); False while it runs
        and once they went."""
        return self.expires is None and self.pruned is None and self.state in Job.TERMINAL_STATES


@dataclass(frozen=True)
class UserStorage:
    owner: str
    jobs: int
    log_characters: int
    metric_points: int
    # The snapshots the user lists (one held by several users counts for each of them).
    snapshots: int
    snapshot_bytes: int


def per_job(include_pruned: bool = False) -> list[JobStorage]:
    """Every job that holds a log or metrics, the largest log first; with `include_pruned`,
    also those whose log and metrics retention removed (holding nothing, they come last)."""
    logs = dict(
        retention.log_text(LogChunk.objects.all())
        .values("job")
        .annotate(n=Sum(Length("text")))
        .values_list("job", "n")
    )
    points = dict(MetricPoint.objects.values("job").annotate(n=Count("id")).values_list("job", "n"))
    holding = Q(pk__in=set(logs) | set(points))
    if include_pruned:
        holding |= Q(logs_pruned__isnull=False)
    jobs = Job.objects.filter(holding).select_related("owner")
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
    """Each user who holds jobs' logs, metrics or code snapshots, the largest first. `jobs`
    may include pruned jobs (per_job(include_pruned=True)): only those that hold something
    count."""
    jobs = per_job() if jobs is None else jobs
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0, 0])
    for row in jobs:
        if row.pruned and not (row.log_characters or row.metric_points):
            continue  # it holds nothing any more
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
