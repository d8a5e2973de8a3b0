"""The log keeper: copies every job's log from its Redis Stream into the database, in order.

Redis is the fast path from agents to browsers, but it keeps only so much of each stream and may
be flushed or restarted; the database keeps the whole log for as long as the job exists. The
keeper reads all unarchived streams with one blocking XREAD, writes new batches as `LogChunk`
rows in bulk, and once a job's end marker is in the database marks the job archived and lets its
Redis keys expire. Several keepers may run: rows are unique per cursor, so a copy made twice is
kept once.

It also closes logs the console could not close: when a finished job's end marker never reached
Redis (Redis was down at that moment), the keeper appends it.
"""

import logging
import threading
import time
from typing import cast

import redis
from django.db import transaction
from django.db.models import F, Max

from jobs import logstream
from jobs.logstream import RawEntry
from jobs.models import Job, LogChunk, MetricPoint
from jobs.services.health import HealthMonitor
from jobs.services.logceiling import KeptBytes
from jobs.services.presenters import log_end_reason
from workers import contract
from workers.logsink import LogSink

log = logging.getLogger(__name__)

# How long an archived job's Redis keys stay, for followers that are still reading from there.
EXPIRE_AFTER_ARCHIVE_SECONDS = 600
BLOCK_MILLISECONDS = 1000
ENTRIES_PER_READ = 500
MIN_PASS_SECONDS = 0.5


def archive_once(
    client: redis.Redis,
    block_ms: int = BLOCK_MILLISECONDS,
    monitor: HealthMonitor | None = None,
    kept: KeptBytes | None = None,
) -> int:
    """One pass over every unarchived job; returns how many batches it saved. `monitor`, if
    given, sees every entry saved (the health rules read the log as it is archived); `kept`
    carries what was archived per job from one pass to the next (a fresh count when absent)."""
    kept = kept or KeptBytes()
    rows = list(
        Job.objects.filter(log_archived=False)
        .values_list("pk", "log_complete", "log_max_mb")
        .order_by("pk")
    )
    pending = {pk: complete for pk, complete, _ in rows}
    max_bytes = {pk: mb * 10**6 for pk, _, mb in rows}
    if not pending:
        threading.Event().wait(block_ms / 1000)
        return 0
    heads = dict(
        LogChunk.objects.filter(job_id__in=list(pending))
        .values("job_id")
        .annotate(head=Max("last_cursor"))
        .values_list("job_id", "head")
    )
    streams = {contract.log_stream_key(job_id): f"{heads.get(job_id, 0)}-0" for job_id in pending}
    response = cast(
        list[tuple[str, list[RawEntry]]],
        client.xread(streams, count=ENTRIES_PER_READ, block=block_ms),  # type: ignore[arg-type]
    )
    saved = 0
    touched: set[int] = set()
    for key, entries in response or []:
        job_id = _job_of(key)
        touched.add(job_id)
        saved += _save(client, job_id, heads.get(job_id, 0), entries, max_bytes[job_id], kept)
        if monitor is not None:
            monitor.entries(job_id, entries)
    for job_id, complete in pending.items():
        if complete and job_id not in touched:
            _close_if_unclosed(client, job_id, heads.get(job_id, 0))
    return saved


def _job_of(key: str) -> int:
    return int(key.split("{job:", 1)[1].split("}", 1)[0])


