"""The log keeper: copies every job's log from its Redis Stream into the database, in order.

Redis is the fast path from agents to browsers, but it keeps only so much of each stream and may
be flushed or restarted; the database keeps the whole log for as long as the job exists. The
keeper reads all unarchived streams with one blocking XREAD, writes new batches as `LogChunk`
rows in bulk, and once a job's end marker is in the database marks the job archived and lets its
Redis keys expire. Several keepers may run: rows are unique per cursor, so a copy made twice is
kept once.

It also closes logs the console could not close: when a finished job's end marker never reached
Redis (Redis was down at that moment, or lost it), the keeper appends it, once the database has
every writer's last lines (the goals the replicas' exit reports set): lines Redis lost after the
replicas ended, which their agents send again, come before it.

Durability is end to end: with every batch it saves, the keeper records per writer (an agent's
file, by offset) how far the database has its lines (`LogAck`), and tells the agents in Redis
once the transaction has committed. Agents keep a file's lines until that acknowledgement passes
them. Redis itself syncs its append-only file once a second, so a crash of its host may take
back its last writes; when the keeper finds a Redis it has not seen before, it makes every
unarchived stream agree with the database again (`realign`): what the database has is dropped,
what it lacks is numbered on from its last cursor, and the agents, told by a new epoch, send
again from what Redis and the database hold.
"""

import logging
import threading
import time
import uuid
from datetime import timedelta
from typing import Any, cast

import redis
from django.db import transaction
from django.db.models import F, Max
from django.utils import timezone

from jobs import logstream
from jobs.logstream import RawEntry
from jobs.models import Job, LogAck, LogChunk, MetricPoint
from jobs.services import metric_summaries
from jobs.services.health import HealthMonitor
from jobs.services.lifecycle import experiment_requests
from jobs.services.lifecycle.outcomes import log_end_reason
from jobs.services.logceiling import KeptBytes
from workers import contract
from workers.logsink import LogSink

log = logging.getLogger(__name__)

# How long an archived job's Redis keys stay, for followers that are still reading from there.
EXPIRE_AFTER_ARCHIVE_SECONDS = 600
# How long a finished job's log stays open for lines its agents still owe (Redis lost them after
# the replicas ended, and the agents send them again from their files); after that it is closed
# with what it has. Agents keep such files as long (workers/supervisor.py).
LOG_GOAL_WAIT_SECONDS = 600.0
BLOCK_MILLISECONDS = 1000
ENTRIES_PER_READ = 500
MIN_PASS_SECONDS = 0.5

# KEYS[1] stream, KEYS[2] cursor counter, KEYS[3] seen per writer, KEYS[4] acked per writer,
# KEYS[5] the job's log epoch. ARGV[1] the cursor the database's chunks end at, ARGV[2] a new
# epoch, ARGV[3..] writer/sequence pairs the database has. Renumbers, in order and from the
# database's last cursor on, every entry the database lacks (cursors Redis handed out again
# after losing writes would collide with archived ones), drops the rest, raises each writer's
# seen and acked marks to what the database has (so what an agent sends again from there on is
# new), and sets the new epoch (agents wait for it before sending again). Returns the entries
# kept.
_REALIGN_LUA = """
local head = tonumber(ARGV[1])
local acked = {}
for i = 3, #ARGV, 2 do acked[ARGV[i]] = tonumber(ARGV[i + 1]) end
local keep = {}
for _, entry in ipairs(redis.call('XRANGE', KEYS[1], '-', '+')) do
  local fields = entry[2]
  local writer, seq
  for i = 1, #fields, 2 do
    if fields[i] == 'w' then writer = fields[i + 1] elseif fields[i] == 'q' then
      seq = tonumber(fields[i + 1])
    end
  end
  local cursor = tonumber(string.match(entry[1], '^%d+'))
  if writer == nil then
    if cursor > head then keep[#keep + 1] = fields end
  elseif seq > (acked[writer] or -1) then
    keep[#keep + 1] = fields
  end
end
redis.call('DEL', KEYS[1])
local last = head
for _, fields in ipairs(keep) do
  local count = 1
  for i = 1, #fields, 2 do
    if fields[i] == 'l' then count = 1 + select(2, string.gsub(fields[i + 1], '\\n', '')) end
  end
  last = last + count
  redis.call('XADD', KEYS[1], last .. '-0', unpack(fields))
end
redis.call('SET', KEYS[2], last)
for writer, seq in pairs(acked) do
  if tonumber(redis.call('HGET', KEYS[3], writer) or '-1') < seq then
    redis.call('HSET', KEYS[3], writer, seq)
  end
  redis.call('HSET', KEYS[4], writer, seq)
end
redis.call('SET', KEYS[5], ARGV[2])
return #keep
"""

