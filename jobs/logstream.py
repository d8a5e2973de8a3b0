"""Reading a job's log: pages for HTTP, the whole text for download, a live follow for the
websocket.

A log lives in two places. Agents append batches to the job's Redis Stream (`workers.logsink`:
entry id "<C>-0" where C is the cursor of the batch's last line, entries contiguous in cursor
space); the log keeper copies them, in order, into `LogChunk` rows, which outlive Redis. Readers
take what the database has first and the newer rest from Redis, and say so when a range of
lines is in neither.
"""

import asyncio
import json
import re
from collections.abc import AsyncIterator, Awaitable, Iterator
from dataclasses import dataclass, field
from typing import Any, cast

import redis
import redis.asyncio
from asgiref.sync import sync_to_async
from django.db.models import F, Max, Sum

from jobs import logshape
from jobs.models import LogChunk, MetricPoint
from jobs.redis_client import READ_MARGIN_SECONDS, get_redis
from workers import contract
from workers.contract import tag_of

METRIC = "metric"  # the stream name of batches whose lines are metric points
RawEntry = tuple[str, dict[str, str]]  # (entry id, fields), as a decode_responses client gives
# How long one XREAD waits for new lines before the follower looks again (to send a heartbeat,
# or to find lines that were archived and expired from Redis meanwhile).
FOLLOW_BLOCK_SECONDS = 5
# Batches read per query or XREAD: a batch holds up to 1000 lines.
PAGE_BATCHES = 100

STREAM_NAMES = {
    contract.STREAM_STDOUT: "stdout",
    contract.STREAM_STDERR: "stderr",
    contract.STREAM_METRIC: METRIC,
}

# What "jump to the first error" looks for: a traceback, "SomethingError:" / "...Exception:",
# or a log level word in capitals.
ERROR_PATTERN = re.compile(
    r"Traceback \(most recent call last\)|\w*(?:Error|Exception):|\b(?:ERROR|FATAL|CRITICAL)\b"
)


@dataclass(frozen=True, slots=True)
class Batch:
    """Consecutive lines first..last of one process's stream; or a gap, or the end marker."""

    first: int
    last: int
    kind: str = LogChunk.Kind.LINES
    role: str = ""
    index: int = 0
    node: str = ""
    stream: str = ""  # "stdout" or "stderr"
    ts: float = 0.0
    lines: list[str] = field(default_factory=list)
    reason: str = ""  # END: why the log ended; GAP: why the lines are missing
    attempt: int = 0  # the job attempt the process belongs to (0: the first run)

    @property
    def tag(self) -> str:
        return tag_of(self.role, self.index)

    @property
    def is_log(self) -> bool:
        """Lines to show (not metric points, a gap or the end)."""
        return self.kind == LogChunk.Kind.LINES and self.stream != METRIC

    @property
    def is_metrics(self) -> bool:
        return self.kind == LogChunk.Kind.LINES and self.stream == METRIC

    def points(self) -> list[dict[str, Any]]:
        """A metric batch's points, each with its origin and cursor. A value that is not finite
        is null, with "nonfinite" saying what it was (see `point_value`)."""
        out = []
        for k, text in enumerate(self.lines):
            point = json.loads(text)
            point.update(cursor=self.first + k, role=self.role, index=self.index, node=self.node)
            out.append(point)
        return out

    def after(self, cursor: int) -> "Batch":
        """This batch without the lines at or before `cursor`."""
        if self.first > cursor or self.kind != LogChunk.Kind.LINES:
            return self
        skip = cursor - self.first + 1
        return Batch(
            cursor + 1, self.last, self.kind, self.role, self.index, self.node, self.stream,
            self.ts, self.lines[skip:], self.reason, self.attempt,
        )  # fmt: skip

    def before(self, cursor: int) -> "Batch":
        """This batch without the lines at or after `cursor`."""
        if self.last < cursor or self.kind != LogChunk.Kind.LINES:
            return self
        keep = max(0, cursor - self.first)
        return Batch(
            self.first, cursor - 1, self.kind, self.role, self.index, self.node, self.stream,
            self.ts, self.lines[:keep], self.reason, self.attempt,
        )  # fmt: skip

    def wire(self) -> dict[str, Any]:
        """A websocket "log" frame's batch: line k has cursor first + k; `shown` has, under
        "k", how line k shows when that is not simply its text (jobs/logshape.py)."""
        shown = (
            {}
            if logshape.all_plain(self.lines)
            else {
                str(k): logshape.segments(t)
                for k, t in enumerate(self.lines)
                if not logshape.is_plain(t)
            }
        )
        return {
            "first": self.first,
            "role": self.role,
            "index": self.index,
            "attempt": self.attempt,
            "node": self.node,
            "stream": self.stream,
            "ts": self.ts,
            "lines": self.lines,
            **({"shown": shown} if shown else {}),
        }

    def line_dict(self, k: int) -> dict[str, Any]:
        """One line for HTTP; `shown`, when the text does not show as it is, says how it does."""
        text = self.lines[k]
        line = {
            "cursor": self.first + k,
            "role": self.role,
            "index": self.index,
            "attempt": self.attempt,
            "node": self.node,
            "stream": self.stream,
            "ts": self.ts,
            "text": text,
        }
        if not logshape.is_plain(text):
            line["shown"] = logshape.segments(text)
        return line