def _save(
    client: redis.Redis,
    job_id: int,
    head: int,
    entries: list[RawEntry],
    max_bytes: int,
    kept: KeptBytes,
) -> int:
    rows: list[LogChunk] = []
    points: list[MetricPoint] = []
    ended = False
    position = head
    for entry_id, fields in entries:
        chunk = logstream.chunk_from_entry(job_id, entry_id, fields)
        if chunk.first_cursor > position + 1:
            # Trimmed from Redis before we got here: record the hole, readers will say so.
            hole = logstream.gap(position, chunk.first_cursor - 1)
            rows.append(logstream.to_chunk(job_id, hole))
        chunk = kept.admit(job_id, max_bytes, chunk)
        rows.append(chunk)
        if chunk.kind == LogChunk.Kind.LINES and chunk.stream == logstream.METRIC:
            points.extend(_metric_rows(job_id, logstream.parse_entry(entry_id, fields)))
        position = chunk.last_cursor
        ended = ended or chunk.kind == LogChunk.Kind.END
    with transaction.atomic():
        _count_drops(job_id, rows)
        MetricPoint.objects.bulk_create(points, ignore_conflicts=True)
        LogChunk.objects.bulk_create(rows, ignore_conflicts=True)
    # Redis holds only what is not archived yet: readers take archived lines from the database
    # (jobs/logstream.py reads it first, and goes back to it when Redis starts past a cursor).
    # Approximate trimming removes whole nodes of the stream only, which costs next to nothing;
    # the few archived entries it leaves go with the next pass.
    client.xtrim(
        contract.log_stream_key(job_id), minid=f"{position + 1}-0", approximate=True, limit=0
    )
    if ended:
        kept.forget(job_id)
        Job.objects.filter(pk=job_id).update(log_archived=True)
        pipe = client.pipeline(transaction=False)
        for key in contract.job_log_keys(job_id):
            pipe.expire(key, EXPIRE_AFTER_ARCHIVE_SECONDS)
        pipe.execute()
    return len(rows)


def _count_drops(job_id: int, rows: list[LogChunk]) -> None:
    """Add the drops that rows about to be saved account for to the job's counters, once: a
    row already archived (by another keeper, or before a crash) is not counted again. The job
    row is locked first, so two keepers cannot both count the same row. Call inside the
    transaction that saves the rows."""
    counted = [r for r in rows if r.dropped_lines or r.dropped_points]
    if not counted:
        return
    Job.objects.select_for_update().filter(pk=job_id).exists()
    saved = set(
        LogChunk.objects.filter(
            job_id=job_id, last_cursor__in=[r.last_cursor for r in counted]
        ).values_list("last_cursor", flat=True)
    )
    new = [r for r in counted if r.last_cursor not in saved]
    Job.objects.filter(pk=job_id).update(
        log_dropped_lines=F("log_dropped_lines") + sum(r.dropped_lines for r in new),
        log_dropped_points=F("log_dropped_points") + sum(r.dropped_points for r in new),
    )


def _metric_rows(job_id: int, batch: logstream.Batch) -> list[MetricPoint]:
    """The rows of a metric batch's points. A point whose value is not finite (null in the
    stream) has none: MetricPoint.value is a number (the health rules saw it in the stream)."""
    rows = []
    for point in batch.points():
        if point["value"] is None:
            continue
        rows.append(
            MetricPoint(
                job_id=job_id,
                cursor=point["cursor"],
                role=batch.role,
                index=batch.index,
                node=batch.node,
                name=point["name"],
                value=point["value"],
                step=point.get("step"),
                epoch=point.get("epoch"),
                ts=point["ts"],
            )
        )
    return rows


def _close_if_unclosed(client: redis.Redis, job_id: int, head: int) -> None:
    """A finished job with nothing left to archive and no end marker: append the marker."""
    if LogChunk.objects.filter(job_id=job_id, kind=LogChunk.Kind.END).exists():
        Job.objects.filter(pk=job_id).update(log_archived=True)
        return
    # Cursors must keep growing past what is archived, even if Redis lost its counter.
    client.set(contract.log_cursor_key(job_id), head, nx=True)
    job = Job.objects.get(pk=job_id)
    if LogSink(client).append_end(job_id, log_end_reason(job)) >= 0:
        log.warning("closed the log of job %s, whose end marker had not reached Redis", job_id)


def run(client: redis.Redis, stop: threading.Event) -> None:
    """Archive until `stop` is set; Redis or database outages are waited out."""
    monitor = HealthMonitor(client)
    kept = KeptBytes()
    while not stop.is_set():
        started = time.monotonic()
        try:
            monitor.refresh()
            saved = archive_once(client, monitor=monitor, kept=kept)
            monitor.tick()
            if saved:
                # Live readers take lines from Redis; the archive can lag a moment, and one
                # transaction per pass for many entries costs far less than one per entry.
                stop.wait(max(0.0, MIN_PASS_SECONDS - (time.monotonic() - started)))
        except redis.RedisError as exc:
            log.warning("Redis unreachable (%s); retrying", exc)
            stop.wait(1.0)
        except Exception:
            log.exception("archiving logs failed; retrying")
            stop.wait(1.0)
