"""The agent on a full work disk (a real tmpfs, or a margin no disk has): it refuses a start
before writing anything, says so in its heartbeat, and a replica that fails while the disk is
full names the disk first. Heartbeats and reports carry the agent's protocol version."""

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.conftest import FIXTURE_CODE_ROOT
from tests.tmpfs import small_tmpfs
from tests.unit.test_supervisor import Reports, spec, wait_until
from workers import contract
from workers.agent import heartbeat_payload, make_reporter
from workers.diskspace import DiskWatch
from workers.logship import LogShipper
from workers.supervisor import Supervisor

NO_DISK_HAS_THIS_MUCH = 2**62


@pytest.fixture
def client(redis_server: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_server, decode_responses=True)
    c.flushdb()
    yield c


def supervisor_on(
    client: redis.Redis, reports: Reports, workdir: Path, min_free_bytes: int
) -> Supervisor:
    workdir.mkdir(parents=True, exist_ok=True)
    shipper = LogShipper(client, workdir.parent / "spool")
    disk = DiskWatch("n1", workdir, min_free_bytes)
    return Supervisor("n1", client, shipper, reports, workdir, FIXTURE_CODE_ROOT, disk=disk)


def test_a_start_on_a_full_disk_is_refused_saying_so(client: redis.Redis, tmp_path: Path) -> None:
    reports = Reports()
    workdir = tmp_path / "work"
    sup = supervisor_on(client, reports, workdir, NO_DISK_HAS_THIS_MUCH)
    try:
        beat = heartbeat_payload({"node": "n1"}, sup)
        assert beat["disk_full"] == f"n1: no space left on {workdir}"
        assert beat[contract.PROTOCOL_FIELD] == contract.PROTOCOL_VERSION
        sup.start(spec("markup.py"))
        exited = reports.wait_for(contract.TASK_REPLICA_EXITED)
        assert (exited["state"], exited["reason"]) == (
            "failed", f"n1: no space left on {workdir}: not started"
        )  # fmt: skip
        assert not reports.named(contract.TASK_REPLICA_STARTED)
        assert not (workdir / "jobs").exists()  # nothing written
        sup.disk = DiskWatch("n1", workdir, 0)  # room again
        assert heartbeat_payload({"node": "n1"}, sup)["disk_full"] == ""
        sup.start(spec("markup.py", job_id=12))
        assert reports.wait_for(contract.TASK_REPLICA_EXITED, job_id=12)["state"] == "succeeded"
    finally:
        sup.shutdown()


def test_a_trainer_that_fills_the_disk_fails_with_a_reason_naming_it(
    client: redis.Redis,
) -> None:
    reports = Reports()
    with small_tmpfs("4m") as disk:
        workdir = disk / "work"
        sup = supervisor_on(client, reports, workdir, 64 * 1024)
        try:
            sup.start(spec("fill_scratch.py"))
            exited = reports.wait_for(contract.TASK_REPLICA_EXITED)
            assert exited["state"] == "failed"
            assert exited["reason"].startswith(f"n1: no space left on {workdir}: OSError: ")
            assert "No space left on device" in exited["reason"]
        finally:
            sup.shutdown()
            # The replica's thread releases its keeper (whose working folder is on the tmpfs)
            # and removes the keeper's folder once it has ended, after the report above: the
            # tmpfs is busy until then.
            keepers = workdir / "keepers"
            wait_until(lambda: not any(keepers.glob("*")), 30, "the keeper to end")


def test_reports_carry_the_protocol_version() -> None:
    sent: list[dict[str, Any]] = []

    class App:
        def send_task(self, name: str, kwargs: dict[str, Any], **_: Any) -> None:
            sent.append(kwargs["payload"])

    make_reporter(App())(contract.TASK_REPLICA_STARTED, {"job_id": 1})  # type: ignore[arg-type]
    assert sent == [{"job_id": 1, contract.PROTOCOL_FIELD: contract.PROTOCOL_VERSION}]
