"""The order waiting jobs are considered in: higher priority first, then first come, first
served. One small pure function, so that the scheduler, the queue page and the simulations
agree on it (and fair share can later add its term between priority and submission time)."""

from datetime import datetime

# The same order as a queryset's order_by, for the scheduler's query (and its index).
ORDER_BY = ("-priority", "created", "id")


def queue_key(priority: int, created: datetime, job_id: int) -> tuple[int, datetime, int]:
    """Sort key of a waiting job: its priority value (higher first), then its submission time,
    then its id. A requeued job (restarted, preempted) keeps its submission time, so its place."""
    return (-priority, created, job_id)
