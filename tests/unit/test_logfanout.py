"""Many viewers of one job share one reader of its log (jobs/logfanout.py), through the real
ASGI application, Redis stream and channel layer; and each still gets every line once, in
order, from its own cursor."""

import asyncio
import json
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.contrib.auth.models import User

from jobs import logfanout
from jobs.consumers import JobConsumer
from jobs.logstream import Batch
from jobs.models import ApiToken, Job
from jobs.redis_client import get_redis
from jobs.services.submission import check_job_request, submit_job
from tests.unit.helpers import append_lines, job_request
from tests.unit.test_consumer import communicator, cursors, frames_until
from workers.logsink import LogSink

pytestmark = [
    pytest.mark.usefixtures("catalog", "code_root", "nodes", "redis_url", "sent_tasks"),
    pytest.mark.django_db(transaction=True),
]


@pytest.fixture
def job(alice: User) -> Job:
    return submit_job(alice, check_job_request(job_request(instances=2)))


def feeds_now() -> dict[int, int]:
    """Job id -> viewers, of this event loop's feeds."""
    return {job_id: feed.viewers for job_id, feed in logfanout._registry().items()}


def followers_of(job_id: int) -> int:
    """Connections to Redis that read this job's log now (named by jobs.logfanout)."""
    name = logfanout.follower_name(job_id)
    return sum(c["name"] == name for c in get_redis().client_list())


async def lines_upto(comm: Any, last: int, seen: list[dict[str, Any]]) -> list[dict[str, Any]]:
    while not cursors(seen) or cursors(seen)[-1] < last:
        seen += await frames_until(comm, "log")
    return seen


async def test_viewers_at_the_same_cursor_share_one_reader_and_each_gets_every_line(
    job: Job, alice: User
) -> None:
    token = await database_sync_to_async(ApiToken.issue)(alice)
    sink = LogSink(get_redis())
    append_lines(sink, job.pk, "master", 0, "node-1", ["a0", "a1"])
    viewers = [communicator(job.pk, token, after=0) for _ in range(3)]
    frames: list[list[dict[str, Any]]] = [[] for _ in viewers]
    for comm, seen in zip(viewers, frames, strict=True):
        assert (await comm.connect())[0]
        await lines_upto(comm, 2, seen)
    assert feeds_now() == {job.pk: 3}
    assert await asyncio.to_thread(followers_of, job.pk) == 1
    for k in range(5):
        append_lines(sink, job.pk, "worker", 1, "node-2", [f"b{k}-{i}" for i in range(100)])
    for comm, seen in zip(viewers, frames, strict=True):
        await lines_upto(comm, 502, seen)
        assert cursors(seen) == list(range(1, 503))  # once each, in order
    # Still one reader: the viewers kept up, none read on its own.
    assert await asyncio.to_thread(followers_of, job.pk) == 1
    for comm in viewers:
        await comm.disconnect()
    assert feeds_now() == {}
    await asyncio.sleep(0)  # the feed's task closes its connection as it ends
    assert await asyncio.to_thread(followers_of, job.pk) == 0


async def test_a_viewer_older_than_what_the_feed_keeps_reads_alone_then_joins_it(
    job: Job, alice: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(logfanout, "KEPT_LINES", 30)  # about three batches of ten
    alone_from: list[int] = []
    original_alone = logfanout._alone

    def alone(feed: Any, position: int) -> Any:
        alone_from.append(position)
        return original_alone(feed, position)

    monkeypatch.setattr(logfanout, "_alone", alone)
    token = await database_sync_to_async(ApiToken.issue)(alice)
    sink = LogSink(get_redis())
    first = communicator(job.pk, token, after=0)
    assert (await first.connect())[0]
    early: list[dict[str, Any]] = []
    for k in range(10):  # one at a time, so that the feed reads each on its own
        append_lines(sink, job.pk, "master", 0, "node-1", [f"{k}-{i}" for i in range(10)])
        await lines_upto(first, 10 * (k + 1), early)
    # The feed now keeps only the newest lines; a viewer from the start is behind it.
    assert logfanout._registry()[job.pk].oldest() > 5
    late = communicator(job.pk, token, after=5)
    assert (await late.connect())[0]
    behind: list[dict[str, Any]] = []
    await lines_upto(late, 100, behind)
    for k in range(10, 13):
        append_lines(sink, job.pk, "master", 0, "node-1", [f"{k}-{i}" for i in range(10)])
    await lines_upto(late, 130, behind)
    await lines_upto(first, 130, early)
    assert cursors(behind) == list(range(6, 131))
    assert alone_from == [5]  # it read on its own once, then from the feed
    assert cursors(early) == list(range(1, 131))
    assert feeds_now() == {job.pk: 2}
    await first.disconnect()
    await late.disconnect()
    assert feeds_now() == {}


def _batch(first: int, lines: list[str]) -> Batch:
    return Batch(first, first + len(lines) - 1, role="master", node="n", stream="stdout",
                 lines=lines)  # fmt: skip


def test_a_piece_is_encoded_once_for_every_viewer_at_its_start() -> None:
    piece = logfanout.Piece(10, [_batch(11, ["a", "b"]), _batch(13, ["c"])])
    shared = piece.frames_after(10)
    assert piece.frames_after(10) is shared  # the same text, not encoded again
    [text], reached = shared
    assert reached == 13
    assert json.loads(text) == {"type": "log", "next": 13, "batches": [
        {"first": 11, "role": "master", "index": 0, "attempt": 0, "node": "n",
         "stream": "stdout", "ts": 0.0, "lines": ["a", "b"]},
        {"first": 13, "role": "master", "index": 0, "attempt": 0, "node": "n",
         "stream": "stdout", "ts": 0.0, "lines": ["c"]},
    ]}  # fmt: skip
    # A viewer further on gets only what it has not read.
    [text], reached = piece.frames_after(11)
    assert reached == 13
    assert [(b["first"], b["lines"]) for b in json.loads(text)["batches"]] == [
        (12, ["b"]), (13, ["c"]),
    ]  # fmt: skip
    assert piece.frames_after(13) == ([], 13)


async def test_the_feed_reads_no_faster_than_its_fastest_viewer(
    job: Job, alice: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A viewer replaying a long log is its feed's only reader: the feed reads a page when the
    viewer has taken the last, so nothing is evicted unread and read again on its own."""
    monkeypatch.setattr(logfanout, "KEPT_LINES", 10)  # one piece at a time
    alone_from: list[int] = []
    original_alone = logfanout._alone

    def alone(feed: Any, position: int) -> Any:
        alone_from.append(position)
        return original_alone(feed, position)

    monkeypatch.setattr(logfanout, "_alone", alone)
    original_send = JobConsumer.send

    async def slow_send(self: JobConsumer, text_data: str | None = None, **kwargs: Any) -> None:
        await asyncio.sleep(0.05)  # a client slower than Redis: the feed could run ahead
        await original_send(self, text_data, **kwargs)

    monkeypatch.setattr(JobConsumer, "send", slow_send)
    token = await database_sync_to_async(ApiToken.issue)(alice)
    sink = LogSink(get_redis())
    for k in range(300):  # three reads of 100 batches
        append_lines(sink, job.pk, "master", 0, "node-1", [f"{k}-{i}" for i in range(10)])
    viewer = communicator(job.pk, token, after=0)
    assert (await viewer.connect())[0]
    seen = await lines_upto(viewer, 3000, [])
    assert cursors(seen) == list(range(1, 3001))
    assert alone_from == []
    await viewer.disconnect()
