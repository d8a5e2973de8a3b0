"""The console's Celery app: settings from Django (CELERY_*), tasks from jobs.tasks."""

import os
from typing import Any

from celery import Celery
from celery.signals import worker_ready

from console import gcpolicy

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

app = Celery("trainyard")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["jobs"])


@worker_ready.connect
def settle_garbage_collector(**_: Any) -> None:
    """What the worker made while starting lives as long as the process: out of the garbage
    collector's way (console/gcpolicy.py), so that a full collection in the middle of a
    scheduling pass or a batch of heartbeats does not walk it all again (at 1,000 nodes it
    stretched some passes by half; issue 24)."""
    gcpolicy.settle()
