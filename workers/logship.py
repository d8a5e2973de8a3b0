"""Reading a process's pipes and shipping the lines to Redis in batches, spooling to disk when
Redis is away.

Each pipe of each process has its own reader thread, so lines of different ranks or streams can
never glue together. Readers only put chunks of lines on an in-memory queue: a slow or absent
Redis never blocks the pipe and so never blocks the trainer. One shipper thread drains the
queue, packs consecutive lines of one pipe into batches and appends them all in one round trip.
When Redis cannot be reached, batches go to an append-only spool on local disk instead, and
are sent from there, in order, before anything newer once Redis answers again.
"""

import fcntl
import logging
import os
import queue
import re
import select
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO

import redis

from workers import contract
from workers.logquota import LogBudget, LogLimits, Marker
from workers.logsink import GAP, Ledger, LogBatch, LogSink

log = logging.getLogger(__name__)

# A line longer than this many characters is cut into pieces of this size; every piece but the
# last ends with CONTINUED, so a reader can tell a cut from a real line end.
MAX_LINE_CHARS = 16 * 1024
CONTINUED = " ⏎…"
# A partial line (no newline yet) is sent as a line once its pipe has been quiet this long, so a
# prompt or progress text written without a newline still shows up.
PARTIAL_FLUSH_SECONDS = 0.5
READ_BYTES = 256 * 1024
SMALL_READ_BYTES = 16 * 1024
READ_PAUSE_SECONDS = 0.002
PIPE_BYTES = 256 * 1024  # 17 ms of a 15 MB/s flood; the default is 64 KiB
# Lines per stream entry at most: large enough to amortise the round trip, small enough that a
# websocket frame stays modest.
MAX_BATCH_LINES = 1000
MAX_BATCH_CHARS = 512 * 1024
# Queue items (chunks of lines) one round trip takes at most.
MAX_DRAIN_ITEMS = 2000
# How long the shipper gathers lines before sending what it has.
LINGER_SECONDS = 0.02
SPOOL_RETRY_SECONDS = 0.5
SPOOL_REPLAY_BATCHES = 200
# Redis refusing a job's lines (NOPERM) is no outage: the agent's ACL user may touch a job's keys
# only while the console grants it (workers/credentials.py). A grant may lag a moment behind a
# start (reconciliation re-asserts it), so refused lines wait in the spool like any others; once
# a job's lines have been refused this long, the job is no business of this node any more
# (it ended long ago) and they are dropped, so they cannot hold up every later line.
REFUSED_GIVE_UP_SECONDS = 120.0
# Writer names of lines read from files by offset (a keeper's output files, metrics files).
FILE_WRITER_PREFIX = "f:"

# Escape sequences other than colour are kept as they are: the viewer strips what it does not
# render. Only NUL is removed, which no database text column takes.
_NUL = re.compile("\x00")


@dataclass(frozen=True, slots=True)
class ReplicaKey:
    job_id: int
    role: str
    index: int
    node: str
    attempt: int = 0  # the job attempt the process belongs to: its lines are tagged with it


@dataclass(frozen=True, slots=True)
class _Chunk:
    """Lines one read of one pipe returned."""

    key: ReplicaKey
    stream: str
    ts: float
    lines: list[str]
    # A marker's chunk: the lines and points over the replica's budget that it accounts for.
    # Such a chunk is a stream entry of its own, so its counts reach the console exactly once.
    dropped_lines: int = 0
    dropped_points: int = 0
    # Lines read from a file by offset (workers/filetail.py): the file's writer name and the
    # offset the lines end at, which become the batch's writer and sequence number.
    writer: str | None = None
    seq: int = 0
    # A file's lines: the offset they start at, and the reading of the file they come from.
    start: int = -1
    generation: int = 0


def _is_skip(chunk: _Chunk) -> bool:
    """A file's lines that were all dropped over the budget (LogShipper.put)."""
    return chunk.writer is not None and not chunk.lines


def _same_reading(current: _Chunk, chunk: _Chunk) -> bool:
    """Whether `chunk` follows `current` in the same reading of the same file (no marker)."""
    return (
        current.key == chunk.key
        and current.writer == chunk.writer
        and current.generation == chunk.generation
        and not (current.dropped_lines or current.dropped_points)
        and not (chunk.dropped_lines or chunk.dropped_points)
    )


class _Barrier:
    """Queued behind lines; set once every line queued before it is in Redis."""

    def __init__(self) -> None:
        self.done = threading.Event()


