"""How long a job has run: one definition for the job page, the job list and the API's
started/finished times, so that they agree to the second."""

from datetime import datetime

from django.utils import timezone

from jobs.models import Job


def run_seconds(job: Job, now: datetime | None = None) -> float | None:
    """finished - started once the job has ended, now - started while it runs (a restarting
    job included: its time counts); None when no process of it ever started (it waits, or it
    was cancelled while it waited)."""
    if job.started is None:
        return None
    end = job.finished or now or timezone.now()
    return max(0.0, (end - job.started).total_seconds())


def format_duration(seconds: float) -> str:
    """ "12 s", "3 min 05 s", "2 h 05 min": whole seconds, the largest units that matter.
    static/trainyard/format.js writes the same for the durations that tick in the browser."""
    s = max(0, int(seconds))  # whole seconds elapsed, as a stopwatch shows them
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def format_ago(moment: datetime, now: datetime) -> str:
    """ "5 s ago", "3 min 05 s ago": how long since `moment`, in the units of format_duration
    (never "0 minutes ago" for a heartbeat five seconds old). A moment a little ahead of this
    clock (another host's) reads "0 s ago" rather than as the future."""
    return f"{format_duration((now - moment).total_seconds())} ago"
