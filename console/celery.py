"""The console's Celery app: settings from Django (CELERY_*), tasks from jobs.tasks."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

app = Celery("trainyard")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["jobs"])
