"""The job websocket through the real ASGI stack, Redis stream and Redis channel layer."""

import asyncio
import json
import logging
import random
from collections.abc import AsyncGenerator
from typing import Any, cast

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from redis.exceptions import ConnectionError as RedisConnectionError
from uvicorn.protocols.utils import ClientDisconnected

from console.asgi import application
from jobs import logstream
from jobs.consumers import JobConsumer
from jobs.models import ApiToken, Job, LogChunk, Replica
from jobs.redis_client import get_async_redis, get_redis
from jobs.services import logarchive
from jobs.services.lifecycle import reports
from jobs.services.submission import check_job_request, submit_job
from jobs.services.views.presenters import job_state_payload
from tests.unit.helpers import append_lines, job_request
from workers import contract
from workers.logsink import LogSink

pytestmark = [
    pytest.mark.usefixtures("catalog", "code_root", "nodes", "redis_url", "sent_tasks"),
    pytest.mark.django_db(transaction=True),
]


@pytest.fixture
def job(alice: User) -> Job:
    return submit_job(alice, check_job_request(job_request(instances=2)))


def communicator(
    job_id: int, token: str | None, after: int = 0, origin: bytes | None = None, query: str = ""
) -> WebsocketCommunicator:
    headers = []
    if token:
        headers.append((b"authorization", f"Token {token}".encode()))
    if origin:
        headers.append((b"origin", origin))
    query = query or f"after={after}"
    return WebsocketCommunicator(application, f"/ws/jobs/{job_id}/?{query}", headers)


async def frames_until(comm: WebsocketCommunicator, kind: str) -> list[dict[str, Any]]:
    got = []
    while True:
        frame = await comm.receive_json_from(timeout=5)
        got.append(frame)
        if frame["type"] == kind:
            return got


def texts(frames: list[dict[str, Any]]) -> list[str]:
    return [t for f in frames if f["type"] == "log" for b in f["batches"] for t in b["lines"]]


def cursors(frames: list[dict[str, Any]]) -> list[int]:
    return [
        b["first"] + k
        for f in frames
        if f["type"] == "log"
        for b in f["batches"]
        for k in range(len(b["lines"]))
    ]


async def test_it_closes_for_anonymous_users(job: Job) -> None:
    connected, code = await communicator(job.pk, None).connect()
    assert (connected, code) == (False, 4401)


async def test_it_hides_other_users_jobs(job: Job, bob: User) -> None:
    token = await database_sync_to_async(ApiToken.issue)(bob)
    connected, code = await communicator(job.pk, token).connect()
    assert (connected, code) == (False, 4404)


async def test_it_refuses_a_foreign_origin(job: Job, alice: User) -> None:
    token = await database_sync_to_async(ApiToken.issue)(alice)
    connected, _ = await communicator(job.pk, token, origin=b"http://evil.example").connect()
    assert not connected


async def test_it_replays_follows_and_resumes_without_gap_or_duplicate(
    job: Job, alice: User
) -> None:
    token = await database_sync_to_async(ApiToken.issue)(alice)
    sink = LogSink(get_redis())
    append_lines(sink, job.pk, "master", 0, "node-1", [f"a{i}" for i in range(5)])
    comm = communicator(job.pk, token)
    assert (await comm.connect())[0]
    first = await comm.receive_json_from(timeout=5)
    assert first["type"] == "state" and first["job"]["state"] == "queued"
    replay = await frames_until(comm, "log")
    assert texts(replay) == [f"a{i}" for i in range(5)]
    # Live: a line appended now arrives without reconnecting.
    append_lines(sink, job.pk, "worker", 1, "node-2", ["<b>live</b>"], contract.STREAM_STDERR)
    live = (await frames_until(comm, "log"))[-1]
    assert live["batches"] == [
        {"first": 6, "role": "worker", "index": 1, "attempt": 0, "node": "node-2",
         "stream": "stderr", "ts": 1.0, "lines": ["<b>live</b>"]}
    ]  # fmt: skip
    assert live["next"] == 6
    await comm.disconnect()

    # Away; more lines and the end arrive meanwhile. Resume after cursor 3.
    append_lines(sink, job.pk, "master", 0, "node-1", ["b0", "b1"])
    sink.append_end(job.pk, "job succeeded")
    comm = communicator(job.pk, token, after=3)
    assert (await comm.connect())[0]
    frames = await frames_until(comm, "end")
    assert cursors(frames) == [4, 5, 6, 7, 8]
    assert frames[-1] == {"type": "end", "reason": "job succeeded", "next": 9}
    assert frames[-2]["type"] == "state"  # the final state, fresh from the database
    await comm.disconnect()