# KEYS[1] acked per writer, KEYS[2] skipped per writer. ARGV: writer/sequence pairs the database
# now has. Raises each writer's acknowledgement to its sequence number, or past the lines its
# agent dropped on purpose right after it (workers/logsink.py, the append script's skips);
# never lowers it (a skip may have raised it already).
_ACK_LUA = """
for i = 1, #ARGV, 2 do
  local writer, seq = ARGV[i], tonumber(ARGV[i + 1])
  local pending = redis.call('HGET', KEYS[2], writer)
  if pending then
    local from, upto = string.match(pending, '^(%-?%d+) (%-?%d+)$')
    if seq >= tonumber(from) then
      seq = math.max(seq, tonumber(upto))
      redis.call('HDEL', KEYS[2], writer)
    end
  end
  if seq > tonumber(redis.call('HGET', KEYS[1], writer) or '-1') then
    redis.call('HSET', KEYS[1], writer, seq)
  end
end
return 0
"""


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
    heads = _heads(list(pending))
    acks = _acks(list(pending))
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
        saved += _save(
            client, job_id, heads.get(job_id, 0), entries, max_bytes[job_id], kept,
            acks.get(job_id, {}),
        )  # fmt: skip
        if monitor is not None:
            monitor.entries(job_id, entries)
    for job_id, complete in pending.items():
        if complete and job_id not in touched:
            _close_if_unclosed(client, job_id, heads.get(job_id, 0))
    return saved


def _heads(job_ids: list[int]) -> dict[int, int]:
    """The cursor each job's archived chunks end at (absent: none yet)."""
    return dict(
        LogChunk.objects.filter(job_id__in=job_ids)
        .values("job_id")
        .annotate(head=Max("last_cursor"))
        .values_list("job_id", "head")
    )


def _acks(job_ids: list[int]) -> dict[int, dict[str, int]]:
    """Per job, per writer, the sequence number of its last batch the database has."""
    acks: dict[int, dict[str, int]] = {}
    for job_id, writer, seq in LogAck.objects.filter(job_id__in=job_ids, seq__gte=0).values_list(
        "job_id", "writer", "seq"
    ):
        acks.setdefault(job_id, {})[writer] = seq
    return acks


def realign_if_redis_restarted(client: redis.Redis) -> bool:
    """When Redis is a server the keeper has not made agree with the database yet (it
    restarted, and may have lost its last writes), realign every unarchived job's stream; True
    when it did. Cheap otherwise: one INFO and one GET."""
    run_id = str(cast(dict[str, object], client.info("server"))["run_id"])
    if client.get(contract.LOG_KEEPER_REDIS_RUN_KEY) == run_id:
        return False
    job_ids = list(Job.objects.filter(log_archived=False).values_list("pk", flat=True))
    heads, acks = _heads(job_ids), _acks(job_ids)
    script = client.register_script(_REALIGN_LUA)
    for job_id in job_ids:
        kept = realign(script, job_id, heads.get(job_id, 0), acks.get(job_id, {}))
        if kept:
            log.info("job %s: %s entries renumbered after the database's", job_id, kept)
    client.set(contract.LOG_KEEPER_REDIS_RUN_KEY, run_id)
    log.warning("Redis %s: %s unarchived logs realigned with the database", run_id, len(job_ids))
    return True


def realign(script: Any, job_id: int, head: int, acks: dict[str, int]) -> int:
    """Make a job's stream agree with the database (see _REALIGN_LUA); the entries kept."""
    keys = [
        contract.log_stream_key(job_id), contract.log_cursor_key(job_id),
        contract.log_seen_key(job_id), contract.log_ack_key(job_id),
        contract.log_epoch_key(job_id),
    ]  # fmt: skip
    args: list[str | int] = [head, uuid.uuid4().hex]
    for writer, seq in acks.items():
        args.extend((writer, seq))
    return int(script(keys=keys, args=args))


