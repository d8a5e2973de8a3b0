"""The agent's supervisor with real processes and a real Redis; reports are captured."""

import json
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from jobs.logstream import parse_entry
from tests.conftest import FIXTURE_CODE_ROOT, process_alive
from tests.unit.helpers import stream_entries
from workers import contract
from workers.logship import LogShipper
from workers.spec import ReplicaSpec
from workers.supervisor import Supervisor


class Reports:
    def __init__(self) -> None:
        self.items: list[tuple[str, dict[str, Any]]] = []
        self.changed = threading.Condition()

    def __call__(self, name: str, payload: dict[str, Any]) -> None:
        with self.changed:
            self.items.append((name, payload))
            self.changed.notify_all()

    def wait_for(self, name: str, timeout: float = 30) -> dict[str, Any]:
        with self.changed:
            ok = self.changed.wait_for(lambda: any(n == name for n, _ in self.items), timeout)
        assert ok, f"no {name} report; got {self.items}"
        return next(p for n, p in self.items if n == name)


@pytest.fixture
def client(redis_server: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_server, decode_responses=True)
    c.flushdb()
    yield c


@pytest.fixture
def reports() -> Reports:
    return Reports()


@pytest.fixture
def supervisor(client: redis.Redis, reports: Reports, tmp_path: Path) -> Iterator[Supervisor]:
    shipper = LogShipper(client, tmp_path / "spool")
    sup = Supervisor("n1", client, shipper, reports, tmp_path / "work", FIXTURE_CODE_ROOT)
    yield sup
    sup.shutdown()
    shipper.close()


def spec(script: str, role: str = "master", index: int = 0, **kw: Any) -> ReplicaSpec:
    fields: dict[str, Any] = dict(
        job_id=11,
        role=role,
        index=index,
        node="n1",
        framework="pytorch",
        program={"path": script},
        args=[],
        master_addr="127.0.0.1",
        hosts_rendezvous=role == "master",
        world_size=1,
        node_rank=0,
        rank_offset=0,
        local_world_size=1,
        cpus=1,
        gpus=0,
    )
    fields.update(kw)
    return ReplicaSpec(**fields)


def texts(client: redis.Redis, job_id: int = 11) -> list[str]:
    entries = [parse_entry(i, f) for i, f in stream_entries(client, job_id)]
    return [text for e in entries for text in e.lines]


def test_it_runs_a_replica_and_reports_only_after_its_lines_are_in_redis(
    supervisor: Supervisor, reports: Reports, client: redis.Redis
) -> None:
    assert supervisor.start(spec("markup.py"))
    assert not supervisor.start(spec("markup.py"))  # the same replica twice: ignored
    started = reports.wait_for(contract.TASK_REPLICA_STARTED)
    assert started["node"] == "n1" and len(started["pids"]) == 1
    exited = reports.wait_for(contract.TASK_REPLICA_EXITED)
    assert (exited["state"], exited["exit_code"]) == ("succeeded", 0)
    lines = texts(client)
    assert len(lines) == 21 and lines[-1] == "rank 0 done"
    assert client.get(contract.rendezvous_key(11)) is not None


def test_it_reports_a_failure_with_exit_code_and_stderr_tail(
    supervisor: Supervisor, reports: Reports
) -> None:
    supervisor.start(spec("fail.py"))
    exited = reports.wait_for(contract.TASK_REPLICA_EXITED)
    assert (exited["state"], exited["exit_code"]) == ("failed", 3)
    assert exited["stderr_tail"][-1] == "RuntimeError: CUDA out of memory (simulated)"


def test_it_stops_the_whole_process_group(
    supervisor: Supervisor, reports: Reports, client: redis.Redis
) -> None:
    supervisor.start(spec("sleep_tree.py"))
    reports.wait_for(contract.TASK_REPLICA_STARTED)
    deadline = time.monotonic() + 20
    while not texts(client) and time.monotonic() < deadline:
        time.sleep(0.05)
    match = re.match(r"pid=(\d+) child=(\d+)", texts(client)[0])
    assert match
    pids = [int(p) for p in match.groups()]
    assert all(process_alive(p) for p in pids)
    assert supervisor.stop_job(11, "cancelled") == 1
    exited = reports.wait_for(contract.TASK_REPLICA_EXITED)
    assert exited["state"] == "stopped" and exited["reason"] == "cancelled"
    assert not any(process_alive(p) for p in pids)


def test_it_stops_a_replica_still_waiting_for_the_rendezvous(
    supervisor: Supervisor, reports: Reports
) -> None:
    supervisor.start(
        spec("markup.py", role="worker", index=1, world_size=2, node_rank=1, rank_offset=1)
    )
    time.sleep(0.3)
    supervisor.stop_job(11, "cancelled")
    exited = reports.wait_for(contract.TASK_REPLICA_EXITED)
    assert exited["state"] == "stopped"
    assert not [n for n, _ in reports.items if n == contract.TASK_REPLICA_STARTED]


def test_it_refuses_a_program_outside_its_own_code_root(
    supervisor: Supervisor, reports: Reports
) -> None:
    supervisor.start(spec("../unit/test_supervisor.py"))
    exited = reports.wait_for(contract.TASK_REPLICA_EXITED)
    assert exited["state"] == "failed"
    assert "may not contain '..'" in exited["reason"]


def test_a_printed_line_arrives_while_the_trainer_still_runs(
    supervisor: Supervisor, reports: Reports, client: redis.Redis
) -> None:
    # No -u and no flush in the script: the agent's sitecustomize makes stdout line-buffered.
    assert supervisor.start(spec("slow_lines.py"))
    reports.wait_for(contract.TASK_REPLICA_STARTED)
    deadline = time.monotonic() + 60  # hang guard only
    while "first line, not flushed by the script" not in texts(client):
        assert time.monotonic() < deadline, "the line never came while the process ran"
        time.sleep(0.05)
    assert supervisor.stop_job(11, "cancelled") == 1
    reports.wait_for(contract.TASK_REPLICA_EXITED)


def test_a_trainer_reports_metrics_and_the_agent_samples_it(
    supervisor: Supervisor, reports: Reports, client: redis.Redis
) -> None:
    assert supervisor.start(spec("report_metrics.py"))
    exited = reports.wait_for(contract.TASK_REPLICA_EXITED)
    assert exited["state"] == "succeeded", exited
    batches = [parse_entry(i, f) for i, f in stream_entries(client, 11)]
    points = [json.loads(t) for b in batches if b.stream == "metric" for t in b.lines]
    names = [p["name"] for p in points]
    assert names.count("loss") == 3 and "total_steps" in names
    assert {"cpu_percent", "memory_mb"} <= set(names)  # sampled while it ran
    notes = [t for b in batches if b.stream == "stderr" for t in b.lines]
    assert any("skipped a line: not JSON" in n for n in notes)
