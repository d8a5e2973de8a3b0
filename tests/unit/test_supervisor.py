"""The agent's supervisor with real processes and a real Redis; reports are captured."""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import redis

from jobs.logstream import parse_entry
from tests.conftest import FIXTURE_CODE_ROOT, private_redis, process_alive
from tests.conftest import wait_until as wait_for
from tests.unit.helpers import stream_entries
from workers import contract
from workers import supervisor as supervisor_module
from workers.agent import heartbeat_payload, make_celery, make_reporter
from workers.logship import LogShipper
from workers.procrecords import ProcRecord
from workers.spec import ReplicaSpec
from workers.supervisor import Supervisor, describe_exit


class Reports:
    def __init__(self) -> None:
        self.items: list[tuple[str, dict[str, Any]]] = []
        self.changed = threading.Condition()

    def __call__(
        self, task_name: str, payload: dict[str, Any], deadline: float | None = None
    ) -> None:
        with self.changed:
            self.items.append((task_name, payload))
            self.changed.notify_all()

    def named(self, name: str) -> list[dict[str, Any]]:
        with self.changed:
            return [p for n, p in self.items if n == name]

    def wait_for(
        self, name: str, timeout: float = 30, job_id: int | None = None, attempt: int = 0
    ) -> dict[str, Any]:
        """The first report of that name (about that job and attempt, if given), once it has
        come."""

        def first() -> dict[str, Any] | None:
            return next(
                (
                    p
                    for n, p in self.items
                    if n == name
                    and job_id in (None, p["job_id"])
                    and p.get("attempt", 0) == attempt
                ),
                None,
            )

        with self.changed:
            found = self.changed.wait_for(first, timeout)
        assert found, f"no {name} report; got {self.items}"
        return found


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


class Tree:
    """sleep_tree.py in a session of its own, as the supervisor starts trainers: the trainer
    leads its process group, and its child is in that group."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(FIXTURE_CODE_ROOT / "sleep_tree.py")],
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        assert self.proc.stdout is not None
        match = re.match(r"pid=(\d+) child=(\d+)", self.proc.stdout.readline())
        assert match, "sleep_tree.py did not print its pids"
        self.trainer, self.child = (int(p) for p in match.groups())

    def record(self, job_id: int = 5, role: str = "worker", index: int = 1) -> ProcRecord:
        return ProcRecord(
            job_id, role, index, self.trainer, pgid=self.trainer,
            create_time=psutil.Process(self.trainer).create_time(),
        )  # fmt: skip

    @property
    def pids(self) -> list[int]:
        return [self.trainer, self.child]

    def alive(self) -> list[bool]:
        return [process_alive(p) for p in self.pids]

    def kill(self) -> None:
        """Test cleanup: by the pids it started, whatever the test left."""
        for pid in reversed(self.pids):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()
        wait_until(lambda: not any(self.alive()), 5, f"{self.pids} to die of SIGKILL")


def wait_until(condition: Callable[[], object], timeout: float, what: str) -> None:
    """Poll until `condition()` holds; fail saying what never happened."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"gave up after {timeout:g} s waiting for {what}"
        time.sleep(0.02)


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


def test_an_ended_replicas_files_stay_until_the_database_has_their_lines_which_go_again_if_lost(
    supervisor: Supervisor, reports: Reports, client: redis.Redis
) -> None:
    supervisor.start(spec("markup.py"))
    exited = reports.wait_for(contract.TASK_REPLICA_EXITED)
    [(writer, end)] = exited["log_ends"].items()
    assert client.hget(contract.log_seen_key(11), writer) == str(end)

    def kept() -> bool:
        return any(p.is_dir() for p in supervisor.keepers_dir.iterdir())

    assert kept(), "the log keeper has not acknowledged the lines"
    # Redis loses the replica's lines (a crash after the exit, before the keeper had them).
    client.delete(contract.log_stream_key(11))
    client.hdel(contract.log_seen_key(11), writer)
    wait_for("the lines sent again", lambda: len(texts(client)) == 21)
    assert texts(client)[-1] == "rank 0 done"
    assert client.hget(contract.log_seen_key(11), writer) == str(end)
    assert kept()
    client.hset(contract.log_ack_key(11), writer, end)  # the database has them all
    wait_for("the files to go", lambda: not kept())