@database_sync_to_async
def report_started(job_id: int, tag: str) -> dict[str, Any]:
    """An agent's report that a replica started, through the services layer as the console
    worker takes it; then the presenter's payload for the job as it stands after it."""
    replica = next(r for r in Replica.objects.filter(job_id=job_id).select_related("node")
                   if r.tag == tag)  # fmt: skip
    assert replica.node is not None, "the scheduler placed every replica on submission"
    reports.replica_started(job_id, replica.role, replica.index, replica.node.name)
    return job_state_payload(Job.objects.get(pk=job_id))


async def test_it_relays_state_changes(job: Job, alice: User) -> None:
    token = await database_sync_to_async(ApiToken.issue)(alice)
    comm = communicator(job.pk, token)
    assert (await comm.connect())[0]
    connected = await comm.receive_json_from(timeout=5)
    assert connected["type"] == "state" and connected["job"]["state"] == "queued"

    async def next_change() -> dict[str, Any]:
        # The placement's event left before this client joined, but leaves through a thread
        # of its own and may reach the group after the join: it shows what the connect frame
        # showed, so it tells nothing new.
        while True:
            frame = await comm.receive_json_from(timeout=5)
            if frame != connected:
                return frame

    after_master = await report_started(job.pk, "master")
    frame = await next_change()
    assert frame == {"type": "state", "job": after_master}
    assert frame["job"]["state"] == "queued"  # the worker has not started yet
    assert [(r["tag"], r["state"]) for r in frame["job"]["replicas"]] == [
        ("master", "running"), ("worker-1", "assigned")
    ]  # fmt: skip

    after_worker = await report_started(job.pk, "worker-1")
    frame = await comm.receive_json_from(timeout=5)
    assert frame == {"type": "state", "job": after_worker}
    assert (frame["job"]["state"], frame["job"]["reason"]) == ("running", "")
    assert [r["state"] for r in frame["job"]["replicas"]] == ["running", "running"]
    await comm.disconnect()


async def test_it_starts_from_the_tail_when_asked(job: Job, alice: User) -> None:
    token = await database_sync_to_async(ApiToken.issue)(alice)
    sink = LogSink(get_redis())
    append_lines(sink, job.pk, "master", 0, "node-1", [f"a{i}" for i in range(100)])
    comm = communicator(job.pk, token, query="tail=10")
    assert (await comm.connect())[0]
    frames = await frames_until(comm, "log")
    assert texts(frames) == [f"a{i}" for i in range(90, 100)]
    assert cursors(frames) == list(range(91, 101))
    await comm.disconnect()


async def test_it_replays_from_the_database_after_redis_trimmed_the_stream(
    job: Job, alice: User
) -> None:
    token = await database_sync_to_async(ApiToken.issue)(alice)
    client = get_redis()
    sink = LogSink(client)
    for k in range(5):
        append_lines(sink, job.pk, "master", 0, "node-1", [f"{k}-{i}" for i in range(10)])
    await database_sync_to_async(logarchive.archive_once)(client, block_ms=10)
    client.xtrim(
        contract.log_stream_key(job.pk), maxlen=1, approximate=False
    )  # only the newest batch is left
    comm = communicator(job.pk, token, after=5)
    assert (await comm.connect())[0]
    frames = await frames_until(comm, "log")
    while len(cursors(frames)) < 45:
        frames += await frames_until(comm, "log")
    assert cursors(frames) == list(range(6, 51))
    assert not [f for f in frames if f["type"] == "gap"]
    await comm.disconnect()


