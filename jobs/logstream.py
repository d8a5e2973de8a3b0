"""Reading a job's log stream: pages for HTTP, and a live follow for the websocket.

Stream entries are written by `workers.logsink`: entry id "<C>-0" where C is the cursor of the
entry's last line, so every line after cursor A is in the entries whose id is above "A-0".
"""

import json
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from typing import Any, cast

import redis.asyncio

from jobs.redis_client import get_redis
from workers import contract

RawEntry = tuple[str, dict[str, str]]  # (entry id, fields), as a decode_responses client gives
# How long one XREAD waits for new lines before the follower looks up again (to send a
# heartbeat, or notice that its client left).
FOLLOW_BLOCK_SECONDS = 5

STREAM_NAMES = {contract.STREAM_STDOUT: "stdout", contract.STREAM_STDERR: "stderr"}


@dataclass(frozen=True)
class LogLine:
    cursor: int
    role: str
    index: int
    node: str
    stream: str
    ts: float
    text: str

    @property
    def tag(self) -> str:
        return self.role if self.role in {"master", "scheduler"} else f"{self.role}-{self.index}"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Entry:
    last_cursor: int
    lines: list[LogLine]
    end: str | None  # the job's log ends here, for this reason


def parse_entry(entry_id: str, fields: dict[str, str]) -> Entry:
    last = int(entry_id.split("-", 1)[0])
    if contract.FIELD_END in fields:
        return Entry(last, [], fields[contract.FIELD_END])
    records = json.loads(fields[contract.FIELD_LINES])
    first = last - len(records) + 1
    role = fields[contract.FIELD_ROLE]
    index = int(fields[contract.FIELD_INDEX])
    node = fields[contract.FIELD_NODE]
    lines = [
        LogLine(first + k, role, index, node, STREAM_NAMES.get(s, s), float(ts), text)
        for k, (s, ts, text) in enumerate(records)
    ]
    return Entry(last, lines, None)


@dataclass(frozen=True)
class Page:
    lines: list[LogLine]
    next: int
    ended: bool


def read_page(
    job_id: int,
    after: int,
    limit: int,
    role: str | None = None,
    index: int | None = None,
) -> Page:
    """Up to `limit` lines after cursor `after`, optionally of one role (and index)."""
    client = get_redis()
    key = contract.log_stream_key(job_id)
    lines: list[LogLine] = []
    position = after
    ended = False
    start = f"({after}-0"
    while len(lines) < limit and not ended:
        batch = cast(list[RawEntry], client.xrange(key, min=start, max="+", count=100))
        if not batch:
            break
        for entry_id, fields in batch:
            entry = parse_entry(entry_id, fields)
            if entry.end is not None:
                ended = True
                position = entry.last_cursor
                break
            for line in entry.lines:
                if line.cursor <= after:
                    continue
                if len(lines) >= limit:
                    break
                position = line.cursor
                if (role is None or line.role == role) and (index is None or line.index == index):
                    lines.append(line)
            if len(lines) >= limit:
                break
        start = f"({batch[-1][0]}"
    return Page(lines, position, ended)


async def follow(client: redis.asyncio.Redis, job_id: int, after: int) -> AsyncIterator[Entry]:
    """Every entry after cursor `after`, then live ones as they come, until the end marker.

    Yields entries with no lines on idle timeouts, so the caller gets a chance to send a
    heartbeat or notice that its client left.
    """
    key = contract.log_stream_key(job_id)
    last_id = f"{after}-0"
    while True:
        response = cast(
            list[tuple[str, list[RawEntry]]],
            await client.xread({key: last_id}, count=200, block=FOLLOW_BLOCK_SECONDS * 1000),
        )
        if not response:
            yield Entry(after, [], None)
            continue
        for _stream, entries in response:
            for entry_id, fields in entries:
                last_id = entry_id
                entry = parse_entry(entry_id, fields)
                if entry.end is None:
                    fresh = [line for line in entry.lines if line.cursor > after]
                    entry = Entry(entry.last_cursor, fresh, None)
                after = max(after, entry.last_cursor)
                yield entry
                if entry.end is not None:
                    return
