"""The log keeper's check of a job's log limit: the second line of defence behind the agents.

Agents drop lines over a job's budget before they reach Redis (workers/logquota.py). An agent is
trusted with its own node only, though: a broken or hostile one could write a job's stream past
the budget. The keeper counts what it archives per job and, once a job is over its total (with
slack for the agents' own `[trainyard]` lines, which no budget holds), archives further entries as
a GAP row that says how many lines it dropped instead of the lines: the database never holds more
than the limit, and the drops still show in the job's counters. Rates are the agents' business:
the keeper sees entries in bursts, after the fact.
"""

from django.db.models import Sum
from django.db.models.functions import Length

from jobs import logstream
from jobs.models import LogChunk
from workers.logquota import human_bytes

# Beyond a job's limit, what the keeper still keeps: markers and agents' notes, and the
# newline that separates one chunk's text from the next, which agents count and rows do not.
SLACK_BYTES = 10**6
SLACK_FRACTION = 0.01


class KeptBytes:
    """Characters of log this keeper has archived per job (counted from the database the first
    time it meets a job, so a restarted keeper goes on where the last one stopped)."""

    def __init__(self) -> None:
        self._kept: dict[int, int] = {}

    def admit(self, job_id: int, max_bytes: int, chunk: LogChunk) -> LogChunk:
        """`chunk`, or, once the job is over its limit, a GAP row in its place that counts its
        lines (or metric points) as dropped."""
        if chunk.kind != LogChunk.Kind.LINES:
            return chunk
        kept = self._kept.get(job_id)
        if kept is None:
            kept = _archived_bytes(job_id)
        size = len(chunk.text) + 1
        ceiling = max_bytes + SLACK_BYTES + int(max_bytes * SLACK_FRACTION)
        if kept + size <= ceiling:
            self._kept[job_id] = kept + size
            return chunk
        # Spent: a smaller entry after this one is not kept either, so the archive does not
        # go on with holes in it.
        self._kept[job_id] = max(kept, ceiling + 1)
        count = chunk.last_cursor - chunk.first_cursor + 1
        is_metric = chunk.stream == logstream.METRIC
        what = "metric points" if is_metric else "lines"
        return LogChunk(
            job_id=job_id, first_cursor=chunk.first_cursor, last_cursor=chunk.last_cursor,
            kind=LogChunk.Kind.GAP, role=chunk.role, index=chunk.index, node=chunk.node,
            stream=chunk.stream, ts=chunk.ts, attempt=chunk.attempt,
            text=f"{count:,} {what} dropped by the log keeper: over the job's log limit of "
            f"{human_bytes(max_bytes)}",
            dropped_lines=chunk.dropped_lines + (0 if is_metric else count),
            dropped_points=chunk.dropped_points + (count if is_metric else 0),
        )  # fmt: skip

    def forget(self, job_id: int) -> None:
        self._kept.pop(job_id, None)


def _archived_bytes(job_id: int) -> int:
    rows = LogChunk.objects.filter(job_id=job_id, kind=LogChunk.Kind.LINES)
    total = rows.aggregate(chars=Sum(Length("text")))["chars"] or 0
    return int(total) + rows.count()
