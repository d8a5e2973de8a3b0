"""Heartbeats drained off a Redis list past Celery (jobs/services/heartbeat_drain.py), on the
real Redis: written as the task writes them, junk dropped with a log line, no spinning when
idle, the flag that sends agents there set while it drains and gone when it stops, and each
heartbeat taken once by two drains. The limits on a misbehaving agent are checked on this path
too, in test_heartbeat_limits.py."""

import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from jobs import tasks
from jobs.models import Node
from jobs.services import heartbeat_batch, heartbeat_drain, heartbeat_limits
from stack.redis_server import free_port
from tests.unit.helpers import give_credentials
from workers import contract, credentials, heartbeat_route


@pytest.fixture(autouse=True)
def no_heartbeat_seen(settings: Any) -> None:
    heartbeat_limits.forget()
    settings.TRAINYARD_HEARTBEAT_BATCH_SECONDS = 0.001


@pytest.fixture
def drain(redis_url: str) -> Iterator[heartbeat_drain.DrainLoop]:
    loop = heartbeat_drain.DrainLoop()
    loop.interval = 0.2  # an idle pass waits this long on the list
    yield loop
    loop.stop()
    loop.client.close()


def push(client: redis.Redis, *payloads: dict[str, Any] | bytes) -> None:
    """As an agent pushes (workers/heartbeat_route.py), or junk as it is."""
    for payload in payloads:
        message = payload if isinstance(payload, bytes) else heartbeat_route.route(1, payload)
        assert message is not None
        client.rpush(contract.HEARTBEATS_KEY, message)


def signed(name: str, key: str, **extra: Any) -> dict[str, Any]:
    payload = {"node": name, "address": "10.0.0.1", "cpus": 8, "memory_gb": 32, "gpus": 0,
               "incarnation": "a", "sent": time.time(), "running": [], "finished": [],
               "protocol": contract.PROTOCOL_VERSION, **extra}  # fmt: skip
    return credentials.sign(payload, key, contract.TASK_NODE_HEARTBEAT)


def test_it_writes_the_pushed_heartbeats_and_says_it_drains(
    nodes: list[Node], drain: heartbeat_drain.DrainLoop
) -> None:
    push(drain.client, signed("node-1", give_credentials("node-1"), cpus=12),
         signed("node-2", give_credentials("node-2"), cpus=16))  # fmt: skip
    assert drain.one_pass() == 2
    assert {n.name: n.cpu for n in Node.objects.all()} == {"node-1": 12, "node-2": 16}
    assert 0 < drain.client.ttl(contract.HEARTBEATS_DRAINED_KEY) <= heartbeat_drain.FLAG_TTL_SECONDS
    assert drain.client.llen(contract.HEARTBEATS_KEY) == 0


def test_a_forged_pushed_heartbeat_is_refused(
    nodes: list[Node], drain: heartbeat_drain.DrainLoop, caplog: pytest.LogCaptureFixture
) -> None:
    give_credentials("node-1")
    with caplog.at_level(logging.WARNING):
        push(drain.client, signed("node-1", give_credentials("node-2"), cpus=99))
        drain.one_pass()
    assert Node.objects.get(name="node-1").cpu == 8
    assert "claims to come from node 'node-1'" in caplog.text