# --- reading a pipe ---------------------------------------------------------------------------


def pump_pipe(
    pipe: IO[bytes],
    emit: Callable[[float, list[str]], None],
    max_line_chars: int = MAX_LINE_CHARS,
    partial_flush_seconds: float = PARTIAL_FLUSH_SECONDS,
) -> None:
    """Read `pipe` to EOF, calling `emit(read_time, lines)` with the complete lines of each read
    (no newline, valid UTF-8; a trailing "\\r" is dropped).

    Lines are cut at the newline byte only, so bytes of one line that arrive in several writes
    stay one line. Invalid UTF-8 becomes U+FFFD. A partial line is held until its newline, or
    sent as it is after `partial_flush_seconds` without any byte.
    """
    fd = pipe.fileno()
    _enlarge(fd)
    pending = b""
    # A pending partial line longer than this many bytes cannot be under the character limit.
    max_pending = max_line_chars * 4
    try:
        while True:
            if pending and not select.select([fd], [], [], partial_flush_seconds)[0]:
                emit(time.time(), _split_long([_decode(pending)], max_line_chars))
                pending = b""
                continue
            data = os.read(fd, READ_BYTES)
            if not data:
                break
            now = time.time()
            if len(data) < SMALL_READ_BYTES:
                # A trickle: let a few milliseconds of output gather before the next read, so
                # a trainer printing line by line costs one read per batch, not one per line.
                # The pipe holds a megabyte meanwhile; the trainer never waits on it.
                time.sleep(READ_PAUSE_SECONDS)
            cut = data.rfind(b"\n")
            if cut < 0:
                pending += data
                if len(pending) > max_pending:
                    head, pending = _cut_at_char(pending, max_pending)
                    emit(now, _split_long([_decode(head)], max_line_chars, last_continues=True))
                continue
            complete = pending + data[:cut] if pending else data[:cut]
            pending = data[cut + 1 :]
            lines = _decode(complete).replace("\r\n", "\n").split("\n")
            if max(map(len, lines)) > max_line_chars:
                lines = _split_long(lines, max_line_chars)
            emit(now, lines)
        if pending:
            emit(time.time(), _split_long([_decode(pending)], max_line_chars))
    finally:
        pipe.close()


def _enlarge(fd: int) -> None:
    """Give the pipe room for bursts while the reader pauses (Linux only; best effort)."""
    try:
        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), PIPE_BYTES)
    except OSError:
        pass  # over the host's pipe-max-size, or not a pipe: the default size still works


def _decode(data: bytes) -> str:
    text = data.decode("utf-8", errors="replace")
    if "\r" in text and text.endswith("\r"):
        text = text[:-1]
    return _NUL.sub("", text) if "\x00" in text else text


def _cut_at_char(data: bytes, limit: int) -> tuple[bytes, bytes]:
    """Split before `limit`, never inside a UTF-8 sequence (continuation bytes are 10xxxxxx)."""
    cut = limit
    while cut > limit - 4 and cut > 0 and (data[cut] & 0xC0) == 0x80:
        cut -= 1
    return data[:cut], data[cut:]


def _split_long(lines: list[str], limit: int, last_continues: bool = False) -> list[str]:
    out: list[str] = []
    for line in lines:
        if len(line) <= limit:
            out.append(line)
            continue
        pieces = [line[k : k + limit] for k in range(0, len(line), limit)]
        out.extend(piece + CONTINUED for piece in pieces[:-1])
        out.append(pieces[-1])
    if last_continues and out:
        out[-1] += CONTINUED
    return out


# --- shipping ---------------------------------------------------------------------------------


