"""Retention: the one place that decides what expires, and the one that removes it.

What goes (docs/operations.md):
- an ended job's log (LogChunk) and metrics (MetricPoint), `days` after it ended, where `days` is
  the job's own `log_retention_days` or else TRAINYARD_LOG_RETENTION_DAYS, and 0 means never; a
  kept job (`keep`) loses nothing. The Job row stays, with `logs_pruned` saying when they went.
- code snapshots that no job runs and no user lists (the last upload forgotten, or the last job
  that named it deleted), once they are older than SNAPSHOT_GRACE;
- with an ended job's log, its working folder on the shared checkpoint root (what its scripts
  saved where they started, workers/workfolder.py): the nodes it ran on are asked to remove it,
  after commit. Its checkpoint folder (TRAINYARD_CHECKPOINT_DIR) stays until the job is deleted.

`plan()` lists what would go at a moment; `prune()` removes exactly what `plan()` lists for the
same moment, each item re-checked under a lock as it goes (a job kept meanwhile stays), so that
`manage.py prune --dry-run` shows what a real run then removes. The console worker prunes on a
timer (RetentionLoop), as it reconciles; Determined's log_retention_days is the model.
"""

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from types import EllipsisType

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import ProtectedError, QuerySet, Sum
from django.db.models.functions import Length
from django.utils import timezone

from jobs import logstream
from jobs.models import CodeSnapshot, Job, LogChunk, MetricPoint
from jobs.services.agent_folders import ask_to_remove, nodes_that_ran
from jobs.services.periodic import PeriodicPass
from workers import contract

log = logging.getLogger(__name__)

# set_retention's "leave the days as they are" (None already means "the default").
Unchanged = EllipsisType

# A snapshot is stored a moment before its first upload row is written (snapshots.store_upload):
# one younger than this is never collected, so an upload in progress keeps its files.
SNAPSHOT_GRACE = timedelta(hours=1)


def log_text(chunks: QuerySet[LogChunk]) -> QuerySet[LogChunk]:
    """The chunks of what the processes printed: not the batches of metric points kept in the
    same table (their JSON is counted as points, not as a log's characters)."""
    return chunks.exclude(stream=logstream.METRIC)


@dataclass(frozen=True)
class ExpiredLog:
    """An ended job whose log and metrics are due to go."""

    job_id: int
    owner: str
    finished: datetime
    expired: datetime
    log_chunks: int
    log_characters: int
    metric_points: int

    def describe(self) -> str:
        return (
            f"job {self.job_id} ({self.owner}): log {self.log_chunks} chunks "
            f"{self.log_characters} characters, {self.metric_points} metric points; ended "
            f"{self.finished:%Y-%m-%d %H:%M}, expired {self.expired:%Y-%m-%d %H:%M}; "
            "and its working folder"
        )


@dataclass(frozen=True)
class LooseSnapshot:
    """A stored code snapshot that nothing names any more."""

    sha256: str
    size: int
    created: datetime

    def describe(self) -> str:
        return (
            f"snapshot {self.sha256[:12]}: {self.size} bytes, stored "
            f"{self.created:%Y-%m-%d %H:%M}, named by no job and no upload"
        )


@dataclass(frozen=True)
class Plan:
    logs: tuple[ExpiredLog, ...] = ()
    snapshots: tuple[LooseSnapshot, ...] = ()

    def lines(self) -> list[str]:
        return [item.describe() for item in self.logs] + [
            item.describe() for item in self.snapshots
        ]

    @property
    def empty(self) -> bool:
        return not self.logs and not self.snapshots


def retention_days(job: Job) -> int:
    """Days the job's log and metrics are kept after it ends; 0: forever."""
    if job.log_retention_days is not None:
        return job.log_retention_days
    return int(settings.TRAINYARD_LOG_RETENTION_DAYS)


def expires_at(job: Job) -> datetime | None:
    """When the job's log and metrics go; None while it runs, and for a kept one."""
    days = retention_days(job)
    if job.keep or days == 0 or job.finished is None or job.state not in Job.TERMINAL_STATES:
        return None
    return job.finished + timedelta(days=days)


def _is_expired(job: Job, now: datetime) -> bool:
    expires = expires_at(job)
    return job.logs_pruned is None and expires is not None and expires <= now


def plan(now: datetime | None = None) -> Plan:
    """What a prune at `now` (default: this moment) removes."""
    now = now or timezone.now()
    return Plan(logs=tuple(_expired_logs(now)), snapshots=tuple(_loose_snapshots(now)))