def gap(after: int, upto: int) -> Batch:
    return Batch(
        after + 1,
        upto,
        LogChunk.Kind.GAP,
        reason=f"lines {after + 1} to {upto} are no longer kept: Redis trimmed them before "
        "they were archived",
    )


def parse_entry(entry_id: str, fields: dict[str, str]) -> Batch:
    last = int(entry_id.split("-", 1)[0])
    if contract.FIELD_END in fields:
        return Batch(last, last, LogChunk.Kind.END, reason=fields[contract.FIELD_END])
    if contract.FIELD_STREAM not in fields:
        return _parse_old_entry(last, fields)
    lines = fields[contract.FIELD_LINES].split("\n")
    return Batch(
        first=last - len(lines) + 1,
        last=last,
        role=fields[contract.FIELD_ROLE],
        index=int(fields[contract.FIELD_INDEX]),
        node=fields[contract.FIELD_NODE],
        stream=STREAM_NAMES.get(fields[contract.FIELD_STREAM], fields[contract.FIELD_STREAM]),
        ts=float(fields[contract.FIELD_TS]),
        lines=lines,
        attempt=_attempt_of(fields),
    )


def _attempt_of(fields: dict[str, str]) -> int:
    """An entry's attempt: absent (a first attempt, or written before restarts existed) is 0."""
    return int(fields.get(contract.FIELD_ATTEMPT, 0))


def _parse_old_entry(last: int, fields: dict[str, str]) -> Batch:
    """Entries written before batches had one stream each: a JSON list of [stream, ts, text]."""
    records = json.loads(fields[contract.FIELD_LINES])
    stream, ts = (records[0][0], records[0][1]) if records else (contract.STREAM_STDOUT, 0.0)
    return Batch(
        last - len(records) + 1, last, LogChunk.Kind.LINES, fields[contract.FIELD_ROLE],
        int(fields[contract.FIELD_INDEX]), fields[contract.FIELD_NODE],
        STREAM_NAMES.get(stream, stream), float(ts), [r[2] for r in records],
    )  # fmt: skip


def chunk_from_entry(job_id: int, entry_id: str, fields: dict[str, str]) -> LogChunk:
    """The database row of a stream entry, without splitting its lines (the keeper's hot path)."""
    last = int(entry_id.split("-", 1)[0])
    if contract.FIELD_END in fields or contract.FIELD_STREAM not in fields:
        return to_chunk(job_id, parse_entry(entry_id, fields))
    text = fields[contract.FIELD_LINES]
    code = fields[contract.FIELD_STREAM]
    return LogChunk(
        job_id=job_id, first_cursor=last - text.count("\n"), last_cursor=last,
        kind=LogChunk.Kind.LINES, role=fields[contract.FIELD_ROLE],
        index=int(fields[contract.FIELD_INDEX]), node=fields[contract.FIELD_NODE],
        stream=STREAM_NAMES.get(code, code), ts=float(fields[contract.FIELD_TS]), text=text,
        attempt=_attempt_of(fields),
        dropped_lines=_count_of(fields, contract.FIELD_DROPPED_LINES),
        dropped_points=_count_of(fields, contract.FIELD_DROPPED_POINTS),
    )  # fmt: skip


def _count_of(fields: dict[str, str], name: str) -> int:
    """A marker's count; anything but a whole number >= 0 (a broken or hostile writer) is 0."""
    text = fields.get(name, "0")
    return int(text) if text.isdigit() and len(text) < 19 else 0


def from_chunk(chunk: LogChunk) -> Batch:
    if chunk.kind == LogChunk.Kind.LINES:
        lines = chunk.text.split("\n")
        reason = ""
    else:
        lines = []
        reason = chunk.text
    return Batch(
        chunk.first_cursor, chunk.last_cursor, chunk.kind, chunk.role, chunk.index, chunk.node,
        chunk.stream, chunk.ts, lines, reason, chunk.attempt,
    )  # fmt: skip


