"""Appending lines to a job's Redis Stream with cursors that only grow.

Several agents write one job's stream at once. A Lua script takes the next cursors from a
per-job counter and appends the batch in one atomic step, so stream order and cursor order
are the same thing and a reader can resume after any cursor with one XRANGE.
"""

import json
from collections.abc import Sequence

import redis

from workers import contract

# KEYS[1] stream, KEYS[2] cursor counter; ARGV[1] lines in the batch, ARGV[2] approximate
# MAXLEN, ARGV[3..] field/value pairs. Returns the cursor of the batch's last line.
_APPEND_LUA = """
local last = redis.call('INCRBY', KEYS[2], tonumber(ARGV[1]))
local args = {KEYS[1], 'MAXLEN', '~', ARGV[2], last .. '-0'}
for i = 3, #ARGV do args[#args + 1] = ARGV[i] end
redis.call('XADD', unpack(args))
return last
"""

# Entries kept in Redis per job before the oldest are trimmed (a batch holds many lines).
DEFAULT_MAXLEN = 200_000

LogRecord = tuple[str, float, str]  # (stream "o"|"e", unix time, text)


class LogSink:
    """Writes batches of one replica's lines, and the end marker, to per-job streams."""

    def __init__(self, client: redis.Redis, maxlen: int = DEFAULT_MAXLEN) -> None:
        self._client = client
        self._maxlen = maxlen
        self._append = client.register_script(_APPEND_LUA)

    def append_lines(
        self, job_id: int, role: str, index: int, node: str, records: Sequence[LogRecord]
    ) -> int:
        """Append one replica's lines in order; returns the cursor of the last one."""
        fields = {
            contract.FIELD_ROLE: role,
            contract.FIELD_INDEX: str(index),
            contract.FIELD_NODE: node,
            contract.FIELD_LINES: json.dumps(records, ensure_ascii=False),
        }
        return self._run(job_id, len(records), fields)

    def append_end(self, job_id: int, reason: str) -> int:
        """Mark the job's log complete: nothing is appended after this entry."""
        return self._run(job_id, 1, {contract.FIELD_END: reason})

    def _run(self, job_id: int, count: int, fields: dict[str, str]) -> int:
        argv: list[str | int] = [count, self._maxlen]
        for key, value in fields.items():
            argv.extend((key, value))
        keys = [contract.log_stream_key(job_id), contract.log_cursor_key(job_id)]
        return int(self._append(keys=keys, args=argv))
