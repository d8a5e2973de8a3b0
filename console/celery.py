"""The console's Celery app: settings from Django (CELERY_*), tasks from jobs.tasks."""

import gc
import os
from typing import Any

from celery import Celery
from celery.signals import worker_ready

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

app = Celery("trainyard")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["jobs"])


@worker_ready.connect
def freeze_startup_objects(**_: Any) -> None:
    """What the worker made while starting (Django's models and URL patterns, every module)
    lives as long as the process: moved out of the garbage collector's way, so that a full
    collection in the middle of a scheduling pass or a batch of heartbeats does not walk it all
    again (at 1,000 nodes it stretched some passes by half; issue 24)."""
    gc.collect()
    gc.freeze()