def to_chunk(job_id: int, batch: Batch) -> LogChunk:
    text = "\n".join(batch.lines) if batch.kind == LogChunk.Kind.LINES else batch.reason
    return LogChunk(
        job_id=job_id, first_cursor=batch.first, last_cursor=batch.last, kind=batch.kind,
        role=batch.role, index=batch.index, node=batch.node, stream=batch.stream, ts=batch.ts,
        text=text, attempt=batch.attempt,
    )  # fmt: skip


# --- the two places a log lives ---------------------------------------------------------------


def saved_after(job_id: int, after: int, limit: int = PAGE_BATCHES) -> list[Batch]:
    rows = LogChunk.objects.filter(job_id=job_id, last_cursor__gt=after).order_by("last_cursor")
    return [from_chunk(c).after(after) for c in rows[:limit]]


def saved_before(job_id: int, before: int, limit: int = PAGE_BATCHES) -> list[Batch]:
    """Newest first."""
    rows = LogChunk.objects.filter(job_id=job_id, first_cursor__lt=before).order_by("-last_cursor")
    return [from_chunk(c) for c in rows[:limit]]


def saved_head(job_id: int) -> int:
    """Everything up to this cursor is in the database."""
    return int(LogChunk.objects.filter(job_id=job_id).aggregate(m=Max("last_cursor"))["m"] or 0)


def _live(entries: list[RawEntry], after: int) -> list[Batch]:
    return [parse_entry(entry_id, fields).after(after) for entry_id, fields in entries]


def live_after(client: redis.Redis, job_id: int, after: int) -> list[Batch]:
    entries = client.xrange(
        contract.log_stream_key(job_id), min=f"({after}-0", max="+", count=PAGE_BATCHES
    )
    return _live(cast(list[RawEntry], entries), after)


def live_head(client: redis.Redis, job_id: int) -> int:
    return int(cast(str | None, client.get(contract.log_cursor_key(job_id))) or 0)


def batches_after(job_id: int, after: int) -> Iterator[Batch]:
    """Every batch after cursor `after`, in cursor order, up to the end marker if there is one.

    Ranges that are neither in the database nor in Redis come as one GAP batch.
    """
    client = get_redis()
    position = after
    while True:
        saved = saved_after(job_id, position)
        if not saved:
            live = live_after(client, job_id, position)
            if not live:
                return
            if live[0].first > position + 1:
                # Archived between the two reads? Then the database has them now.
                if saved_after(job_id, position, 1):
                    continue
                saved = [gap(position, live[0].first - 1)]
            saved.extend(live)
        for batch in saved:
            yield batch
            position = batch.last
            if batch.kind == LogChunk.Kind.END:
                return


def batches_before(job_id: int, before: int) -> Iterator[Batch]:
    """Batches with lines before cursor `before`, newest first: Redis's unarchived tail, then
    the database."""
    client = get_redis()
    head = saved_head(job_id)
    entries = cast(
        list[RawEntry],
        client.xrevrange(contract.log_stream_key(job_id), max="+", min=f"({head}-0"),
    )
    for entry_id, fields in entries:
        batch = parse_entry(entry_id, fields)
        if batch.first < before:
            yield batch
    position = min(before, head + 1)
    while True:
        saved = saved_before(job_id, position)
        if not saved:
            return
        for batch in saved:
            yield batch
            position = batch.first


def head_cursor(job_id: int) -> int:
    """The newest cursor handed out so far."""
    return max(saved_head(job_id), live_head(get_redis(), job_id))


# --- pages for HTTP ---------------------------------------------------------------------------


@dataclass(frozen=True)
class LineFilter:
    role: str | None = None
    index: int | None = None
    node: str | None = None
    stream: str | None = None  # "stdout" or "stderr"
    text: str | None = None  # case-insensitive substring
    errors: bool = False

    def line(self, batch: Batch, k: int) -> dict[str, Any]:
        """A matching line for HTTP; a search's also says where its hits are in what it shows."""
        line = batch.line_dict(k)
        if self.text:
            line["hits"] = logshape.find(self.text, logshape.shown_text(batch.lines[k]))
        return line

    def batch_may_match(self, batch: Batch) -> bool:
        return (
            batch.is_log
            and (self.role is None or batch.role == self.role)
            and (self.index is None or batch.index == self.index)
            and (self.node is None or batch.node == self.node)
            and (self.stream is None or batch.stream == self.stream)
        )

    def matching(self, batch: Batch) -> list[int]:
        """Positions of the batch's lines that match."""
        if not self.batch_may_match(batch):
            return []
        ks: list[int] = list(range(len(batch.lines)))
        if not (self.text or self.errors):
            return ks
        # Match what the viewer shows, not the text as written (jobs/logshape.py).
        shown = [logshape.shown_text(t) for t in batch.lines]
        if self.text:
            ks = [k for k in ks if logshape.contains(self.text, shown[k])]
        if self.errors:
            ks = [k for k in ks if ERROR_PATTERN.search(shown[k])]
        return ks