def test_an_ended_replicas_files_wait_for_no_acknowledgement_once_its_job_is_deleted(
    supervisor: Supervisor, reports: Reports, client: redis.Redis
) -> None:
    """The log keeper archives no deleted job's lines: its acknowledgement would never come."""
    supervisor.start(spec("numbered.py", job_id=33, checkpoint_key="ab33", args=["--lines", "5"]))
    assert reports.wait_for(contract.TASK_REPLICA_EXITED, job_id=33)["log_ends"]
    assert any(p.is_dir() for p in supervisor.keepers_dir.iterdir())
    assert supervisor.remove_checkpoints(33, "ab33")
    wait_for("the files to go", lambda: not any(supervisor.keepers_dir.iterdir()))


def test_an_ended_replicas_files_are_kept_for_their_acknowledgement_a_bounded_time_from_its_end(
    supervisor: Supervisor, reports: Reports, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No log keeper answers (none runs here): the files go once the replica ended longer ago
    than the bound, counted from its end as its keeper recorded it (an agent taking the ended
    replica over again after a restart waits no longer)."""
    monkeypatch.setattr(supervisor_module, "FILES_KEPT_FOR_ARCHIVE_SECONDS", 0.0)
    supervisor.start(spec("numbered.py", job_id=34, args=["--lines", "5"]))
    assert reports.wait_for(contract.TASK_REPLICA_EXITED, job_id=34)["log_ends"]
    wait_for("the files to go", lambda: not any(supervisor.keepers_dir.iterdir()))


def test_it_reports_a_failure_with_exit_code_and_stderr_tail(
    supervisor: Supervisor, reports: Reports
) -> None:
    supervisor.start(spec("fail.py"))
    exited = reports.wait_for(contract.TASK_REPLICA_EXITED)
    assert (exited["state"], exited["exit_code"]) == ("failed", 3)
    assert exited["stderr_tail"][-1] == "RuntimeError: simulated failure in step 3"


def test_it_stops_the_whole_process_group(
    supervisor: Supervisor, reports: Reports, client: redis.Redis
) -> None:
    supervisor.start(spec("sleep_tree.py"))
    reports.wait_for(contract.TASK_REPLICA_STARTED)
    pids = list(tree_pids(client))
    assert all(process_alive(p) for p in pids)
    assert supervisor.stop_job(11, "cancelled") == 1
    exited = reports.wait_for(contract.TASK_REPLICA_EXITED)
    assert exited["state"] == "stopped" and exited["reason"] == "cancelled"
    assert not any(process_alive(p) for p in pids)


def test_it_stops_a_replica_still_waiting_for_the_rendezvous(
    supervisor: Supervisor, reports: Reports, client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The supervisor shares this client: seeing it ask for the master's port, and get no
    # answer, is seeing the replica wait at the rendezvous.
    looked = threading.Event()
    real_get = client.get

    def get(name: str) -> Any:
        value = real_get(name)
        if name == contract.rendezvous_key(11) and value is None:
            looked.set()
        return value

    monkeypatch.setattr(client, "get", get)
    supervisor.start(
        spec("markup.py", role="worker", index=1, world_size=2, node_rank=1, rank_offset=1)
    )
    assert looked.wait(30), "the worker never looked for its master's port"
    assert [(r["state"], r["pids"]) for r in supervisor.running()] == [("waiting", [])]
    assert supervisor.stop_job(11, "cancelled") == 1
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
    wait_until(
        lambda: "first line, not flushed by the script" in texts(client),
        60,
        "the first line while the trainer runs",
    )
    assert supervisor.running()[0]["state"] == "running"  # it came while the process ran
    assert supervisor.stop_job(11, "cancelled") == 1
    reports.wait_for(contract.TASK_REPLICA_EXITED)


def test_a_trainer_reports_metrics_and_the_agent_samples_it(
    supervisor: Supervisor, reports: Reports, client: redis.Redis
) -> None:
    assert supervisor.start(spec("report_metrics.py"))
    exited = reports.wait_for(contract.TASK_REPLICA_EXITED)
    assert exited["state"] == "succeeded", (exited["reason"], exited["stderr_tail"])
    batches = [parse_entry(i, f) for i, f in stream_entries(client, 11)]
    points = [json.loads(t) for b in batches if b.stream == "metric" for t in b.lines]
    names = [p["name"] for p in points]
    assert names.count("loss") == 3 and "total_steps" in names
    assert {"cpu_percent", "memory_mb"} <= set(names)  # sampled while it ran
    notes = [t for b in batches if b.stream == "stderr" for t in b.lines]
    assert any("skipped a line: not JSON" in n for n in notes)


# --- idempotent messages, truthful reports ------------------------------------------------------


def tree_pids(client: redis.Redis, job_id: int = 11) -> tuple[int, int]:
    """The trainer's and its child's pids, as sleep_tree.py prints them in its log."""
    wait_until(lambda: texts(client, job_id), 30, f"sleep_tree.py of job {job_id} to print")
    match = re.match(r"pid=(\d+) child=(\d+)", texts(client, job_id)[0])
    assert match
    trainer, child = (int(p) for p in match.groups())
    return trainer, child


def trainers_running(script: str) -> list[psutil.Process]:
    """This test's own descendants that run `script`."""
    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if any(arg.endswith(script) for arg in proc.cmdline()):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def test_a_second_start_of_a_running_replica_starts_nothing_and_says_it_runs(
    supervisor: Supervisor, reports: Reports, client: redis.Redis
) -> None:
    assert supervisor.start(spec("sleep_tree.py"))
    started = reports.wait_for(contract.TASK_REPLICA_STARTED)
    trainer, _ = tree_pids(client)
    assert started["incarnation"] == supervisor.incarnation and started["pids"] == [trainer]

    assert not supervisor.start(spec("sleep_tree.py"))

    assert reports.named(contract.TASK_REPLICA_STARTED) == [started, started]
    assert [p.pid for p in trainers_running("sleep_tree.py")] == [trainer]
    assert [r.pid for r in supervisor.records.load()] == [trainer]


def test_a_start_of_a_replica_that_ended_lately_sends_its_exit_again(
    supervisor: Supervisor, reports: Reports
) -> None:
    assert supervisor.start(spec("fail.py"))
    exited = reports.wait_for(contract.TASK_REPLICA_EXITED)

    assert not supervisor.start(spec("fail.py"))

    assert reports.named(contract.TASK_REPLICA_EXITED) == [exited, exited]
    assert len(reports.named(contract.TASK_REPLICA_STARTED)) == 1  # it did not run again


def test_a_stop_of_a_replica_it_never_ran_reports_it_unknown(
    supervisor: Supervisor, reports: Reports
) -> None:
    before = time.time()
    assert supervisor.stop_job(12, "cancelled", [{"role": "worker", "index": 2}]) == 0
    unknown = reports.wait_for(contract.TASK_REPLICA_EXITED)
    assert unknown == {
        "job_id": 12,
        "attempt": 0,
        "role": "worker",
        "index": 2,
        "node": "n1",
        "state": "unknown",
        "exit_code": None,
        "reason": "not running on n1",
        "stderr_tail": [],
        "ended_at": unknown["ended_at"],
        "incarnation": supervisor.incarnation,
    }
    assert before <= unknown["ended_at"] <= time.time()


def test_a_stop_of_a_replica_that_ended_lately_sends_its_exit_again(
    supervisor: Supervisor, reports: Reports
) -> None:
    assert supervisor.start(spec("fail.py"))
    exited = reports.wait_for(contract.TASK_REPLICA_EXITED)

    assert supervisor.stop_job(11, "cancelled", [{"role": "master", "index": 0}]) == 0

    assert reports.named(contract.TASK_REPLICA_EXITED) == [exited, exited]


def test_a_stop_kills_the_job_s_processes_that_an_earlier_agent_left(
    supervisor: Supervisor, reports: Reports, tmp_path: Path
) -> None:
    left, other_job = Tree(), Tree()
    try:
        supervisor.records.write(left.record(job_id=12))
        supervisor.records.write(other_job.record(job_id=13))

        assert supervisor.stop_job(12, "cancelled") == 0  # the call of old: no replica list

        assert left.alive() == [False, False]
        assert other_job.alive() == [True, True]
        assert [r.job_id for r in supervisor.records.load()] == [13]
        assert reports.items == []  # nothing was expected here, so nothing is reported
    finally:
        left.kill()
        other_job.kill()


def test_a_process_killed_by_a_signal_is_reported_so(
    supervisor: Supervisor, reports: Reports, client: redis.Redis
) -> None:
    supervisor.start(spec("sleep_tree.py"))
    trainer, child = tree_pids(client)
    before = time.time()
    os.kill(trainer, signal.SIGKILL)
    exited = reports.wait_for(contract.TASK_REPLICA_EXITED)
    assert (exited["state"], exited["exit_code"], exited["reason"]) == (
        "failed",
        -9,
        "killed by signal SIGKILL",
    )
    assert before <= exited["ended_at"] <= time.time()
    assert exited["incarnation"] == supervisor.incarnation
    assert not process_alive(child)  # its group went with it
    assert supervisor.records.load() == []


def test_exit_reasons_name_the_signal() -> None:
    assert describe_exit(0) == "exited with code 0"
    assert describe_exit(3) == "exited with code 3"
    assert describe_exit(-15) == "killed by signal SIGTERM"
    assert describe_exit(-99) == "killed by signal 99"


def test_heartbeats_list_what_runs_and_what_ended_lately(
    supervisor: Supervisor, reports: Reports, client: redis.Redis
) -> None:
    supervisor.start(spec("fail.py", job_id=14))
    failed = reports.wait_for(contract.TASK_REPLICA_EXITED)
    supervisor.start(spec("stubborn.py"))  # job 11; ignores SIGTERM, so its stop takes a while
    started = reports.wait_for(contract.TASK_REPLICA_STARTED, job_id=11)
    wait_until(lambda: "tick 0" in texts(client), 30, "stubborn.py to ignore SIGTERM")
    # Job 15's master never publishes its port: this worker waits.
    supervisor.start(
        spec("markup.py", job_id=15, role="worker", index=1, world_size=2, node_rank=1,
             rank_offset=1)
    )  # fmt: skip

    payload = heartbeat_payload({"node": "n1", "cpus": 2}, supervisor)

    assert set(payload) == {
        "node", "cpus", "incarnation", "running", "finished", "sent", "disk_full", "protocol"
    }  # fmt: skip
    assert payload["incarnation"] == supervisor.incarnation
    assert sorted(payload["running"], key=lambda r: r["job_id"]) == [
        {"job_id": 11, "attempt": 0, "role": "master", "index": 0, "state": "running",
         "pids": started["pids"]},
        {"job_id": 15, "attempt": 0, "role": "worker", "index": 1, "state": "waiting",
         "pids": []},
    ]  # fmt: skip
    assert payload["finished"] == [
        {"job_id": 14, "attempt": 0, "role": "master", "index": 0, "state": "failed",
         "exit_code": 3,
         "reason": "RuntimeError: simulated failure in step 3 (exited with code 3)",
         "ended_at": failed["ended_at"]},
    ]  # fmt: skip

    supervisor.stop_job(11, "cancelled")
    running = {r["job_id"]: r["state"] for r in supervisor.running()}
    assert running == {11: "stopping", 15: "waiting"}
    stopped = reports.wait_for(contract.TASK_REPLICA_EXITED, job_id=11)
    assert (stopped["state"], stopped["exit_code"], stopped["reason"]) == (
        "stopped",
        -9,  # after the grace: it ignored the SIGTERM
        "cancelled",
    )
    finished = heartbeat_payload({}, supervisor)["finished"]
    assert [(f["job_id"], f["state"]) for f in finished] == [(14, "failed"), (11, "stopped")]


# --- bounded shutdown ---------------------------------------------------------------------------


def test_shutdown_kills_a_stubborn_trainer_and_returns_when_redis_is_gone(tmp_path: Path) -> None:
    """Shutdown returns (a hang is caught by the suite's per-test timeout, not by a wall-clock
    assert: this machine is shared) with the trainer killed and its lines kept on disk."""
    with private_redis(tmp_path / "redis") as (url, redis_proc):
        shutdown_without_redis(url, redis_proc, tmp_path)


def shutdown_without_redis(url: str, redis_proc: subprocess.Popen[bytes], tmp_path: Path) -> None:
    client = redis.Redis.from_url(url, decode_responses=True)
    shipper = LogShipper(client, tmp_path / "spool")
    # The agent's own reporter: Celery messages through the same Redis.
    reporter = make_reporter(make_celery(url))
    sup = Supervisor("n1", client, shipper, reporter, tmp_path / "work", FIXTURE_CODE_ROOT)
    try:
        sup.start(spec("stubborn.py"))  # ignores SIGTERM: only SIGKILL ends it
        wait_until(lambda: "tick 1" in texts(client), 30, "the trainer's lines in Redis")
        [pid] = sup.running()[0]["pids"]
        redis_proc.terminate()
        redis_proc.wait(10)
        wait_until(lambda: shipper.spooling, 30, "lines to go to the spool")

        began = time.monotonic()
        sup.shutdown(timeout=4)
        took = time.monotonic() - began

        print(
            f"\nshutdown with Redis gone and a trainer ignoring SIGTERM: {took:.1f} s (timeout 4)"
        )
        assert not process_alive(pid)
        assert sup.records.load() == []
        assert shipper.spooling  # the lines wait on disk for the next agent
    finally:
        sup.shutdown(timeout=4)
        shipper.close(timeout=1)


def test_a_restart_starts_only_where_the_first_attempts_checkpoints_are_seen(
    supervisor: Supervisor, reports: Reports, tmp_path: Path
) -> None:
    """Attempt 0 makes the job's folder on the checkpoint root; attempt 1 of the same job runs
    in it, sees TRAINYARD_RESTART_COUNT=1, and a restart of a job whose folder this node
    cannot see refuses to start, saying why."""
    supervisor.start(spec("numbered.py", job_id=31, checkpoint_key="k31", args=["--lines", "1"]))
    assert reports.wait_for(contract.TASK_REPLICA_EXITED, job_id=31)["state"] == "succeeded"
    folder = supervisor.checkpoint_root / "job-31-k31"
    assert (folder / ".trainyard-job").is_file()

    supervisor.start(
        spec("numbered.py", job_id=31, checkpoint_key="k31", attempt=1, args=["--lines", "1"])
    )
    again = reports.wait_for(contract.TASK_REPLICA_EXITED, job_id=31, attempt=1)
    assert again["state"] == "succeeded", again["reason"]

    supervisor.start(spec("numbered.py", job_id=32, checkpoint_key="k32", attempt=1))
    refused = reports.wait_for(contract.TASK_REPLICA_EXITED, job_id=32, attempt=1)
    assert refused["state"] == "failed" and refused["attempt"] == 1
    assert "cannot restart on n1" in refused["reason"] and "job-32-k32" in refused["reason"]
    assert not (supervisor.checkpoint_root / "job-32-k32").exists()


def test_gpu_instances_run_a_process_per_gpu_on_the_gpus_the_agent_assigned(
    client: redis.Redis, reports: Reports, tmp_path: Path
) -> None:
    """A node that says it has 4 GPUs (a fake inventory: no driver here): two instances of 2
    GPUs each get disjoint GPUs and 2 processes each; the GPUs come back when they end."""
    shipper = LogShipper(client, tmp_path / "spool")
    sup = Supervisor("n1", client, shipper, reports, tmp_path / "work", FIXTURE_CODE_ROOT, gpus=4)
    plan: dict[str, Any] = dict(world_size=4, gpus=2, local_world_size=2, cpus=4)
    try:
        assert sup.start(spec("env_probe.py", **plan))
        assert sup.start(spec("env_probe.py", role="worker", index=1, rank_offset=2, **plan))
        wait_until(lambda: len(reports.named(contract.TASK_REPLICA_EXITED)) == 2, 30, "both to end")
        lines = sorted(texts(client))
        assert lines == [
            "RANK=0 LOCAL_RANK=0 LOCAL_WORLD_SIZE=2 WORLD_SIZE=4 CUDA_VISIBLE_DEVICES=0,1",
            "RANK=1 LOCAL_RANK=1 LOCAL_WORLD_SIZE=2 WORLD_SIZE=4 CUDA_VISIBLE_DEVICES=0,1",
            "RANK=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=2 WORLD_SIZE=4 CUDA_VISIBLE_DEVICES=2,3",
            "RANK=3 LOCAL_RANK=1 LOCAL_WORLD_SIZE=2 WORLD_SIZE=4 CUDA_VISIBLE_DEVICES=2,3",
        ]
        # Every GPU is free again: one instance may take all four.
        whole: dict[str, Any] = dict(world_size=4, gpus=4, local_world_size=4, cpus=4, job_id=12)
        assert sup.start(spec("env_probe.py", **whole))
        reports.wait_for(contract.TASK_REPLICA_EXITED, job_id=12)
        assert (
            sorted(line.split()[-1] for line in texts(client, 12))
            == ["CUDA_VISIBLE_DEVICES=0,1,2,3"] * 4
        )
    finally:
        sup.shutdown()
        shipper.close()


def test_a_failures_reason_is_the_exception_its_traceback_ended_with(
    supervisor: Supervisor, reports: Reports
) -> None:
    """No @record: the last line of the traceback the trainer printed."""
    supervisor.start(spec("fail.py"))
    failed = reports.wait_for(contract.TASK_REPLICA_EXITED)
    assert failed["reason"] == "RuntimeError: simulated failure in step 3 (exited with code 3)"