def _job_of(key: str) -> int:
    return int(key.split("{job:", 1)[1].split("}", 1)[0])


def _save(
    client: redis.Redis,
    job_id: int,
    head: int,
    entries: list[RawEntry],
    max_bytes: int,
    kept: KeptBytes,
    acks: dict[str, int] | None = None,
) -> int:
    """Save entries read after cursor `head`; `acks` per writer, what the database has (entries
    at or below are skipped), updated as they are saved."""
    acks = {} if acks is None else acks
    rows: list[LogChunk] = []
    points: list[MetricPoint] = []
    acked: dict[str, int] = {}
    ended = False
    position = head
    for entry_id, fields in entries:
        writer = fields.get(contract.FIELD_WRITER)
        if writer is not None:
            seq = int(fields[contract.FIELD_SEQ])
            if seq <= acks.get(writer, -1):
                # Kept already (sent again after Redis lost writes, before realign saw it).
                position = int(entry_id.split("-", 1)[0])
                continue
            acks[writer] = acked[writer] = seq
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
        metric_summaries.record(job_id, points)
        if points:
            experiment_requests.metrics_archived(job_id, {p.name for p in points})
        LogChunk.objects.bulk_create(rows, ignore_conflicts=True)
        LogAck.objects.bulk_create(
            [LogAck(job_id=job_id, writer=w, seq=q) for w, q in acked.items()],
            update_conflicts=True,
            unique_fields=["job", "writer"],
            update_fields=["seq"],
        )
    if acked:
        # Committed: the agents may now forget these lines (and those they dropped after them).
        acknowledge(client, job_id, acked)
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
        experiment_requests.log_archived(job_id)
        pipe = client.pipeline(transaction=False)
        for key in contract.job_log_keys(job_id):
            pipe.expire(key, EXPIRE_AFTER_ARCHIVE_SECONDS)
        pipe.execute()
    return len(rows)


def acknowledge(client: redis.Redis, job_id: int, acked: dict[str, int]) -> None:
    """Tell the agents, per writer, how far the database has its lines (see _ACK_LUA)."""
    keys = [contract.log_ack_key(job_id), contract.log_skip_key(job_id)]
    args: list[str | int] = []
    for writer, seq in acked.items():
        args.extend((writer, seq))
    client.register_script(_ACK_LUA)(keys=keys, args=args)


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
    """A finished job with nothing left to archive and no end marker: append the marker, once
    every writer's last lines are in the database (or it has waited long enough for them)."""
    if LogChunk.objects.filter(job_id=job_id, kind=LogChunk.Kind.END).exists():
        Job.objects.filter(pk=job_id).update(log_archived=True)
        experiment_requests.log_archived(job_id)
        return
    job = Job.objects.get(pk=job_id)
    owed = list(
        LogAck.objects.filter(job_id=job_id, goal__gt=F("seq")).values_list("writer", "goal")
    )
    if owed:
        if not _waited_long_enough(job):
            return  # the agents send them again from their files
        log.warning("job %s: closing its log without the last lines of %s", job_id, owed)
    # Cursors must keep growing past what is archived, even if Redis lost its counter.
    client.set(contract.log_cursor_key(job_id), head, nx=True)
    if LogSink(client).append_end(job_id, log_end_reason(job)) >= 0:
        log.warning("closed the log of job %s, whose end marker had not reached Redis", job_id)


def _waited_long_enough(job: Job) -> bool:
    """Whether a finished job's agents have had their time to send the lines they owe."""
    ended = job.finished or job.created
    return timezone.now() - ended > timedelta(seconds=LOG_GOAL_WAIT_SECONDS)


def run(client: redis.Redis, stop: threading.Event) -> None:
    """Archive until `stop` is set; Redis or database outages are waited out."""
    monitor = HealthMonitor(client)
    kept = KeptBytes()
    while not stop.is_set():
        started = time.monotonic()
        try:
            monitor.refresh()
            realign_if_redis_restarted(client)
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
