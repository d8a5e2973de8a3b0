"""A misbehaving agent cannot slow the others: heartbeats too frequent or too large are refused
before they reach the database, with a log line (jobs/services/heartbeat_limits.py), whether
they come as Celery tasks or pushed onto the Redis list the console drains
(jobs/services/heartbeat_drain.py, on the real Redis)."""

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from jobs import tasks
from jobs.models import Node
from jobs.services import heartbeat_drain, heartbeat_limits
from tests.unit.helpers import give_credentials
from workers import contract, credentials, heartbeat_route


@pytest.fixture(autouse=True)
def no_heartbeat_seen(settings: Any) -> None:
    heartbeat_limits.forget()
    # Each heartbeat through the task waits this long for others to write with (heartbeat_batch).
    settings.TRAINYARD_HEARTBEAT_BATCH_SECONDS = 0.001


Send = Callable[[dict[str, Any]], None]


@pytest.fixture(params=["task", "drained"])
def send(request: pytest.FixtureRequest) -> Iterator[Send]:
    """A heartbeat to the console, through the Celery task or pushed and drained."""
    if request.param == "task":
        yield tasks.node_heartbeat
        return
    request.getfixturevalue("redis_url")
    drain = heartbeat_drain.DrainLoop()

    def pushed(payload: dict[str, Any]) -> None:
        message = heartbeat_route.route(1, payload)
        assert message is not None
        drain.client.rpush(contract.HEARTBEATS_KEY, message)
        assert drain.one_pass() == 1

    yield pushed
    drain.client.close()


def signed(key: str, incarnation: str = "a", running: int = 0, cpus: int = 8) -> dict[str, Any]:
    payload = {
        "node": "node-1", "address": "10.0.0.9", "cpus": cpus, "memory_gb": 32, "gpus": 0,
        "incarnation": incarnation, "finished": [], "sent": time.time(),
        "running": [{"job_id": k, "attempt": 0, "role": "worker", "index": k, "state": "running"}
                    for k in range(running)],
    }  # fmt: skip
    return credentials.sign(payload, key, contract.TASK_NODE_HEARTBEAT)


def test_it_takes_one_heartbeat_of_an_agent_per_spacing_and_logs_the_rest(
    nodes: list[Node], caplog: pytest.LogCaptureFixture, settings: Any, send: Send
) -> None:
    settings.TRAINYARD_HEARTBEAT_MIN_SPACING_SECONDS = 60
    key = give_credentials("node-1")
    send(signed(key, cpus=12))
    with caplog.at_level(logging.WARNING):
        for _ in range(100):
            send(signed(key, cpus=99))
    assert Node.objects.get(name="node-1").cpu == 12
    assert "refused 1 heartbeat(s) of node 'node-1'" in caplog.text
    assert caplog.text.count("refused") == 1  # one line a minute, not one a heartbeat


def test_a_restarted_agent_is_heard_at_once(nodes: list[Node], settings: Any, send: Send) -> None:
    settings.TRAINYARD_HEARTBEAT_MIN_SPACING_SECONDS = 60
    key = give_credentials("node-1")
    send(signed(key, incarnation="a", cpus=12))
    send(signed(key, incarnation="b", cpus=16))
    assert Node.objects.get(name="node-1").incarnation == "b"


def test_a_forged_heartbeat_does_not_use_up_the_nodes_turn(
    nodes: list[Node], settings: Any, send: Send
) -> None:
    settings.TRAINYARD_HEARTBEAT_MIN_SPACING_SECONDS = 60
    key = give_credentials("node-1")
    send(signed(give_credentials("node-2"), cpus=99))  # node-2's key, node-1's name
    send(signed(key, cpus=12))
    assert Node.objects.get(name="node-1").cpu == 12


def test_a_huge_running_list_is_refused_with_a_log_line(
    nodes: list[Node], caplog: pytest.LogCaptureFixture, settings: Any, send: Send
) -> None:
    settings.TRAINYARD_HEARTBEAT_MAX_ENTRIES = 50
    key = give_credentials("node-1")
    with caplog.at_level(logging.WARNING):
        send(signed(key, running=51, cpus=99))
    assert Node.objects.get(name="node-1").cpu == 8
    assert "its running list has 51 entries (at most 50)" in caplog.text
    send(signed(key, running=50, cpus=12))
    assert Node.objects.get(name="node-1").cpu == 12
