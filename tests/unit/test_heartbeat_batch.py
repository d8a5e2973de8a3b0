"""Heartbeats written in batches (jobs/services/heartbeat_batch.py, nodes.node_heartbeats):
one transaction for many, with every behaviour of a heartbeat written alone."""

import logging
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from jobs import tasks
from jobs.models import Node
from jobs.services import heartbeat_batch, heartbeat_limits, reconcile
from jobs.services import nodes as node_service
from tests.unit.helpers import SentTasks, give_credentials
from workers import contract, credentials

Capture = Callable[..., Any]


@pytest.fixture(autouse=True)
def no_heartbeat_seen() -> None:
    heartbeat_limits.forget()


def beat(name: str, sent: float, **extra: Any) -> dict[str, Any]:
    return {"node": name, "address": "10.0.0.1", "cpus": 8, "memory_gb": 32, "gpus": 0,
            "incarnation": "a", "sent": sent, "running": [], "finished": [],
            "protocol": contract.PROTOCOL_VERSION, **extra}  # fmt: skip


def running(job_id: int) -> list[dict[str, Any]]:
    return [{"job_id": job_id, "role": "master", "index": 0, "state": "running"}]


@pytest.fixture
def checked(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The nodes reconciliation was asked to check at once."""
    names: list[str] = []
    monkeypatch.setattr(reconcile, "check_node_now", names.append)
    return names


def test_it_writes_a_batch_of_nodes_in_one_go(nodes: list[Node]) -> None:
    assert (
        node_service.node_heartbeats([beat("node-1", 10.0, cpus=12), beat("node-2", 10.0, cpus=16)])
        == 2
    )
    assert {n.name: n.cpu for n in Node.objects.all()} == {"node-1": 12, "node-2": 16}
    assert Node.objects.get(name="node-1").heartbeat_sent == 10.0


def test_of_two_heartbeats_of_one_node_in_a_batch_the_newer_wins(nodes: list[Node]) -> None:
    node_service.node_heartbeats(
        [beat("node-1", 20.0, running=running(2)), beat("node-1", 10.0, running=running(1)),
         beat("node-2", 10.0, running=running(1)), beat("node-2", 20.0, running=running(2))]
    )  # fmt: skip
    for node in Node.objects.all():
        assert (node.heartbeat_sent, node.running) == (20.0, running(2)), node.name


def test_a_heartbeat_overtaken_by_one_already_written_is_ignored(nodes: list[Node]) -> None:
    node_service.node_heartbeats([beat("node-1", 200.0)])
    node_service.node_heartbeats([beat("node-1", 100.0, running=running(1)), beat("node-2", 5.0)])
    assert Node.objects.get(name="node-1").running == []
    assert Node.objects.get(name="node-2").heartbeat_sent == 5.0


def test_a_new_node_is_created_beside_the_known_ones(nodes: list[Node]) -> None:
    node_service.node_heartbeats([beat("node-1", 1.0), beat("node-3", 1.0, cpus=4, gpus=2),
                                  beat("node-3", 2.0, cpus=4, gpus=2)])  # fmt: skip
    new = Node.objects.get(name="node-3")
    assert (new.cpu, new.gpus, new.memory_gb, new.heartbeat_sent) == (4, 2, 32, 2.0)
    assert new.last_heartbeat is not None and not new.is_lost()


def test_a_new_incarnation_is_checked_once_the_batch_is_written(
    nodes: list[Node], checked: list[str]
) -> None:
    node_service.node_heartbeats([beat("node-1", 1.0), beat("node-2", 1.0)])
    assert checked == []  # a first incarnation is no restart
    node_service.node_heartbeats(
        [beat("node-1", 2.0), beat("node-2", 0.5, incarnation="b", running=running(3))]
    )  # fmt: skip
    assert checked == ["node-2"]
    node2 = Node.objects.get(name="node-2")
    assert (node2.incarnation, node2.running) == ("b", running(3))
    assert node2.previous_heartbeat is not None


def test_capacity_set_by_an_admin_is_kept(nodes: list[Node]) -> None:
    Node.objects.filter(name="node-1").update(cpu=2, capacity_set_by_admin=True)
    node_service.node_heartbeats([beat("node-1", 1.0, cpus=64), beat("node-2", 1.0, cpus=64)])
    node1, node2 = Node.objects.order_by("name")
    assert (node1.cpu, node1.reported_cpu, node2.cpu) == (2, 64, 64)


def test_a_bad_payload_does_not_spoil_the_batch(
    nodes: list[Node], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        written = node_service.node_heartbeats([
            beat("node-1", 1.0, cpus=12),
            {"node": "bad-1", "cpus": 8},  # no address, nor anything else
            beat("bad-2", 1.0, cpus="many"),
            beat("bad-3", 1.0, cpus=-4),  # the database refuses it (a positive integer field)
            beat("node-2", 1.0, cpus=16),
        ])  # fmt: skip
    assert written == 2
    assert {n.name: n.cpu for n in Node.objects.all()} == {"node-1": 12, "node-2": 16}
    for name in ("bad-1", "bad-2", "bad-3"):
        assert repr(name) in caplog.text
    assert "writing them one node at a time" in caplog.text


def test_nodes_that_came_back_ask_for_one_scheduling_pass(
    nodes: list[Node], sent_tasks: SentTasks, django_capture_on_commit_callbacks: Capture
) -> None:
    long_ago = timezone.now() - timedelta(hours=1)
    Node.objects.update(last_heartbeat=long_ago)
    with django_capture_on_commit_callbacks(execute=True):
        node_service.node_heartbeats([beat("node-1", 1.0), beat("node-2", 1.0),
                                      beat("node-3", 1.0)])  # fmt: skip
    assert len(sent_tasks.named(contract.TASK_SCHEDULE)) == 1
    with django_capture_on_commit_callbacks(execute=True):
        node_service.node_heartbeats([beat("node-1", 2.0), beat("node-2", 2.0)])
    assert len(sent_tasks.named(contract.TASK_SCHEDULE)) == 1, "nothing new: no pass"


class Writes:
    """Stands in for nodes.node_heartbeats: records each batch; the first waits for `go`."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.writing = threading.Event()
        self.go = threading.Event()

    def __call__(self, payloads: list[dict[str, Any]]) -> int:
        self.batches.append([p["node"] for p in payloads])
        if len(self.batches) == 1:
            self.writing.set()
            self.go.wait()
        return len(payloads)


def test_heartbeats_arriving_during_a_write_are_written_by_the_writer_next(
    monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    settings.TRAINYARD_HEARTBEAT_BATCH_SECONDS = 0.01
    writes = Writes()
    monkeypatch.setattr(heartbeat_batch, "checked", lambda payloads: payloads)
    monkeypatch.setattr(node_service, "node_heartbeats", writes)
    batcher = heartbeat_batch.Batcher()
    writer = threading.Thread(target=batcher.submit, args=({"node": "a"},))
    writer.start()
    writes.writing.wait()
    batcher.submit({"node": "b"})  # returns at once: a write is under way
    batcher.submit({"node": "c"})
    assert writes.batches == [["a"]]
    writes.go.set()
    writer.join()
    assert writes.batches == [["a"], ["b", "c"]]
    batcher.submit({"node": "d"})  # no write under way: this thread writes it
    assert writes.batches[-1] == ["d"]


def test_a_failed_write_is_logged_and_the_next_heartbeat_is_written(
    monkeypatch: pytest.MonkeyPatch, settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    settings.TRAINYARD_HEARTBEAT_BATCH_SECONDS = 0.01
    written: list[str] = []

    def fails_once(payloads: list[dict[str, Any]]) -> int:
        if not written:
            written.append("failed")
            raise RuntimeError("the database went away")
        written.extend(p["node"] for p in payloads)
        return len(payloads)

    monkeypatch.setattr(heartbeat_batch, "checked", lambda payloads: payloads)
    monkeypatch.setattr(node_service, "node_heartbeats", fails_once)
    batcher = heartbeat_batch.Batcher()
    with caplog.at_level(logging.ERROR):
        batcher.submit({"node": "a"})
    assert "lost a batch of 1 heartbeats" in caplog.text
    batcher.submit({"node": "b"})
    assert written == ["failed", "b"]


def signed(name: str, key: str, **extra: Any) -> dict[str, Any]:
    payload = beat(name, time.time(), **extra)
    return credentials.sign(payload, key, contract.TASK_NODE_HEARTBEAT)


def test_a_batch_takes_the_signed_heartbeats_and_refuses_a_forged_one(
    nodes: list[Node], settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    settings.TRAINYARD_HEARTBEAT_MIN_SPACING_SECONDS = 60
    key1, key2 = give_credentials("node-1"), give_credentials("node-2")
    with caplog.at_level(logging.WARNING):
        taken = heartbeat_batch.checked([
            signed("node-1", key2, cpus=99),  # node-2's key, node-1's name
            signed("node-1", key1, cpus=12),
            signed("node-2", key2, cpus=16),
            signed("node-2", key2, cpus=20),  # too soon after the one before
        ])  # fmt: skip
    assert [(p["node"], p["cpus"]) for p in taken] == [("node-1", 12), ("node-2", 16)]
    assert "claims to come from node 'node-1': its signature does not match" in caplog.text
    assert "refused 1 heartbeat(s) of node 'node-2'" in caplog.text


def test_through_the_task_a_heartbeat_is_written(nodes: list[Node], settings: Any) -> None:
    settings.TRAINYARD_HEARTBEAT_BATCH_SECONDS = 0.001
    tasks.node_heartbeat(signed("node-1", give_credentials("node-1"), cpus=12))
    assert Node.objects.get(name="node-1").cpu == 12


def test_without_a_window_each_heartbeat_is_written_at_once(
    nodes: list[Node], settings: Any
) -> None:
    settings.TRAINYARD_HEARTBEAT_BATCH_SECONDS = 0
    tasks.node_heartbeat(signed("node-1", give_credentials("node-1"), cpus=12))
    tasks.node_heartbeat(signed("node-2", give_credentials("node-1"), cpus=12))  # forged
    assert {n.name: n.cpu for n in Node.objects.all()} == {"node-1": 12, "node-2": 8}


def test_a_heartbeat_leaves_what_an_admin_set(nodes: list[Node]) -> None:
    Node.objects.filter(name="node-1").update(state=Node.State.DRAINING, labels={"zone": "a"})
    node_service.node_heartbeats([beat("node-1", 1.0, running=running(1))])
    node1 = Node.objects.get(name="node-1")
    assert (node1.state, node1.labels, node1.running) == ("draining", {"zone": "a"}, running(1))
