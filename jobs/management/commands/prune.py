"""`manage.py prune [--dry-run]`: apply retention now and print what goes, one line each (the
console worker prunes on a timer by itself; this is for operators who want to see or force it).
--dry-run prints the same list and removes nothing; a real run removes exactly that list, less
anything that stopped qualifying in between (a job kept meanwhile)."""

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from jobs.services import retention


class Command(BaseCommand):
    help = "Remove expired job logs and metrics and unreferenced code snapshots (retention)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--dry-run", action="store_true", help="List what would go; remove nothing."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        dry_run = options["dry_run"]
        outcome = retention.plan() if dry_run else retention.prune()
        verb = "would remove" if dry_run else "removed"
        for line in outcome.lines():
            self.stdout.write(f"{verb} {line}")
        self.stdout.write(
            f"{verb} the logs and metrics of {len(outcome.logs)} jobs and "
            f"{len(outcome.snapshots)} code snapshots"
        )