def test_a_noisy_node_in_a_batch_is_refused_without_spoiling_it_for_the_others(
    nodes: list[Node],
    drain: heartbeat_drain.DrainLoop,
    settings: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A node that pushes 100 heartbeats at once, and huge ones, among another node's."""
    settings.TRAINYARD_HEARTBEAT_MIN_SPACING_SECONDS = 60
    settings.TRAINYARD_HEARTBEAT_MAX_ENTRIES = 50
    noisy, quiet = give_credentials("node-1"), give_credentials("node-2")
    huge = [{"job_id": k, "role": "worker", "index": k, "state": "running"} for k in range(51)]
    burst = [signed("node-1", noisy, cpus=12 + k) for k in range(100)]
    with caplog.at_level(logging.WARNING):
        push(drain.client, signed("node-1", noisy, running=huge, cpus=99), *burst[:50],
             signed("node-2", quiet, cpus=16), *burst[50:])  # fmt: skip
        assert drain.one_pass() == 102
    assert {n.name: n.cpu for n in Node.objects.all()} == {"node-1": 12, "node-2": 16}
    assert "its running list has 51 entries (at most 50)" in caplog.text
    assert caplog.text.count("refused") == 1  # one line a minute per node, with a count


def test_when_idle_it_waits_on_the_list_instead_of_spinning(
    drain: heartbeat_drain.DrainLoop,
) -> None:
    started = time.monotonic()
    assert drain.one_pass() == 0
    assert time.monotonic() - started >= 0.15


def test_what_is_not_a_json_object_is_dropped_with_one_log_line(
    nodes: list[Node], drain: heartbeat_drain.DrainLoop, caplog: pytest.LogCaptureFixture
) -> None:
    key = give_credentials("node-1")
    with caplog.at_level(logging.WARNING):
        push(drain.client, b"not json", b"[1, 2]", b'"a string"', b"\xff\xfe\x00 not UTF-8",
             signed("node-1", key, cpus=12), b"null", b"[" * 100_000 + b"]" * 100_000,
             b'{"node": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")  # fmt: skip
        assert drain.one_pass() == 8
    assert Node.objects.get(name="node-1").cpu == 12  # the batch was not spoiled
    assert "dropped 1 pushed heartbeat(s) that were not JSON objects" in caplog.text
    assert "b'not json'" in caplog.text
    assert caplog.text.count("not JSON objects") == 1  # one line a minute, not one each


def test_stopping_deletes_the_flag_and_writes_what_agents_pushed_before(
    nodes: list[Node], drain: heartbeat_drain.DrainLoop
) -> None:
    drain.one_pass()
    assert drain.client.exists(contract.HEARTBEATS_DRAINED_KEY)
    push(drain.client, signed("node-1", give_credentials("node-1"), cpus=12))
    drain.finish()
    assert not drain.client.exists(contract.HEARTBEATS_DRAINED_KEY)
    assert Node.objects.get(name="node-1").cpu == 12


def test_the_thread_sets_the_flag_while_it_runs_and_deletes_it_when_stopped(
    drain: heartbeat_drain.DrainLoop,
) -> None:
    drain.start()
    deadline = time.monotonic() + 10
    while not drain.client.exists(contract.HEARTBEATS_DRAINED_KEY):
        assert time.monotonic() < deadline, "the drain never said it drains"
        time.sleep(0.05)
    drain.stop()
    assert not drain.is_alive()
    assert not drain.client.exists(contract.HEARTBEATS_DRAINED_KEY)


def test_a_drain_starting_alone_forgets_what_was_pushed_before_the_last_one_died(
    drain: heartbeat_drain.DrainLoop,
) -> None:
    push(drain.client, {"node": "node-1", "sent": 1.0})
    drain.forget_leftovers()
    assert drain.client.llen(contract.HEARTBEATS_KEY) == 0
    # In the same step it raised its flag: agents push from now on.
    assert 0 < drain.client.ttl(contract.HEARTBEATS_DRAINED_KEY) <= heartbeat_drain.FLAG_TTL_SECONDS
    # Beside a live drain (its flag set), what is on the list is fresh: left for it.
    drain.client.set(contract.HEARTBEATS_DRAINED_KEY, "another console worker", ex=15)
    push(drain.client, {"node": "node-1", "sent": 2.0})
    drain.forget_leftovers()
    assert drain.client.llen(contract.HEARTBEATS_KEY) == 1


def test_two_drains_take_each_heartbeat_once(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    taken: list[int] = []
    lock = threading.Lock()

    def write(batch: list[dict[str, Any]]) -> None:
        with lock:
            taken.extend(payload["n"] for payload in batch)

    monkeypatch.setattr(heartbeat_batch, "write", write)
    loops = [heartbeat_drain.DrainLoop(), heartbeat_drain.DrainLoop()]
    for loop in loops:
        loop.interval = 0.1
        loop.start()
    try:
        # Agents push only while a drain's flag lives (workers/heartbeat_route.py).
        deadline = time.monotonic() + 20  # a hang guard
        while not loops[0].client.exists(contract.HEARTBEATS_DRAINED_KEY):
            assert time.monotonic() < deadline, "no drain raised its flag"
            time.sleep(0.01)
        for k in range(0, 1000, 50):  # as agents push: a few at a time, while both drain
            push(loops[0].client, *({"node": f"n-{n}", "n": n} for n in range(k, k + 50)))
            time.sleep(0.005)
        deadline = time.monotonic() + 20
        while len(taken) < 1000 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        for loop in loops:
            loop.stop()
            loop.client.close()
    assert sorted(taken) == list(range(1000))


def test_without_redis_a_pass_waits_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    nowhere = redis.Redis(port=free_port(), socket_connect_timeout=1, retry=Retry(NoBackoff(), 0))
    loop = heartbeat_drain.DrainLoop(nowhere)
    loop.interval = 0.2
    started = time.monotonic()
    with caplog.at_level(logging.WARNING):
        assert loop.one_pass() == 0
    assert time.monotonic() - started >= 0.15
    assert "heartbeat drain: Redis:" in caplog.text


@pytest.mark.parametrize("drained", [True, False])
def test_the_console_worker_drains_unless_told_not_to(
    redis_url: str, settings: Any, monkeypatch: pytest.MonkeyPatch, drained: bool
) -> None:
    settings.TRAINYARD_RECONCILE_SECONDS = 0
    settings.TRAINYARD_RETENTION_SECONDS = 0
    settings.TRAINYARD_DB_STATISTICS_SECONDS = 0
    settings.TRAINYARD_SLURM_SECONDS = 0
    settings.TRAINYARD_EXPERIMENT_SWEEP_SECONDS = 0
    settings.TRAINYARD_HEARTBEAT_DRAIN = drained
    monkeypatch.setattr(tasks, "_periodic", [])
    tasks.start_periodic_passes()
    try:
        assert [type(loop) for loop in tasks._periodic] == (
            [heartbeat_drain.DrainLoop] if drained else []
        )
        client = redis.Redis.from_url(redis_url)
        deadline = time.monotonic() + (10 if drained else 1.5)
        while not client.exists(contract.HEARTBEATS_DRAINED_KEY) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert bool(client.exists(contract.HEARTBEATS_DRAINED_KEY)) == drained
    finally:
        tasks.stop_periodic_passes()
    assert not client.exists(contract.HEARTBEATS_DRAINED_KEY)  # agents back to Celery at once
