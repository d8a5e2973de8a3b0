"""Appending batches of lines to a job's Redis Stream, with cursors that only grow, exactly once.

Several agents write one job's stream at once. A Lua script takes the next cursors from a
per-job counter and appends the batch in one atomic step, so stream order and cursor order are
the same thing and a reader can resume after any cursor with one XRANGE.

Every batch carries its writer's name and a sequence number that grows per writer. The script
drops a batch whose number it has seen, so a writer may resend whatever it is unsure of (after a
dropped connection, or from its disk spool after a crash) without ever duplicating a line.
"""

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from workers import contract

# KEYS[1] stream, KEYS[2] cursor counter, KEYS[3] last sequence seen per writer, KEYS[4] acked per
# writer, KEYS[5] skipped per writer (workers/contract.py, log_skip_key).
# ARGV[1] lines in the batch, ARGV[2] approximate MAXLEN, ARGV[3] writer, ARGV[4] its sequence
# number, ARGV[5] the sequence number the writer's previous batch ended at (-1: not checked),
# ARGV[6..] field/value pairs. Returns the cursor of the batch's last line, -1 for a batch
# already appended (or one of no lines), or GAP when the writer's previous batch is not there:
# Redis lost it (a crash under appendfsync everysec), and the writer must send again from what
# Redis has.
#
# A batch of no lines is a skip: its writer's lines up to its sequence number were dropped on
# purpose (over the replica's log budget). Nothing is appended, but Redis now has the writer's
# lines to there (its next batch is no gap), and they count as acknowledged as soon as the
# database has every line of the writer before them: at once if it has, else (KEYS[5]) when the
# log keeper acknowledges the writer's last batch before the skip (jobs/services/logarchive.py).
# Consecutive skips make one; a skip after a batch with lines starts a new one.
_APPEND_LUA = """
local seen = tonumber(redis.call('HGET', KEYS[3], ARGV[3]) or '-1')
if tonumber(ARGV[4]) <= seen then return -1 end
local start = tonumber(ARGV[5])
if start > 0 and start > seen then return -2 end
redis.call('HSET', KEYS[3], ARGV[3], ARGV[4])
if tonumber(ARGV[1]) == 0 then
  local base = seen
  local pending = redis.call('HGET', KEYS[5], ARGV[3])
  if pending then
    local from, upto = string.match(pending, '^(%-?%d+) (%-?%d+)$')
    if tonumber(upto) == seen then base = tonumber(from) end
  end
  if tonumber(redis.call('HGET', KEYS[4], ARGV[3]) or '-1') >= base then
    redis.call('HSET', KEYS[4], ARGV[3], ARGV[4])
    redis.call('HDEL', KEYS[5], ARGV[3])
  else
    redis.call('HSET', KEYS[5], ARGV[3], base .. ' ' .. ARGV[4])
  end
  return -1
end
local last = redis.call('INCRBY', KEYS[2], tonumber(ARGV[1]))
local args = {KEYS[1], 'MAXLEN', '~', ARGV[2], last .. '-0', 'w', ARGV[3], 'q', ARGV[4]}
for i = 6, #ARGV do args[#args + 1] = ARGV[i] end
redis.call('XADD', unpack(args))
return last
"""

# Entries kept in Redis per job before the oldest are trimmed (an entry holds up to a few
# hundred lines). The console archives entries to the database long before they are trimmed.
DEFAULT_MAXLEN = 100_000

# What append answers for a batch whose writer's previous batch Redis does not have.
GAP = -2

# The writer name of the end marker: whoever appends it first wins, every later try is a no-op.
END_WRITER = "end"


@dataclass(frozen=True)
class Ledger:
    """What Redis tells of one file's lines: how far they are in the job's stream (`seen`), how
    far in the database (`acked`), and the job's log epoch (new after each realignment)."""

    seen: Callable[[], int]
    acked: Callable[[], int]
    epoch: Callable[[], str]