@dataclass(frozen=True)
class Page:
    lines: list[dict[str, Any]]
    next: int  # read on after this cursor
    complete: bool  # the end marker was reached: there is nothing after `next`, ever
    more_before: bool = False


def read_page(job_id: int, after: int, limit: int, where: LineFilter | None = None) -> Page:
    """Up to `limit` matching lines after cursor `after`."""
    where = where or LineFilter()
    lines: list[dict[str, Any]] = []
    position = after
    for batch in batches_after(job_id, after):
        if batch.kind == LogChunk.Kind.END:
            return Page(lines, batch.last, True)
        for k in where.matching(batch):
            lines.append(where.line(batch, k))
            if len(lines) == limit:
                return Page(lines, batch.first + k, False)
        position = batch.last
    return Page(lines, position, False)


def read_page_before(job_id: int, before: int, limit: int, where: LineFilter | None = None) -> Page:
    """The last `limit` matching lines before cursor `before`, oldest first."""
    where = where or LineFilter()
    newest_first: list[dict[str, Any]] = []
    for whole in batches_before(job_id, before):
        batch = whole.before(before)
        for k in reversed(where.matching(batch)):
            newest_first.append(where.line(batch, k))
            if len(newest_first) == limit:
                lines = newest_first[::-1]
                return Page(lines, before - 1, False, more_before=True)
    return Page(newest_first[::-1], before - 1, False, more_before=False)


def line_counts(job_id: int) -> dict[str, Any]:
    """Lines per instance and stream, and per node, archived and not yet archived alike."""
    counts: dict[tuple[str, int, str, str], int] = {}
    rows = (
        LogChunk.objects.filter(job_id=job_id, kind=LogChunk.Kind.LINES)
        .exclude(stream=METRIC)
        .values("role", "index", "node", "stream")
        .annotate(n=Sum(F("last_cursor") - F("first_cursor") + 1))
    )
    for row in rows:
        key = (row["role"], row["index"], row["node"], row["stream"])
        counts[key] = counts.get(key, 0) + int(row["n"])
    position = saved_head(job_id)
    client = get_redis()
    while batches := live_after(client, job_id, position):
        for batch in batches:
            if batch.is_log:
                key = (batch.role, batch.index, batch.node, batch.stream)
                counts[key] = counts.get(key, 0) + len(batch.lines)
            position = batch.last
    replicas: dict[tuple[str, int, str], dict[str, Any]] = {}
    by_node: dict[str, int] = {}
    for (role, index, node, stream), n in sorted(counts.items()):
        entry = replicas.setdefault(
            (role, index, node),
            {"tag": tag_of(role, index), "role": role, "index": index, "node": node,
             "stdout": 0, "stderr": 0},
        )  # fmt: skip
        entry[stream] = entry.get(stream, 0) + n
        by_node[node] = by_node.get(node, 0) + n
    return {
        "total": sum(by_node.values()),
        "by_node": by_node,
        "replicas": list(replicas.values()),
    }


# --- metric points ---------------------------------------------------------------------------


def point_value(point: dict[str, Any]) -> float:
    """A point's value as a float: NaN, inf or -inf for a point whose value is null because
    it was not finite (`"value": null, "nonfinite": "nan"`, as workers.metricparse writes it)."""
    if point["value"] is not None:
        return float(point["value"])
    nonfinite = point["nonfinite"]
    if nonfinite not in ("nan", "inf", "-inf"):
        raise ValueError(f"a point's nonfinite is nan, inf or -inf, not {nonfinite!r}")
    return float(nonfinite)


