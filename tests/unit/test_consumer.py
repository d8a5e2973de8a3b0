"""The job websocket through the real ASGI stack, Redis stream and Redis channel layer."""

from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User

from console.asgi import application
from jobs.models import ApiToken, Job
from jobs.redis_client import get_redis
from jobs.services import events
from jobs.services.submission import check_job_request, submit_job
from tests.unit.helpers import job_request
from workers.logsink import LogSink

pytestmark = [
    pytest.mark.usefixtures("catalog", "code_root", "nodes", "redis_url", "sent_tasks"),
    pytest.mark.django_db(transaction=True),
]


@pytest.fixture
def job(alice: User) -> Job:
    return submit_job(alice, check_job_request(job_request(instances=2)))


def communicator(
    job_id: int, token: str | None, after: int = 0, origin: bytes | None = None
) -> WebsocketCommunicator:
    headers = []
    if token:
        headers.append((b"authorization", f"Token {token}".encode()))
    if origin:
        headers.append((b"origin", origin))
    return WebsocketCommunicator(application, f"/ws/jobs/{job_id}/?after={after}", headers)


async def frames_until(comm: WebsocketCommunicator, kind: str) -> list[dict[str, Any]]:
    got = []
    while True:
        frame = await comm.receive_json_from(timeout=5)
        got.append(frame)
        if frame["type"] == kind:
            return got


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
    sink.append_lines(job.pk, "master", 0, "node-1", [("o", 1.0, f"a{i}") for i in range(5)])
    comm = communicator(job.pk, token)
    assert (await comm.connect())[0]
    first = await comm.receive_json_from(timeout=5)
    assert first["type"] == "state" and first["job"]["state"] == "queued"
    replay = await frames_until(comm, "log")
    assert [x["text"] for x in replay[-1]["lines"]] == [f"a{i}" for i in range(5)]
    # Live: a line appended now arrives without reconnecting.
    sink.append_lines(job.pk, "worker", 1, "node-2", [("e", 2.0, "<b>live</b>")])
    live = (await frames_until(comm, "log"))[-1]
    assert live["lines"][0]["text"] == "<b>live</b>" and live["next"] == 6
    await comm.disconnect()

    # Away for a while; more lines and the end arrive meanwhile. Resume after cursor 3.
    sink.append_lines(job.pk, "master", 0, "node-1", [("o", 3.0, "b0"), ("o", 3.1, "b1")])
    sink.append_end(job.pk, "job succeeded")
    comm = communicator(job.pk, token, after=3)
    assert (await comm.connect())[0]
    frames = await frames_until(comm, "end")
    cursors = [line["cursor"] for f in frames if f["type"] == "log" for line in f["lines"]]
    assert cursors == [4, 5, 6, 7, 8]
    assert frames[-1] == {"type": "end", "reason": "job succeeded", "next": 9}
    assert frames[-2]["type"] == "state"  # the final state, fresh from the database
    await comm.disconnect()


async def test_it_relays_state_changes(job: Job, alice: User) -> None:
    token = await database_sync_to_async(ApiToken.issue)(alice)
    comm = communicator(job.pk, token)
    assert (await comm.connect())[0]
    await comm.receive_json_from(timeout=5)
    from channels.layers import get_channel_layer

    await get_channel_layer().group_send(
        events.job_group(job.pk),
        {"type": "job.event", "payload": {"type": "state", "job": {"state": "running"}}},
    )
    frame = await comm.receive_json_from(timeout=5)
    assert frame == {"type": "state", "job": {"state": "running"}}
    await comm.disconnect()