class LogShipper:
    """Ships every line it is given to Redis, in order per pipe, exactly once.

    `spool_dir` holds batches that could not be sent yet, across restarts of the agent: a new
    shipper sends what an earlier one left there before its own lines.
    """

    def __init__(
        self,
        client: redis.Redis,
        spool_dir: Path,
        retry_seconds: float = SPOOL_RETRY_SECONDS,
        writer: str | None = None,
    ) -> None:
        self._sink = LogSink(client)
        self._spool = Spool(spool_dir)
        # The highest sequence number of each file's lines in the spool an earlier agent left:
        # a file's lines there are on their way, and are not read again.
        self._spooled = self._spool.last_seqs(FILE_WRITER_PREFIX)
        self._writer = writer or uuid.uuid4().hex[:16]
        self._seq = 0
        self._queue: queue.SimpleQueue[_Chunk | _Barrier | None] = queue.SimpleQueue()
        self._retry_seconds = retry_seconds
        self._next_try = 0.0
        self._refused_since: dict[int, float] = {}  # job id -> when Redis first refused it
        self._held_barriers: list[_Barrier] = []
        self._budgets: dict[ReplicaKey, LogBudget] = {}
        # Per file writer, what reads its file again from where Redis has its lines.
        self._rewinders: dict[str, Callable[[int], None]] = {}
        # Per file writer, the sequence number of the last lines it was given (not dropped over
        # a budget): where the writer's lines end once its file is read to the end.
        self._last_seqs: dict[str, int] = {}
        self._thread = threading.Thread(target=self._run, name="log-shipper", daemon=True)
        self._thread.start()

    def limit(self, key: ReplicaKey, limits: LogLimits) -> None:
        """From now on, the replica's lines and metric points are held to `limits`."""
        self._budgets[key] = LogBudget(limits, time.monotonic())

    def release(self, key: ReplicaKey) -> None:
        """The replica ended: ship the marker for drops not yet told, and forget its budget."""
        budget = self._budgets.pop(key, None)
        if budget is not None:
            self._put_marker(key, time.time(), budget.final_marker())

    def put(
        self,
        key: ReplicaKey,
        stream: str,
        ts: float,
        lines: list[str],
        source: tuple[str, int] | None = None,
        start: int = -1,
        generation: int = 0,
    ) -> None:
        """Never blocks: the trainer's pipe must keep draining whatever Redis does. Lines (or
        metric points) over the replica's budget are dropped here, before they take memory,
        spool or Redis, and counted in a marker line.

        `source` (writer, offset) names lines read from a file by offset: they go to Redis under
        that writer, with the offset as sequence number, so that whoever reads the file again
        from an offset that `shipped_offset` gave sends each line once. With `start`, the
        offset the lines start at (where the writer's previous lines ended) and the reading of
        the file they come from (`generation`), Redis checks that it has those previous lines:
        if it lost them, the writer's rewinder (see `watch`) is asked to read them again."""
        budget = self._budgets.get(key)
        marker = None
        read = len(lines)
        if budget is not None:
            now = time.monotonic()
            if stream == contract.STREAM_METRIC:
                allowed, marker = budget.admit_points(len(lines), now)
                lines = lines[:allowed]
            else:
                lines, marker = budget.admit_lines(lines, now)
        if lines:
            writer, seq = source or (None, 0)
            if writer is not None:
                self._last_seqs[writer] = max(seq, self._last_seqs.get(writer, -1))
            chunk = _Chunk(
                key, stream, ts, lines, writer=writer, seq=seq, start=start, generation=generation
            )
            self._queue.put(chunk)
        elif read and source is not None and start >= 0:
            # Every line of this read of a file was dropped on purpose: Redis is still told
            # that the writer's lines went past them (a skip), or its next lines would look
            # like a gap to fill from the file again (and be dropped again, forever); and the
            # log keeper's acknowledgement moves past them, so the file's bytes are freed.
            skip = _Chunk(
                key, stream, ts, [], writer=source[0], seq=source[1], start=start,
                generation=generation,
            )  # fmt: skip
            self._queue.put(skip)
        self._put_marker(key, ts, marker)

    def watch(self, writer: str, rewind: Callable[[int], None]) -> None:
        """`rewind(generation)` reads a file writer's file again when Redis lost its lines."""
        self._rewinders[writer] = rewind

    def unwatch(self, writer: str) -> None:
        self._rewinders.pop(writer, None)

    def last_seq(self, writer: str) -> int:
        """The sequence number of the last lines a file writer was given here (-1: none)."""
        return self._last_seqs.get(writer, -1)

    def forget(self, writer: str) -> None:
        """The writer's lines are all in the database (or given up on): forget its end."""
        self._last_seqs.pop(writer, None)

    def ledger(self, job_id: int, writer: str) -> Ledger:
        """What Redis tells of a file writer's lines (workers/filetail.py)."""
        epoch_key = contract.log_epoch_key(job_id)
        return Ledger(
            seen=lambda: self._sink.seen(job_id, writer),
            acked=lambda: self._sink.acked(job_id, writer),
            epoch=lambda: str(self._sink.client.get(epoch_key) or ""),
        )

    def shipped_offset(self, job_id: int, writer: str) -> int:
        """How far a file's lines have gone (to Redis, or to the spool, which sends them): the
        offset to read it again from. Raises redis.RedisError while Redis is unreachable."""
        in_redis = self._sink.seen(job_id, writer)
        return max(in_redis, self._spooled.get(writer, 0), 0)

    def put_system(self, key: ReplicaKey, ts: float, lines: list[str]) -> None:
        """The agent's own lines about a replica (stderr): never held to the trainer's budget."""
        self._queue.put(_Chunk(key, contract.STREAM_STDERR, ts, lines))

    def _put_marker(self, key: ReplicaKey, ts: float, marker: Marker | None) -> None:
        if marker is not None:
            chunk = _Chunk(
                key, contract.STREAM_STDERR, ts, [marker.text],
                marker.dropped_lines, marker.dropped_points,
            )  # fmt: skip
            self._queue.put(chunk)

    def flush(self, timeout: float | None = None) -> bool:
        """Block until everything put so far is in Redis (or timeout); True when it is."""
        barrier = _Barrier()
        self._queue.put(barrier)
        return barrier.done.wait(timeout)

    def close(self, timeout: float = 10.0) -> None:
        self.flush(timeout)
        self._queue.put(None)
        self._thread.join(timeout)

    @property
    def spooling(self) -> bool:
        return not self._spool.empty()

    def _run(self) -> None:
        while True:
            try:
                # While batches wait on disk, wake up now and then to send them.
                item = self._queue.get(timeout=self._retry_seconds if self.spooling else None)
            except queue.Empty:
                self._send_spooled()
                continue
            if item is None:
                return
            items: list[_Chunk | _Barrier] = [item]
            # Linger a moment for more, as Kafka producers do: every round trip (and every
            # entry the console then reads, archives and relays) costs the same whether it
            # holds one line or a thousand, so a few milliseconds here save most of the CPU
            # a chatty trainer would cost. A flush does not wait.
            deadline = time.monotonic() + LINGER_SECONDS
            while len(items) < MAX_DRAIN_ITEMS and not isinstance(items[-1], _Barrier):
                try:
                    more = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if more is None:
                    self._queue.put(None)  # handled after this drain
                    break
                items.append(more)
            self._ship(items)

    def _ship(self, items: list[_Chunk | _Barrier]) -> None:
        chunks: list[_Chunk] = []
        for item in items:
            if isinstance(item, _Barrier):
                self._deliver(self._pack(chunks))
                chunks = []
                self._held_barriers.append(item)
                self._release_barriers()
            else:
                chunks.append(item)
        self._deliver(self._pack(chunks))

    def _pack(self, chunks: list[_Chunk]) -> list[LogBatch]:
        """Consecutive chunks of one pipe become one batch, up to the batch limits."""
        batches: list[LogBatch] = []
        current: _Chunk | None = None  # the batch's first chunk (its time, its pipe)
        seq_of: _Chunk | None = None  # its last (a file's batch ends at its offset)
        lines: list[str] = []
        chars = 0
        for chunk in chunks:
            if _is_skip(chunk):
                # Dropped lines of a file: the batch of the same reading of the file before
                # them ends after them, or they are a batch of their own (of no lines).
                if current is not None and _same_reading(current, chunk):
                    seq_of = chunk
                    continue
                if current is not None and (lines or _is_skip(current)):
                    batches.append(self._batch(current, lines, seq_of))
                current, seq_of, lines, chars = chunk, chunk, [], 0
                continue
            # A file's chunk stays whole: all of it has one sequence number (its end offset).
            step = MAX_BATCH_LINES if chunk.writer is None else max(1, len(chunk.lines))
            for start in range(0, len(chunk.lines), step):
                part = chunk.lines[start : start + step]
                size = sum(map(len, part))
                if current is not None and _is_skip(current) and _same_reading(current, chunk):
                    # Lines after a skip of the same reading: one batch, from the skip's start.
                    current = replace(chunk, start=current.start)
                same_pipe = (
                    current is not None
                    and current.key == chunk.key
                    and current.stream == chunk.stream
                    and current.writer == chunk.writer
                    and current.generation == chunk.generation
                    and not (current.dropped_lines or current.dropped_points)
                    and not (chunk.dropped_lines or chunk.dropped_points)
                )
                if (
                    not same_pipe
                    or len(lines) + len(part) > MAX_BATCH_LINES
                    or chars + size > MAX_BATCH_CHARS
                ):
                    if current is not None and (lines or _is_skip(current)):
                        batches.append(self._batch(current, lines, seq_of))
                    current = chunk
                    lines = []
                    chars = 0
                lines.extend(part)
                chars += size
                seq_of = chunk
        if current is not None and (lines or _is_skip(current)):
            batches.append(self._batch(current, lines, seq_of))
        return batches

    def _batch(self, chunk: _Chunk, lines: list[str], last: _Chunk | None = None) -> LogBatch:
        """The batch of `lines` from `chunk` on; a file's batch ends at `last`'s offset."""
        if chunk.writer is not None:
            writer, seq = chunk.writer, (last or chunk).seq
        else:
            self._seq += 1
            writer, seq = self._writer, self._seq
        key = chunk.key
        return LogBatch(
            key.job_id, key.role, key.index, key.node, chunk.stream, chunk.ts, lines,
            writer, seq, key.attempt, chunk.dropped_lines, chunk.dropped_points,
            chunk.start, chunk.generation,
        )  # fmt: skip

    def _deliver(self, batches: list[LogBatch]) -> None:
        if not batches:
            return
        if self.spooling:
            # Older lines wait on disk: these go behind them, or order would break.
            self._spool.append(batches)
            self._send_spooled()
            return
        try:
            self._answered(batches, self._sink.append(batches))
        except redis.RedisError as exc:
            log.warning(
                "Redis unreachable or full (%s): spooling log lines to %s", exc, self._spool.dir
            )
            # Some of them may have been appended; the sink drops those when they come again.
            self._spool.append(batches)
            self._next_try = time.monotonic() + self._retry_seconds

    def _send_spooled(self) -> None:
        if time.monotonic() < self._next_try:
            return
        try:
            while not self._spool.empty():
                batches = self._spool.peek(SPOOL_REPLAY_BATCHES)
                try:
                    self._answered(batches, self._sink.append(batches))
                except redis.exceptions.NoPermissionError:
                    self._send_one_by_one(batches)
                    continue
                self._spool.consume(len(batches))
                self._refused_since.clear()
        except redis.RedisError:
            self._next_try = time.monotonic() + self._retry_seconds
            return
        log.warning("Redis is back: spooled log lines sent")
        self._release_barriers()

    def _send_one_by_one(self, batches: list[LogBatch]) -> None:
        """Send the spool's first batches singly, dropping those of a job that Redis has
        refused for REFUSED_GIVE_UP_SECONDS; raises NoPermissionError at one it refuses less
        long (it stays first in the spool)."""
        for batch in batches:
            try:
                self._answered([batch], self._sink.append([batch]))
            except redis.exceptions.NoPermissionError:
                now = time.monotonic()
                since = self._refused_since.setdefault(batch.job_id, now)
                if now - since < REFUSED_GIVE_UP_SECONDS:
                    raise
                log.warning(
                    "Redis has refused lines of job %s for %.0f s (this node may no longer "
                    "write its log): dropping %s of them", batch.job_id, now - since,
                    len(batch.lines),
                )  # fmt: skip
            self._spool.consume(1)

    def _answered(self, batches: list[LogBatch], cursors: list[int]) -> None:
        """Batches Redis refused because it lost their writer's earlier lines are read again
        from the writer's file; nothing of them was appended."""
        for batch, cursor in zip(batches, cursors, strict=True):
            if cursor != GAP:
                continue
            rewind = self._rewinders.get(batch.writer)
            if rewind is not None:
                rewind(batch.generation)
            else:
                log.error(
                    "job %s: Redis lost lines of %s before offset %s, and no file follows it now",
                    batch.job_id, batch.writer, batch.start,
                )  # fmt: skip

    def _release_barriers(self) -> None:
        if self.spooling:
            return
        for barrier in self._held_barriers:
            barrier.done.set()
        self._held_barriers.clear()