@dataclass(frozen=True, slots=True)
class LogBatch:
    """Consecutive lines of one process's stdout or stderr, as one stream entry; or, with no
    lines, a file writer's skip: its lines up to `seq` were dropped over its budget."""

    job_id: int
    role: str
    index: int
    node: str
    stream: str  # contract.STREAM_STDOUT or STREAM_STDERR
    ts: float
    lines: Sequence[str]
    writer: str
    seq: int
    attempt: int = 0  # the job attempt the process belongs to (0: the first run)
    # A marker's batch (workers.logquota): how many lines and metric points over the budget
    # it accounts for.
    dropped_lines: int = 0
    dropped_points: int = 0
    # A file's batch: the offset its writer's previous batch ended at (its lines start there),
    # which Redis checks; -1: not checked (lines with no file to read them from again).
    start: int = -1
    # Which reading of its file the batch comes from (workers/filetail.py counts them): a gap
    # answered to a batch of an earlier reading is already being filled.
    generation: int = 0

    def fields(self) -> dict[str, str]:
        fields = {
            contract.FIELD_ROLE: self.role,
            contract.FIELD_INDEX: str(self.index),
            contract.FIELD_NODE: self.node,
            contract.FIELD_STREAM: self.stream,
            contract.FIELD_TS: repr(self.ts),
            contract.FIELD_LINES: "\n".join(self.lines),
        }
        if self.attempt > 0:
            fields[contract.FIELD_ATTEMPT] = str(self.attempt)
        if self.dropped_lines:
            fields[contract.FIELD_DROPPED_LINES] = str(self.dropped_lines)
        if self.dropped_points:
            fields[contract.FIELD_DROPPED_POINTS] = str(self.dropped_points)
        return fields

    def to_json(self) -> str:
        """One line of the agent's disk spool (the attempt only when > 0 or drops follow it,
        the drops only when there are some)."""
        values = [
            self.job_id,
            self.role,
            self.index,
            self.node,
            self.stream,
            self.ts,
            list(self.lines),
            self.writer,
            self.seq,
        ]
        if self.start >= 0:
            values.extend(
                (self.attempt, self.dropped_lines, self.dropped_points, self.start, self.generation)
            )
            return json.dumps(values, ensure_ascii=False)
        if self.attempt > 0 or self.dropped_lines or self.dropped_points:
            values.append(self.attempt)
        if self.dropped_lines or self.dropped_points:
            values.extend((self.dropped_lines, self.dropped_points))
        return json.dumps(values, ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> "LogBatch":
        """Parse a spool line; one written before batches had attempts is attempt 0."""
        job_id, role, index, node, stream, ts, lines, writer, seq, *rest = json.loads(text)
        defaults = (0, 0, 0, -1, 0)  # attempt, dropped lines and points, start, generation
        attempt, dropped_lines, dropped_points, start, generation = [
            *map(int, rest[:5]),
            *defaults[len(rest) :],
        ]
        return cls(
            job_id, role, index, node, stream, ts, lines, writer, seq, attempt,
            dropped_lines, dropped_points, start, generation,
        )  # fmt: skip


class LogSink:
    """Writes batches of lines, and the end marker, to per-job streams."""

    def __init__(self, client: redis.Redis, maxlen: int = DEFAULT_MAXLEN) -> None:
        self._client = client
        self.client = client
        self._maxlen = maxlen
        self._append = client.register_script(_APPEND_LUA)

    def append(self, batches: Sequence[LogBatch]) -> list[int]:
        """Append batches in order with one round trip; the cursor of each one's last line
        (-1 for a batch appended before, GAP for one whose writer's previous batch Redis does
        not have: nothing of it was appended). Raises redis.RedisError when Redis is unreachable,
        in which case any prefix of the batches may have been appended: send them all again.
        """
        if not batches:
            return []
        # EVALSHA in a plain pipeline: one round trip (a registered script in a pipeline makes
        # redis-py ask SCRIPT EXISTS first, a second round trip per append). A Redis that lost
        # its scripts (restarted) answers NOSCRIPT: the script is loaded and every batch sent
        # again, which is harmless (one appended before answers -1) and mends a batch refused
        # as a gap because the one before it met NOSCRIPT.
        for loaded in (False, True):
            pipe = self._client.pipeline(transaction=False)
            for batch in batches:
                keys, args = self._keys_and_args(
                    batch.job_id, len(batch.lines), batch.writer, batch.seq, batch.fields(),
                    batch.start,
                )  # fmt: skip
                pipe.evalsha(self._append.sha, len(keys), *keys, *args)
            answers = pipe.execute(raise_on_error=False)
            if not loaded and any(isinstance(a, redis.exceptions.NoScriptError) for a in answers):
                self._client.script_load(_APPEND_LUA)
                continue
            for answer in answers:
                if isinstance(answer, Exception):
                    raise answer
            break
        return [int(cursor) for cursor in answers]

    def seen(self, job_id: int, writer: str) -> int:
        """The highest sequence number of `writer` in the job's stream (-1: none)."""
        value = self._client.hget(contract.log_seen_key(job_id), writer)
        return -1 if value is None else int(value)

    def acked(self, job_id: int, writer: str) -> int:
        """The highest sequence number of `writer` the log keeper has in the database (-1)."""
        value = self._client.hget(contract.log_ack_key(job_id), writer)
        return -1 if value is None else int(value)

    def append_end(self, job_id: int, reason: str) -> int:
        """Mark the job's log complete (once: later calls do nothing and return -1)."""
        return int(self._call(self._client, job_id, 1, END_WRITER, 1, {contract.FIELD_END: reason}))

    def _call(
        self,
        client: Any,
        job_id: int,
        count: int,
        writer: str,
        seq: int,
        fields: dict[str, str],
        start: int = -1,
    ) -> Any:
        keys, args = self._keys_and_args(job_id, count, writer, seq, fields, start)
        return self._append(keys=keys, args=args, client=client)

    def _keys_and_args(
        self, job_id: int, count: int, writer: str, seq: int, fields: dict[str, str], start: int
    ) -> tuple[list[str], list[str | int]]:
        args: list[str | int] = [count, self._maxlen, writer, seq, start]
        for key, value in fields.items():
            args.extend((key, value))
        keys = [
            contract.log_stream_key(job_id),
            contract.log_cursor_key(job_id),
            contract.log_seen_key(job_id),
            contract.log_ack_key(job_id),
            contract.log_skip_key(job_id),
        ]
        return keys, args