async def test_a_follower_in_redis_goes_back_to_the_database_for_what_the_keeper_trimmed(
    job: Job,
) -> None:
    """The keeper archives and trims while a follower waits between two reads of the stream:
    the next read starts past a hole, which the database fills, with no gap and no line lost
    (the live relay's handover, driven step by step)."""
    client = get_redis()
    sink = LogSink(client)
    key = contract.log_stream_key(job.pk)
    reader = get_async_redis()
    # A generator, which follow's annotation does not say: closed at the end.
    follower = cast(
        AsyncGenerator[list[logstream.Batch], None], logstream.follow(reader, job.pk, 0)
    )
    try:
        append_lines(sink, job.pk, "master", 0, "node-1", ["a0", "a1"])
        live = await anext(follower)  # nothing archived yet: from Redis
        assert [(b.first, b.lines) for b in live] == [(1, ["a0", "a1"])]
        # Suspended after those: the stream grows, the keeper archives all of it and trims
        # exactly (an approximate trim may do the same), then more lines come.
        append_lines(sink, job.pk, "master", 0, "node-1", ["b2"])
        append_lines(sink, job.pk, "master", 0, "node-1", ["b3"], contract.STREAM_STDERR)
        await database_sync_to_async(logarchive.archive_once)(client, block_ms=10)
        client.xtrim(key, minid="5-0", approximate=False)
        append_lines(sink, job.pk, "master", 0, "node-1", ["c4", "c5"])
        got: list[logstream.Batch] = []
        while not got or got[-1].last < 6:  # up to the newest line
            got += await anext(follower)
    finally:
        await follower.aclose()
        await reader.aclose()
    assert [b.kind for b in got] == [LogChunk.Kind.LINES] * len(got), "no gap"
    assert [(b.first + k, t) for b in got for k, t in enumerate(b.lines)] == [
        (3, "b2"), (4, "b3"), (5, "c4"), (6, "c5"),
    ]  # fmt: skip


async def test_a_cancelled_follower_always_ends(job: Job) -> None:
    """A follower cancelled at any moment of its reads ends: it never drops the cancel and
    reads on (with a socket timeout, redis-py sent each command under Python 3.11's
    asyncio.wait_for, which lost about one cancel in twenty; a log feed that lost its cancel
    read on forever and an event loop shutting down waited for it)."""
    append_lines(LogSink(get_redis()), job.pk, "master", 0, "node-1", ["archived? no: live"])

    async def follow_on(reader: Any, counted: list[int]) -> None:
        try:
            async for _ in logstream.follow(reader, job.pk, 1):  # quiet: reads, blocked
                counted[0] += 1
        finally:
            await reader.aclose()

    rng = random.Random(27)
    for attempt in range(120):
        counted = [0]
        task = asyncio.create_task(follow_on(get_async_redis(), counted))
        # Anywhere in its first reads: connecting, sending, waiting for the answer.
        await asyncio.sleep(rng.uniform(0, 0.03))
        task.cancel()
        done, _ = await asyncio.wait([task], timeout=30)  # a hang guard, not a measure
        assert done, f"attempt {attempt}: the follower read on after its cancel ({counted})"
        assert task.cancelled()


async def test_it_says_so_when_lines_are_kept_nowhere(job: Job, alice: User) -> None:
    token = await database_sync_to_async(ApiToken.issue)(alice)
    client = get_redis()
    sink = LogSink(client)
    for k in range(3):
        append_lines(sink, job.pk, "master", 0, "node-1", [f"{k}-{i}" for i in range(10)])
    client.xtrim(
        contract.log_stream_key(job.pk), maxlen=1, approximate=False
    )  # never archived, now trimmed
    comm = communicator(job.pk, token, after=0)
    assert (await comm.connect())[0]
    frames = await frames_until(comm, "log")
    gaps = [f for f in frames if f["type"] == "gap"]
    assert gaps == [{"type": "gap", "after": 0, "next": 20, "reason": gaps[0]["reason"]}]
    assert "no longer kept" in gaps[0]["reason"]
    assert cursors(frames) == list(range(21, 31))  # from the oldest line still kept
    await comm.disconnect()


