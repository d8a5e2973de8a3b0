"""One reader of a job's live log per web process, fanned out to every viewer of that job.

A job watched by 500 browsers must not cost 500 blocking reads of its Redis stream, nor 500
encodings of every frame (issue 24: one job, 500 viewers, 10,000 lines/s). So each web
process keeps one *feed* per job that someone watches: a task that follows the log as
`logstream.follow` does (the database first, then Redis, gaps and the end marker included)
and keeps the last few thousand batches it read, in pieces; it reads only while some viewer
has read all it has, so it never runs ahead of its fastest viewer. A viewer reads the pieces
after its own cursor; a viewer that stands exactly where a piece starts (the usual case: everyone
caught up) gets that piece's frames encoded once for all of them.

A viewer whose cursor is older than what the feed keeps (it asked for an old cursor, or it
reads more slowly than lines come) follows the log on its own connection, as every viewer did
before, until it is within what the feed keeps, then takes the feed's pieces again. So every
viewer still gets every line once and in order from its own cursor, at its own pace, and a
slow one costs memory for nothing but the shared pieces. Access control stays with each
viewer's consumer: the feed only reads.

The feed's Redis connections, and a viewer's own, are named `log-follower-job-<id>` in
Redis's CLIENT LIST. The feed ends with its last viewer.
"""

import asyncio
import contextlib
import weakref
from collections import deque
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field

from jobs import logframes, logstream
from jobs.logstream import Batch
from jobs.models import LogChunk
from jobs.redis_client import get_async_redis

# What a feed keeps for viewers that are a little behind: at most this many pieces (each one
# read of up to logstream.PAGE_BATCHES batches) and about this many lines (~5 s at 10,000
# lines/s; a few MB).
KEPT_PIECES = 1000
KEPT_LINES = 50_000


def follower_name(job_id: int) -> str:
    """What a follower of the job's log calls its Redis connection (CLIENT LIST)."""
    return f"log-follower-job-{job_id}"


@dataclass(eq=False)
class Piece:
    """Batches read in one go, contiguous in cursor space after cursor `after`; no batches: a
    quiet period (nothing new for logstream.FOLLOW_BLOCK_SECONDS)."""

    after: int
    batches: list[Batch]
    _frames: tuple[list[str], int] | None = field(default=None, repr=False)

    @property
    def last(self) -> int:
        return self.batches[-1].last if self.batches else self.after

    @property
    def lines(self) -> int:
        return sum(len(b.lines) for b in self.batches)

    def end(self) -> Batch | None:
        """The end marker, when this piece is it (logstream.follow yields it alone)."""
        if self.batches and self.batches[0].kind == LogChunk.Kind.END:
            return self.batches[0]
        return None

    def frames_after(self, position: int) -> tuple[list[str], int]:
        """The encoded frames (jobs/logframes.py) of what this piece holds after `position`,
        and the cursor they reach. Encoded once for every viewer at the piece's start."""
        if position == self.after:
            if self._frames is None:
                self._frames = logframes.encoded(self.batches, self.after)
            return self._frames
        rest = [b.after(position) for b in self.batches if b.last > position]
        return logframes.encoded(rest, position)


class FeedFailed(Exception):
    """The job's feed stopped on an error (Redis away, say): its viewers reconnect from their
    cursors and lose nothing."""


