"""Asking for a scheduling pass: what the writers of job state call when room frees or a job
arrives (outcomes, restarts, submission, nodes), below the scheduler that answers it
(jobs.services.scheduler.scheduling), so that they need not import it."""

from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from redis import RedisError

from console.celery import app
from jobs.redis_client import get_redis
from workers import contract


def request_schedule() -> None:
    """Ask the console worker to run `schedule()` once this transaction commits."""
    transaction.on_commit(_send_schedule_task, robust=True)


# While a schedule request is on its way and its pass has not started, another request adds
# nothing: that pass will see what the newer one would. 1,000 nodes coming back at once asked
# for 1,000 passes (issue 24). schedule() clears the mark before it reads anything, so a
# request made during a pass sends a new one. Should the task be lost, the mark expires.
SCHEDULE_REQUESTED_KEY = "trainyard:console:schedule-requested"
SCHEDULE_REQUESTED_SECONDS = 30


def _send_schedule_task() -> None:
    try:
        if not get_redis().set(SCHEDULE_REQUESTED_KEY, "1", nx=True, ex=SCHEDULE_REQUESTED_SECONDS):
            return  # a request is on its way already
    except (RedisError, ImproperlyConfigured):
        pass  # cannot tell: ask anyway
    app.send_task(contract.TASK_SCHEDULE, queue=contract.CONSOLE_QUEUE)


def answered() -> None:
    """The pass starting now answers every request made so far."""
    try:
        get_redis().delete(SCHEDULE_REQUESTED_KEY)
    except (RedisError, ImproperlyConfigured):
        pass  # the mark expires by itself
