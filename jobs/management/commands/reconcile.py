"""`manage.py reconcile`: one reconciliation pass, printed (the console worker runs them on a
timer by itself; this is for operators who want to see or force one)."""

from typing import Any

from django.core.management.base import BaseCommand
from django.utils import timezone

from jobs.services import reconcile


class Command(BaseCommand):
    help = "Compare what should run with what node agents report, and repair the difference."

    def handle(self, *args: Any, **options: Any) -> None:
        # One pass cannot tell a silent node from a console worker that has not been reading
        # heartbeats, so it judges no node lost; the worker's loop does that.
        self.stdout.write(reconcile.run_pass(listening_since=timezone.now()).summary())