async def test_it_sends_heartbeats_while_the_job_is_quiet(
    job: Job, alice: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(logstream, "FOLLOW_BLOCK_SECONDS", 0.2)
    token = await database_sync_to_async(ApiToken.issue)(alice)
    append_lines(LogSink(get_redis()), job.pk, "master", 0, "node-1", ["only line"])
    comm = communicator(job.pk, token)
    assert (await comm.connect())[0]
    await frames_until(comm, "log")
    beat = (await frames_until(comm, "heartbeat"))[-1]
    assert beat == {"type": "heartbeat", "next": 1}
    await comm.disconnect()


async def test_it_closes_on_a_client_too_slow_to_read_instead_of_buffering(
    job: Job,
    alice: User,
    monkeypatch: pytest.MonkeyPatch,
    settings: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="jobs.consumers")
    settings.TRAINYARD_WS_SEND_TIMEOUT_SECONDS = 0.2
    original = JobConsumer.send

    async def stuck_on_log_frames(
        self: JobConsumer,
        text_data: str | None = None,
        bytes_data: bytes | None = None,
        close: bool = False,
    ) -> None:
        # What a client that stopped reading looks like from here: the send never completes.
        # Every frame goes through `send` (log frames already encoded, shared by viewers).
        if text_data is not None and json.loads(text_data).get("type") == "log":
            await asyncio.Event().wait()
        await original(self, text_data, bytes_data, close)

    monkeypatch.setattr(JobConsumer, "send", stuck_on_log_frames)
    token = await database_sync_to_async(ApiToken.issue)(alice)
    append_lines(LogSink(get_redis()), job.pk, "master", 0, "node-1", ["x"] * 10)
    comm = communicator(job.pk, token)
    assert (await comm.connect())[0]
    assert (await comm.receive_json_from(timeout=5))["type"] == "state"
    closed = await comm.receive_output(timeout=5)
    while closed["type"] == "websocket.send":
        # A state event of the job's placement may still come (events leave through their own
        # thread, and on a busy machine after the stream opened); never a log frame.
        assert json.loads(closed["text"])["type"] == "state", closed
        closed = await comm.receive_output(timeout=5)
    assert closed == {"type": "websocket.close", "code": 4408}
    # The operator sees it in the web server's log.
    assert [r.getMessage() for r in caplog.records if r.name == "jobs.consumers"] == [
        f"closing the log stream of job {job.pk} with 4408: the client did not take a frame "
        "within 0.2 s (it resumes from the last frame it read)"
    ]


async def test_a_gap_in_the_middle_of_an_archived_page_is_its_own_frame(
    job: Job, alice: User
) -> None:
    """Lines archived, then lines trimmed from Redis before the keeper saw them, then more
    lines, all archived: a client reading from the start gets the first lines, a gap frame
    for the lost ones, and the last lines (a regression: the gap once went out as an empty
    batch inside a log frame, and the page showed no notice)."""
    sink = LogSink(get_redis())
    key = contract.log_stream_key(job.pk)

    def write_trim_archive() -> None:
        append_lines(sink, job.pk, "master", 0, "node-1", [f"kept {i}" for i in range(3)])
        while logarchive.archive_once(get_redis(), block_ms=10):
            pass
        append_lines(sink, job.pk, "master", 0, "node-1", [f"lost {i}" for i in range(4)])
        get_redis().xtrim(key, maxlen=0, approximate=False)  # gone before the keeper saw them
        append_lines(sink, job.pk, "master", 0, "node-1", [f"late {i}" for i in range(2)])
        while logarchive.archive_once(get_redis(), block_ms=10):
            pass

    await database_sync_to_async(write_trim_archive)()
    token = await database_sync_to_async(ApiToken.issue)(alice)
    comm = communicator(job.pk, token, after=0)
    assert (await comm.connect())[0]
    frames: list[dict[str, Any]] = []
    while len([f for f in frames if f["type"] != "state"]) < 3:
        frames.append(await comm.receive_json_from(timeout=5))
    frames = [f for f in frames if f["type"] != "state"]
    assert [f["type"] for f in frames] == ["log", "gap", "log"]
    assert texts(frames[:1]) == ["kept 0", "kept 1", "kept 2"]
    assert {k: frames[1][k] for k in ("type", "after", "next")} == {
        "type": "gap", "after": 3, "next": 7
    }  # fmt: skip
    assert frames[1]["reason"]
    assert texts(frames[2:]) == ["late 0", "late 1"] and cursors(frames[2:]) == [8, 9]
    await comm.disconnect()


class _FlakyGroupAdd:
    """The channel layer's group_add after a Redis restart: its pooled connection is dead, so
    the first `failures` calls fail as redis-py fails them, and later ones go through."""

    def __init__(self, original: Any, failures: int) -> None:
        self.original, self.failures, self.calls = original, failures, 0

    async def __call__(self, group: str, channel: str) -> None:
        self.calls += 1
        if self.calls <= self.failures:
            raise RedisConnectionError("Error UNKNOWN while writing to socket. Connection lost.")
        await self.original(group, channel)


async def test_a_stale_redis_connection_after_a_restart_costs_no_failed_handshake(
    job: Job, alice: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seen in a drill: the first page opened after Redis was killed and restarted got a 500
    on the websocket handshake, from the layer's dead pooled connection."""
    layer = get_channel_layer()
    flaky = _FlakyGroupAdd(layer.group_add, failures=1)
    monkeypatch.setattr(layer, "group_add", flaky)
    token = await database_sync_to_async(ApiToken.issue)(alice)
    comm = communicator(job.pk, token)
    assert (await comm.connect())[0]
    assert (await comm.receive_json_from(timeout=5))["type"] == "state"
    assert flaky.calls == 3  # the failure, then the job's group and the user's (revocations)
    # Joined on the second try: state changes reach this client.
    after_master = await report_started(job.pk, "master")
    while (frame := await comm.receive_json_from(timeout=5)) != {
        "type": "state",
        "job": after_master,
    }:
        assert frame["type"] == "state"  # the placement's own event may come first
    await comm.disconnect()


async def test_with_redis_still_away_the_client_is_told_to_come_back(
    job: Job, alice: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    layer = get_channel_layer()
    monkeypatch.setattr(layer, "group_add", _FlakyGroupAdd(layer.group_add, failures=2))
    token = await database_sync_to_async(ApiToken.issue)(alice)
    assert await communicator(job.pk, token).connect() == (False, 1011)


@pytest.mark.parametrize("gone_at", ["log", "close"])
async def test_a_client_that_went_away_is_no_error(
    job: Job,
    alice: User,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    gone_at: str,
) -> None:
    """uvicorn raises ClientDisconnected on a send to a client that has gone: in the middle of
    the log, or as the server closes after the end while `trainyard logs -f`, having read the
    end, closes too. Normal: no ERROR, no traceback in the web server's log."""
    caplog.set_level(logging.DEBUG, logger="jobs.consumers")
    consumers: list[JobConsumer] = []
    original_send, original_close = JobConsumer.send, JobConsumer.close
    original_send_json = JobConsumer.send_json

    async def send_json(self: JobConsumer, content: Any, close: bool = False) -> None:
        consumers.append(self)  # the state frame, sent on connecting
        await original_send_json(self, content, close)

    async def send(
        self: JobConsumer,
        text_data: str | None = None,
        bytes_data: bytes | None = None,
        close: bool = False,
    ) -> None:
        # Every frame goes through `send`, log frames already encoded.
        consumers.append(self)
        if gone_at == "log" and text_data and json.loads(text_data).get("type") == "log":
            raise ClientDisconnected
        await original_send(self, text_data, bytes_data, close)

    async def close(self: JobConsumer, code: int | bool | None = None, reason: Any = None) -> None:
        if gone_at == "close":
            raise ClientDisconnected
        await original_close(self, code, reason)

    monkeypatch.setattr(JobConsumer, "send", send)
    monkeypatch.setattr(JobConsumer, "send_json", send_json)
    monkeypatch.setattr(JobConsumer, "close", close)
    token = await database_sync_to_async(ApiToken.issue)(alice)
    sink = LogSink(get_redis())
    append_lines(sink, job.pk, "master", 0, "node-1", ["x"] * 10)
    sink.append_end(job.pk, "job succeeded")
    comm = communicator(job.pk, token)
    assert (await comm.connect())[0]
    follower = consumers[0].follower
    assert follower is not None
    await asyncio.wait_for(follower, 5)
    assert [r.getMessage() for r in caplog.records if r.name == "jobs.consumers"] == [
        f"the client of job {job.pk}'s log stream went away"
    ]
    assert all(r.levelno == logging.DEBUG for r in caplog.records if r.name == "jobs.consumers")
    await comm.disconnect()


async def test_an_event_after_the_close_sends_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """The final state can reach the job's group after the relay sent the log's end and
    closed; uvicorn refuses a send after a close with an error that aborted the connection,
    before the client had read the close (seen by bench.logs: "no close frame received or
    sent"). The consumer drops it, and the relay stops at its next frame."""
    sent: list[dict[str, Any]] = []

    async def base_send(message: dict[str, Any]) -> None:
        if sent and sent[-1]["type"] == "websocket.close":
            raise RuntimeError(f"Unexpected ASGI message '{message['type']}' after a close")
        sent.append(message)

    consumer = JobConsumer()
    consumer.base_send = base_send
    await consumer.job_event({"payload": {"type": "state", "job": {"state": "running"}}})
    assert [m["type"] for m in sent] == ["websocket.send"]
    await consumer.close()
    await consumer.job_event({"payload": {"type": "state", "job": {"state": "succeeded"}}})
    with pytest.raises(ClientDisconnected):
        await consumer._send_text('{"type": "log"}')
    assert [m["type"] for m in sent] == ["websocket.send", "websocket.close"]