def _expired_logs(now: datetime) -> list[ExpiredLog]:
    # Every retention is at least a day: jobs that ended later cannot have expired yet.
    candidates = (
        Job.objects.filter(
            state__in=Job.TERMINAL_STATES,
            finished__lte=now - timedelta(days=1),
            keep=False,
            logs_pruned__isnull=True,
        )
        .select_related("owner")
        .only(
            "id",
            "state",
            "finished",
            "keep",
            "log_retention_days",
            "logs_pruned",
            "owner__username",
        )
        .order_by("finished", "id")
    )
    expired = []
    for job in candidates.iterator():
        expires = expires_at(job)
        if job.finished is None or expires is None or expires > now:
            continue
        chunks = LogChunk.objects.filter(job_id=job.pk)
        expired.append(
            ExpiredLog(
                job_id=job.pk,
                owner=job.owner.get_username(),
                finished=job.finished,
                expired=expires,
                log_chunks=chunks.count(),
                log_characters=log_text(chunks).aggregate(n=Sum(Length("text")))["n"] or 0,
                metric_points=MetricPoint.objects.filter(job_id=job.pk).count(),
            )
        )
    return expired


def _unnamed_snapshots() -> QuerySet[CodeSnapshot]:
    return CodeSnapshot.objects.filter(uploads__isnull=True, jobs__isnull=True)


def _loose_snapshots(now: datetime) -> list[LooseSnapshot]:
    rows = (
        _unnamed_snapshots()
        .filter(created__lte=now - SNAPSHOT_GRACE)
        .order_by("created", "id")
        .values_list("sha256", "size", "created")
    )
    return [LooseSnapshot(sha256, size, created) for sha256, size, created in rows]


def prune(now: datetime | None = None) -> Plan:
    """Remove what `plan(now)` lists; returns what went (an item that no longer qualifies when
    its turn comes, e.g. a job kept meanwhile, stays and is left out)."""
    now = now or timezone.now()
    planned = plan(now)
    gone_logs = [item for item in planned.logs if _remove_log(item, now)]
    gone_snapshots = [item for item in planned.snapshots if _remove_snapshot(item)]
    return Plan(logs=tuple(gone_logs), snapshots=tuple(gone_snapshots))


def _remove_log(item: ExpiredLog, now: datetime) -> bool:
    with transaction.atomic():
        job = Job.objects.select_for_update().filter(pk=item.job_id).first()
        if job is None or not _is_expired(job, now):
            return False
        LogChunk.objects.filter(job=job).delete()
        MetricPoint.objects.filter(job=job).delete()
        job.logs_pruned = now
        job.save(update_fields=["logs_pruned"])
        job_id, key, nodes = job.pk, job.checkpoint_key, nodes_that_ran(job)
        transaction.on_commit(
            lambda: ask_to_remove(contract.TASK_REMOVE_WORKING_FOLDER, job_id, key, nodes),
            robust=True,
        )
    log.info("retention: removed %s", item.describe())
    return True


def _remove_snapshot(item: LooseSnapshot) -> bool:
    # Its copy in Redis, if any, expires on its own within snapshots.PUBLISHED_SECONDS.
    try:
        with transaction.atomic():
            deleted, _ = _unnamed_snapshots().filter(sha256=item.sha256).delete()
    except (IntegrityError, ProtectedError):
        return False  # uploaded again, or named by a new job, at this very moment: it stays
    if deleted:
        log.info("retention: removed %s", item.describe())
    return bool(deleted)


class RetentionLoop(PeriodicPass[Plan]):
    """Prunes every `interval` seconds until stopped; lives in the console worker."""

    what = "retention"

    def one_pass(self) -> Plan:
        return prune()


def set_retention(
    job_id: int, *, keep: bool | None = None, days: int | Unchanged | None = ...
) -> Job:
    """Keep the job's log and metrics (or not), and give it days of its own (None: the
    console's default; 0: forever). What is left out stays as it was."""
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job_id)
        if keep is not None:
            job.keep = keep
        if days is not ...:
            job.log_retention_days = days
        job.save(update_fields=["keep", "log_retention_days"])
    return job


def summary(job: Job) -> dict[str, object]:
    """The job's retention as the API and pages show it: what goes when."""
    expires = None if job.logs_pruned else expires_at(job)
    return {
        "keep": job.keep,
        "days": retention_days(job),
        "own_days": job.log_retention_days is not None,
        "expires": expires.isoformat() if expires else None,
        "pruned": job.logs_pruned.isoformat() if job.logs_pruned else None,
    }
