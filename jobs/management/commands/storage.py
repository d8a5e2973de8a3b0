"""`manage.py storage`: what the database holds per user and per job, and when retention
removes each job's log and metrics (`manage.py prune --dry-run` lists what goes now)."""

from datetime import datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from jobs.services import storage


def _when(moment: datetime | None) -> str:
    return f"{moment:%Y-%m-%d %H:%M}" if moment else "-"


class Command(BaseCommand):
    help = "Storage per user and per job, and when each job's log and metrics go."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--jobs", type=int, default=20, help="Show this many jobs, the largest first."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        jobs = storage.per_job()
        self.stdout.write(
            f"{'USER':<20} {'JOBS':>6} {'LOG CHARS':>14} {'POINTS':>10} "
            f"{'SNAPSHOTS':>9} {'SNAPSHOT BYTES':>14}"
        )
        for user in storage.per_user(jobs):
            self.stdout.write(
                f"{user.owner:<20} {user.jobs:>6} {user.log_characters:>14,} "
                f"{user.metric_points:>10,} {user.snapshots:>9} {user.snapshot_bytes:>14,}"
            )
        self.stdout.write("")
        self.stdout.write(
            f"{'JOB':>8} {'USER':<20} {'STATE':<10} {'LOG CHARS':>14} {'POINTS':>10}  GOES"
        )
        for job in jobs[: options["jobs"]]:
            if job.pruned:
                goes = f"removed {_when(job.pruned)}"
            elif job.kept:
                goes = "never"
            else:
                goes = _when(job.expires)  # "-" while it runs
            self.stdout.write(
                f"{job.job_id:>8} {job.owner:<20} {job.state:<10} {job.log_characters:>14,} "
                f"{job.metric_points:>10,}  {goes}"
            )