class Spool:
    """An append-only queue of batches on local disk, in segment files read oldest first.

    Only the shipper thread touches it. Appends are flushed and fsynced before they count, so a
    crash of the agent (or of the host) after that loses nothing. A segment is deleted only once
    every batch in it was sent; sending one again after a crash is harmless because the sink
    ignores batches it has seen.

    A write the disk has no room for (or fails otherwise) is cut back to where it began, so
    no segment ever holds a torn line, and its batches wait in memory behind the segments;
    every later append tries the disk again with them first, so they are on disk as soon as
    there is room, and sent in order either way.
    """

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self._writing: IO[bytes] | None = None
        self._writing_path: Path | None = None
        self._read_path: Path | None = None
        self._read_file: IO[bytes] | None = None
        self._read_buffer: list[LogBatch] = []
        self._segments = sorted(self.dir.glob("*.spool"))  # left by an earlier agent, if any
        # Batches the disk had no room for, newest last: they come after every segment.
        self._in_memory: list[LogBatch] = []

    def empty(self) -> bool:
        return not self._segments and not self._in_memory

    def last_seqs(self, prefix: str) -> dict[str, int]:
        """The highest sequence number per writer whose name starts with `prefix`, over every
        batch in the spool (read once, when an agent starts)."""
        seqs: dict[str, int] = {}
        for segment in self._segments:
            with open(segment, "rb") as f:
                for line in f:
                    if not line.endswith(b"\n"):
                        break  # torn by a crash: never counted
                    batch = LogBatch.from_json(line.decode())
                    if batch.writer.startswith(prefix):
                        seqs[batch.writer] = max(seqs.get(batch.writer, 0), batch.seq)
        return seqs

    def append(self, batches: list[LogBatch]) -> None:
        pending = self._in_memory + batches
        try:
            self._write(pending)
        except OSError as exc:
            if not self._in_memory:
                log.warning(
                    "log spool %s not writable (%s): lines wait in memory until it is",
                    self.dir, exc.strerror or exc,
                )  # fmt: skip
            self._in_memory = pending
            return
        if self._in_memory:
            log.warning("log spool %s writable again: lines held in memory spooled", self.dir)
        self._in_memory = []

    def _write(self, batches: list[LogBatch]) -> None:
        """All of `batches` on disk, fsynced, or none of them (OSError)."""
        if self._writing is None:
            path = self.dir / f"{time.time_ns():020d}-{os.getpid()}.spool"
            # Unbuffered: a failed write leaves nothing behind in a buffer to be flushed later.
            self._writing = open(path, "ab", buffering=0)
            self._writing_path = path
            self._segments.append(path)
        start = self._writing.tell()
        data = memoryview("".join(b.to_json() + "\n" for b in batches).encode())
        try:
            while data:
                written = self._writing.write(data)
                data = data[written or 0 :]
            os.fsync(self._writing.fileno())
        except OSError:
            self._cut_back(start)
            raise

    def _cut_back(self, start: int) -> None:
        """Undo a failed write: the segment ends where it did before (truncating frees the
        blocks the write took); a segment left empty goes."""
        assert self._writing is not None and self._writing_path is not None
        try:
            os.ftruncate(self._writing.fileno(), start)
            self._writing.seek(start)
        except OSError:
            log.exception("log spool segment %s could not be cut back", self._writing_path)
        if start == 0 and self._read_path != self._writing_path:
            self._writing.close()
            self._writing_path.unlink(missing_ok=True)
            self._segments.remove(self._writing_path)
            self._writing = None
            self._writing_path = None

    def peek(self, limit: int) -> list[LogBatch]:
        """Up to `limit` of the oldest batches, without removing them."""
        if not self._segments:
            return self._in_memory[:limit]
        while len(self._read_buffer) < limit and self._segments:
            if self._read_file is None:
                self._read_path = self._segments[0]
                self._read_file = open(self._read_path, "rb")
            line = self._read_file.readline()
            if line.endswith(b"\n"):
                self._read_buffer.append(LogBatch.from_json(line.decode()))
                continue
            # The end of this segment. A torn last line was a write a crash interrupted before
            # it counted: its lines were never taken from the pipe reader's hands.
            if self._read_path == self._writing_path or self._read_buffer:
                break
            self._finish_segment()
        return self._read_buffer[:limit]

    def consume(self, count: int) -> None:
        """The first `count` batches peek returned are in Redis."""
        if not self._segments:
            del self._in_memory[:count]
            return
        del self._read_buffer[:count]
        if self._read_buffer or self._read_file is None or self._read_path is None:
            return
        position = self._read_file.tell()
        if self._read_path == self._writing_path:
            assert self._writing is not None
            if position >= self._writing.tell():
                self._writing.close()
                self._writing = None
                self._writing_path = None
                self._finish_segment()
        elif position >= self._read_path.stat().st_size:
            self._finish_segment()

    def _finish_segment(self) -> None:
        assert self._read_file is not None and self._read_path is not None
        self._read_file.close()
        self._read_path.unlink(missing_ok=True)
        self._segments.remove(self._read_path)
        self._read_file = None
        self._read_path = None