class _Feed:
    def __init__(self, job_id: int, position: int) -> None:
        self.job_id = job_id
        self.position = position  # read up to here
        self.pieces: deque[Piece] = deque()
        self.kept_lines = 0
        self.quiet_periods = 0
        self.ended = False
        self.error: BaseException | None = None
        self.viewers = 0
        self._wake = asyncio.Event()
        # Set while some viewer has read all the feed has: the feed reads only then, so it
        # never runs ahead of its fastest viewer (a replay of a long log from the database
        # is read once, at the pace of whoever reads it, not all at once and then again).
        self._wanted = asyncio.Event()
        # The lowest cursor a viewer waits at, since the last piece: when every waiting viewer
        # is past what the feed has read (they read on their own meanwhile), it jumps ahead
        # to them instead of reading again what they have.
        self._lowest_waiting: int | None = None
        self.task = asyncio.create_task(self._read(), name=follower_name(job_id))

    def oldest(self) -> int:
        """Viewers at or after this cursor are served from the pieces kept."""
        return self.pieces[0].after if self.pieces else self.position

    def pieces_after(self, position: int) -> list[Piece] | None:
        """The kept pieces with something after `position`, oldest first; None when the feed
        no longer keeps all of what comes after it."""
        if position < self.oldest():
            return None
        newer: list[Piece] = []
        for piece in reversed(self.pieces):
            if piece.last <= position:
                break
            newer.append(piece)
        return newer[::-1]

    async def changed(self, position: int) -> None:
        """Wait for the next piece (or quiet period), as a viewer that has read all the feed
        has, up to `position`: the feed reads on for it."""
        if self._lowest_waiting is None or position < self._lowest_waiting:
            self._lowest_waiting = position
        self._wanted.set()
        await self._wake.wait()

    def _notify(self) -> None:
        self._lowest_waiting = None  # every waiting viewer wakes, and says again if it waits
        self._wake.set()
        self._wake = asyncio.Event()

    async def _read(self) -> None:
        client = get_async_redis(name=follower_name(self.job_id))
        follower = logstream.follow(client, self.job_id, self.position)
        try:
            while True:
                await self._wanted.wait()
                if self._lowest_waiting is not None and self._lowest_waiting > self.position:
                    # Nobody waits for what lies between: follow on from the lowest waiting.
                    await follower.aclose()  # type: ignore[attr-defined]  # an async generator
                    self.pieces.clear()
                    self.kept_lines = 0
                    self.position = self._lowest_waiting
                    follower = logstream.follow(client, self.job_id, self.position)
                try:
                    batches = await anext(follower)
                except StopAsyncIteration:
                    break
                if batches:
                    self._keep(Piece(self.position, batches))
                    self._wanted.clear()
                else:
                    self.quiet_periods += 1
                self._notify()
            self.ended = True
        except Exception as exc:
            self.error = exc
            _forget(self)  # the next viewer starts a fresh feed
            self._notify()
        finally:
            await follower.aclose()  # type: ignore[attr-defined]  # an async generator
            await client.aclose()

    def _keep(self, piece: Piece) -> None:
        self.pieces.append(piece)
        self.position = piece.last
        self.kept_lines += piece.lines
        while len(self.pieces) > 1 and (
            len(self.pieces) > KEPT_PIECES or self.kept_lines > KEPT_LINES
        ):
            self.kept_lines -= self.pieces.popleft().lines


# One registry per event loop: a feed's task and events belong to the loop that made them.
_feeds: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[int, _Feed]]" = (
    weakref.WeakKeyDictionary()
)


def _registry() -> dict[int, _Feed]:
    return _feeds.setdefault(asyncio.get_running_loop(), {})


def _join(job_id: int, after: int) -> _Feed:
    feeds = _registry()
    feed = feeds.get(job_id)
    if feed is None:
        feed = feeds[job_id] = _Feed(job_id, after)
    feed.viewers += 1
    return feed


def _forget(feed: _Feed) -> None:
    feeds = _registry()
    if feeds.get(feed.job_id) is feed:
        del feeds[feed.job_id]


def _leave(feed: _Feed) -> None:
    feed.viewers -= 1
    if feed.viewers == 0:
        _forget(feed)
        feed.task.cancel()


async def watch(job_id: int, after: int) -> AsyncGenerator[Piece, None]:
    """Every piece of the job's log after cursor `after`, in order, then live ones as they
    come, up to the end marker's piece; a piece without batches for each quiet period, so the
    caller can send a heartbeat. Close it (contextlib.aclosing) to leave the feed."""
    feed = _join(job_id, after)
    position = after
    quiet = feed.quiet_periods
    try:
        while True:
            if feed.error is not None:
                raise FeedFailed(f"the log feed of job {job_id} failed") from feed.error
            pieces = feed.pieces_after(position)
            if pieces is None:
                async with contextlib.aclosing(_alone(feed, position)) as alone:
                    async for piece in alone:
                        yield piece
                        position = max(position, piece.last)
                        if piece.end() is not None:
                            return
                quiet = feed.quiet_periods
                continue
            if pieces:
                for piece in pieces:
                    yield piece
                    position = max(position, piece.last)
                    if piece.end() is not None:
                        return
                continue
            if feed.quiet_periods != quiet:
                quiet = feed.quiet_periods
                yield Piece(position, [])
                continue
            await feed.changed(position)
    finally:
        _leave(feed)


async def _alone(feed: _Feed, position: int) -> AsyncGenerator[Piece, None]:
    """Follow the log on a connection of one's own from `position` until the feed keeps what
    comes next (or it fails, or the log ends)."""
    client = get_async_redis(name=follower_name(feed.job_id))
    try:
        async for batches in logstream.follow(client, feed.job_id, position):
            piece = Piece(position, batches)
            yield piece
            position = piece.last
            if piece.end() is not None or feed.error is not None:
                return
            if feed.pieces_after(position) is not None:
                return
    finally:
        await client.aclose()
