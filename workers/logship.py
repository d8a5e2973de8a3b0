"""Reading a process's pipes line by line and shipping the lines to Redis in batches.

Each pipe of each process has its own reader thread, so lines of different ranks or streams can
never glue together. Readers only put lines on an in-memory queue: a slow or absent Redis never
blocks the pipe and so never blocks the trainer. One shipper thread drains the queue, groups
consecutive lines by replica and appends each group as one stream entry.
"""

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO

import redis

from workers.logsink import LogRecord, LogSink

log = logging.getLogger(__name__)

# A line longer than this is cut into pieces of this size; each piece is its own log line.
MAX_LINE_BYTES = 64 * 1024
# Lines per stream entry at most: large enough to amortise a round trip, small enough that a
# websocket frame stays modest.
MAX_BATCH_LINES = 500


@dataclass(frozen=True)
class ReplicaKey:
    job_id: int
    role: str
    index: int
    node: str


@dataclass(frozen=True)
class _Line:
    key: ReplicaKey
    record: LogRecord


class _Barrier:
    """Queued behind lines; set once every line queued before it has reached Redis."""

    def __init__(self) -> None:
        self.done = threading.Event()


class LogShipper:
    def __init__(self, client: redis.Redis, retry_seconds: float = 0.5) -> None:
        self._sink = LogSink(client)
        self._queue: queue.SimpleQueue[_Line | _Barrier | None] = queue.SimpleQueue()
        self._retry_seconds = retry_seconds
        self._thread = threading.Thread(target=self._run, name="log-shipper", daemon=True)
        self._thread.start()

    def put(self, key: ReplicaKey, stream: str, text: str) -> None:
        self._queue.put(_Line(key, (stream, time.time(), text)))

    def flush(self, timeout: float | None = None) -> bool:
        """Block until everything put so far is in Redis (or timeout); True when it is."""
        barrier = _Barrier()
        self._queue.put(barrier)
        return barrier.done.wait(timeout)

    def close(self, timeout: float = 10.0) -> None:
        self.flush(timeout)
        self._queue.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            batch: list[_Line | _Barrier] = [item]
            # Take whatever else is already waiting, without blocking: under load this makes
            # batches large, when idle every line leaves at once.
            while len(batch) < MAX_BATCH_LINES * 4:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    self._queue.put(None)  # handle after this batch
                    break
                batch.append(more)
            self._ship(batch)

    def _ship(self, batch: list["_Line | _Barrier"]) -> None:
        pending: list[_Line] = []
        for item in batch:
            if isinstance(item, _Barrier):
                self._write(pending)
                pending = []
                item.done.set()
            else:
                pending.append(item)
        self._write(pending)

    def _write(self, lines: list[_Line]) -> None:
        # Consecutive lines of one replica become one entry; order within a replica is kept.
        groups: deque[tuple[ReplicaKey, list[LogRecord]]] = deque()
        for line in lines:
            if groups and groups[-1][0] == line.key and len(groups[-1][1]) < MAX_BATCH_LINES:
                groups[-1][1].append(line.record)
            else:
                groups.append((line.key, [line.record]))
        while groups:
            key, records = groups[0]
            try:
                self._sink.append_lines(key.job_id, key.role, key.index, key.node, records)
            except redis.RedisError as exc:
                # Keep the lines and try again: nothing is dropped while Redis is away.
                log.warning("log shipping to Redis failed (%s); retrying", exc)
                time.sleep(self._retry_seconds)
                continue
            groups.popleft()


def pump_pipe(
    pipe: IO[bytes], emit: Callable[[str], None], max_line_bytes: int = MAX_LINE_BYTES
) -> None:
    """Read `pipe` to EOF, calling `emit` with each line's text (no newline, valid UTF-8).

    `readline` waits for the newline, so a writer that sends text and newline separately (as
    `python -u` does) still gives one line. Invalid UTF-8 becomes U+FFFD rather than an error.
    """
    with pipe:
        while True:
            chunk = pipe.readline(max_line_bytes)
            if not chunk:
                return
            if chunk.endswith(b"\n"):
                chunk = chunk[:-1]
                if chunk.endswith(b"\r"):
                    chunk = chunk[:-1]
            emit(chunk.decode("utf-8", errors="replace"))
