"""Building requests and capturing what the console would send to agents."""

import itertools
from datetime import datetime
from typing import Any, cast

import pytest
import redis
from django.contrib.auth.models import User
from django.test import Client

from jobs.logstream import RawEntry
from jobs.models import ApiToken
from jobs.services.lifecycle import dispatch
from workers import contract
from workers.logsink import LogBatch, LogSink


def job_request(instances: int = 3, package: str = "cpu-1", **overrides: Any) -> dict[str, Any]:
    roles: dict[str, Any] = {"master": {"package": package, "instances": 1}}
    if instances > 1:
        roles["worker"] = {"package": package, "instances": instances - 1}
    request = {
        "name": "digits",
        "image": "pytorch:2.13-cpu",
        "program": {"script": "digits-ddp", "args": ["--epochs", "2"]},
        "roles": roles,
    }
    request.update(overrides)
    return request


def api_submit(client: Client, user: User, **overrides: Any) -> Any:
    """POST /api/v1/jobs with `user`'s token: job_request(instances=2) with `overrides`."""
    return client.post(
        "/api/v1/jobs",
        job_request(instances=2, **overrides),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Token {ApiToken.issue(user)}",
    )


class SentTasks:
    """Records Celery messages instead of sending them (unit tests only).

    A request to schedule runs `schedule()` at once, as the console worker would on receiving
    it, so that a test sees a submitted job placed.
    """

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any], str]] = []

    def __call__(
        self, name: str, kwargs: dict[str, Any] | None = None, queue: str = "", **_: Any
    ) -> None:
        self.sent.append((name, kwargs or {}, queue))
        if name == contract.TASK_SCHEDULE:
            from jobs.services.scheduler import scheduling

            scheduling.schedule()

    def named(self, name: str) -> list[tuple[str, dict[str, Any], str]]:
        return [s for s in self.sent if s[0] == name]


@pytest.fixture
def sent_tasks(monkeypatch: pytest.MonkeyPatch) -> SentTasks:
    recorder = SentTasks()
    monkeypatch.setattr(dispatch.app, "send_task", recorder)
    return recorder


def stream_entries(client: redis.Redis, job_id: int) -> list[RawEntry]:
    """Every raw entry of a job's log stream (client made with decode_responses=True)."""
    return cast(list[RawEntry], client.xrange(contract.log_stream_key(job_id)))


_seq = itertools.count(1)


def append_lines(
    sink: LogSink,
    job_id: int,
    role: str,
    index: int,
    node: str,
    lines: list[str],
    stream: str = contract.STREAM_STDOUT,
    ts: float = 1.0,
) -> int:
    """Append one batch as an agent would; returns the cursor of its last line."""
    batch = LogBatch(job_id, role, index, node, stream, ts, lines, "test-writer", next(_seq))
    return sink.append([batch])[0]


def give_credentials(node: str) -> str:
    """Credentials for `node`, as `manage.py agent_credentials` makes them but without touching
    Redis; returns the key its agent signs reports with."""
    from jobs.models import AgentCredential
    from workers import credentials

    secret = credentials.new_secret()
    AgentCredential.objects.update_or_create(
        node_name=node,
        defaults={
            "password_sha256": credentials.password_hash(secret),
            "signing_key": credentials.signing_key(secret),
        },
    )
    return credentials.signing_key(secret)


def queue_key(priority: int, created: datetime, job_id: int) -> tuple[int, datetime, int]:
    """A waiting job's place without fair share, for the simulations: the scheduler's query
    orders so (jobs.services.scheduler.queue_order.ORDER_BY)."""
    return (-priority, created, job_id)