def metric_points(
    job_id: int, after: int = 0, upto: int | None = None, name: str | None = None
) -> tuple[list[dict[str, Any]], int]:
    """Points with cursor in (after, upto], oldest first, and the cursor read up to: archived
    ones from MetricPoint, newer ones from the stream. Points whose value is not finite (null)
    are left out, here as in the archive: charts, figures and exports take numbers only."""
    rows = MetricPoint.objects.filter(job_id=job_id, cursor__gt=after).order_by("cursor")
    if upto is not None:
        rows = rows.filter(cursor__lte=upto)
    if name is not None:
        rows = rows.filter(name=name)
    points = [_point_dict(p) for p in rows]
    position = max(saved_head(job_id), after)
    client = get_redis()
    while upto is None or position < upto:
        batches = live_after(client, job_id, position)
        if not batches:
            break
        for batch in batches:
            if batch.is_metrics:
                points.extend(
                    p
                    for p in batch.points()
                    if p["value"] is not None
                    and (upto is None or p["cursor"] <= upto)
                    and (name is None or p["name"] == name)
                )
            position = batch.last
    return points, position if upto is None else min(position, upto)


def _point_dict(p: MetricPoint) -> dict[str, Any]:
    point: dict[str, Any] = {"name": p.name, "value": p.value}
    if p.step is not None:
        point["step"] = p.step
    if p.epoch is not None:
        point["epoch"] = p.epoch
    point.update(ts=p.ts, cursor=p.cursor, role=p.role, index=p.index, node=p.node)
    return point


# --- the whole text, for download -------------------------------------------------------------


def _text_after(job_id: int, after: int) -> tuple[str, int, bool]:
    """Up to a page of batches as "[tag] line" text; the cursor reached; whether it ended."""
    parts: list[str] = []
    position = after
    for count, batch in enumerate(batches_after(job_id, after)):
        position = batch.last
        if batch.kind == LogChunk.Kind.END:
            parts.append(f"--- log complete: {batch.reason} ---\n")
            return "".join(parts), position, True
        if batch.kind == LogChunk.Kind.GAP:
            parts.append(f"--- {batch.reason} ---\n")
        elif batch.is_log:
            # Lines of a restarted job's later attempts say which (numbered from 1, as shown).
            attempt = f" · attempt {batch.attempt + 1}" if batch.attempt else ""
            prefix = f"[{batch.tag}{attempt}] "
            parts.append(prefix + ("\n" + prefix).join(batch.lines) + "\n")
        if count + 1 >= PAGE_BATCHES:
            break
    # Nothing more to read now: the end of what exists so far.
    return "".join(parts), position, position == after


async def log_text(job_id: int) -> AsyncIterator[bytes]:
    """The job's whole log as text, a page at a time: never held in memory at once."""
    position = 0
    read = sync_to_async(_text_after)
    while True:
        text, position, done = await read(job_id, position)
        if text:
            yield text.encode()
        if done:
            return


# --- following live, for the websocket --------------------------------------------------------


async def _answered_in_time(command: Awaitable[Any], seconds: float) -> Any:
    """The command's answer, or redis.TimeoutError after `seconds` (the async clients have no
    socket timeout of their own: jobs.redis_client.get_async_redis says why)."""
    try:
        async with asyncio.timeout(seconds):
            return await command
    except TimeoutError:
        raise redis.TimeoutError(f"Redis did not answer within {seconds} s") from None


async def follow(
    client: redis.asyncio.Redis, job_id: int, after: int
) -> AsyncIterator[list[Batch]]:
    """Every batch after cursor `after`, then live ones as they come, until the end marker.

    Yields an empty list when nothing came for a while, so the caller can send a heartbeat or
    notice that its client left.
    """
    key = contract.log_stream_key(job_id)
    position = after
    read_saved = sync_to_async(saved_after)
    # The database first: it has everything the keeper archived, and a finished job's log may
    # no longer be in Redis at all. Once caught up, Redis alone, until it goes quiet.
    from_database = True
    while True:
        if from_database:
            batches = await read_saved(job_id, position)
            if not batches:
                from_database = False
                continue
        else:
            response = cast(
                list[tuple[str, list[RawEntry]]],
                await _answered_in_time(
                    client.xread(
                        {key: f"{position}-0"},
                        count=PAGE_BATCHES,
                        block=int(FOLLOW_BLOCK_SECONDS * 1000),
                    ),
                    FOLLOW_BLOCK_SECONDS + READ_MARGIN_SECONDS,
                ),
            )
            if not response:
                from_database = True
                yield []
                continue
            batches = _live(response[0][1], position)
            if batches[0].first > position + 1:
                if await read_saved(job_id, position, 1):
                    from_database = True  # archived meanwhile, then trimmed
                    continue
                batches.insert(0, gap(position, batches[0].first - 1))
        for k, batch in enumerate(batches):
            if batch.kind == LogChunk.Kind.END:
                if k:
                    yield batches[:k]
                yield [batch]
                return
        yield batches
        position = batches[-1].last
