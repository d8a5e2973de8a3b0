"""What agents remove when a job ends on their node (workers/jobfolders.py, keeping the last N
job folders; workers/checkpoint_retention.py, keeping the newest K checkpoints): the rules on
folders alone, then a real supervisor running trainers."""

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.conftest import FIXTURE_CODE_ROOT
from tests.unit.test_supervisor import Reports, spec, wait_until
from workers import checkpoint_retention, contract, jobfolders
from workers.logship import LogShipper
from workers.supervisor import Supervisor


def job_folder(jobs: Path, job_id: int, used: float) -> Path:
    folder = jobs / str(job_id) / "attempt-0" / "master"
    folder.mkdir(parents=True)
    (folder / "scratch.txt").write_text("x")
    for path in (folder, folder.parent, folder.parent.parent):
        os.utime(path, (used, used))
    return folder.parent.parent


def test_it_removes_the_idle_folders_beyond_the_last_n_oldest_first(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    for job_id, used in ((1, 100.0), (2, 300.0), (3, 200.0), (4, 50.0), (5, 400.0)):
        job_folder(jobs, job_id, used)
    (jobs / "notes").mkdir()  # not a job's: never touched
    # Job 4 is the oldest but still runs here: it stays, and does not count against N.
    assert [p.name for p in jobfolders.ended_job_folders(jobs, busy={4}, keep=2)] == ["1", "3"]

    removed = jobfolders.remove_ended(jobs, 2, busy_jobs=lambda: {4}, lock=threading.Lock())

    assert removed == ["1", "3"]
    assert sorted(p.name for p in jobs.iterdir()) == ["2", "4", "5", "notes"]


def test_keep_zero_removes_every_ended_jobs_folder_and_leftovers(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    job_folder(jobs, 7, 100.0)
    leftover = jobs / f"{jobfolders.TRASH_PREFIX}6-1"  # a pass cut short by a crash
    leftover.mkdir(parents=True)
    assert jobfolders.remove_ended(jobs, 0, busy_jobs=set, lock=threading.Lock()) == ["7"]
    assert list(jobs.iterdir()) == []


def test_nothing_to_do_without_a_jobs_folder(tmp_path: Path) -> None:
    lock = threading.Lock()
    assert jobfolders.remove_ended(tmp_path / "jobs", 0, busy_jobs=set, lock=lock) == []


@pytest.fixture
def client(redis_server: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_server, decode_responses=True)
    c.flushdb()
    yield c


def test_the_agent_keeps_the_last_n_ended_jobs_folders_and_never_a_running_ones(
    client: redis.Redis, tmp_path: Path
) -> None:
    reports = Reports()
    shipper = LogShipper(client, tmp_path / "spool")
    work = tmp_path / "work"
    sup = Supervisor("n1", client, shipper, reports, work, FIXTURE_CODE_ROOT, keep_job_folders=1)
    try:
        assert sup.start(spec("sleep_tree.py", job_id=20))  # runs until stopped
        reports.wait_for(contract.TASK_REPLICA_STARTED)
        for job_id in (21, 22, 23):
            assert sup.start(spec("markup.py", job_id=job_id))
            exited = reports.wait_for(contract.TASK_REPLICA_EXITED, timeout=300, job_id=job_id)
            assert exited["state"] == "succeeded"
        # The report goes before the removal: wait for the last pass to be done.
        wait_until(
            lambda: sorted(p.name for p in (work / "jobs").iterdir()) == ["20", "23"],
            300,  # a hang guard only
            "only the running job's folder and the last ended one to remain",
        )
        assert (work / "jobs" / "20" / "attempt-0" / "master").is_dir()
    finally:
        sup.shutdown()
        shipper.close()


def checkpoints(folder: Path, names_and_times: list[tuple[str, float]]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, when in names_and_times:
        path = folder / name
        if name.endswith("/"):
            path.mkdir()
            (path / "weights.bin").write_bytes(b"w")
        else:
            path.write_text(name)
        os.utime(path, (when, when))


def test_it_keeps_the_newest_k_checkpoints_and_never_temporaries(tmp_path: Path) -> None:
    folder = tmp_path / "job-3-key"
    checkpoints(
        folder,
        [
            ("epoch-1.pt", 100.0),
            ("step-200/", 200.0),
            ("epoch-3.pt", 300.0),
            ("epoch-4.pt", 400.0),
            ("epoch-5.pt.tmp", 50.0),  # a save in progress
            (".trainyard-job", 10.0),  # the platform's marker
        ],
    )
    assert checkpoint_retention.prune(folder, 2) == ["epoch-1.pt", "step-200"]
    assert sorted(p.name for p in folder.iterdir()) == [
        ".trainyard-job",
        "epoch-3.pt",
        "epoch-4.pt",
        "epoch-5.pt.tmp",
    ]
    assert checkpoint_retention.prune(folder, 0) == []  # 0: all kept
    assert checkpoint_retention.prune(tmp_path / "none", 1) == []


def test_the_agent_prunes_a_jobs_checkpoints_once_it_ends_there(
    client: redis.Redis, tmp_path: Path
) -> None:
    reports = Reports()
    shipper = LogShipper(client, tmp_path / "spool")
    work = tmp_path / "work"
    sup = Supervisor("n1", client, shipper, reports, work, FIXTURE_CODE_ROOT, keep_checkpoints=1)
    folder = sup.checkpoint_root / "job-30-abc"
    checkpoints(folder, [("epoch-1.pt", 100.0), ("epoch-2.pt", 200.0)])
    try:
        assert sup.start(spec("markup.py", job_id=30, checkpoint_key="abc"))
        exited = reports.wait_for(contract.TASK_REPLICA_EXITED, timeout=300, job_id=30)
        assert exited["state"] == "succeeded"
        wait_until(
            lambda: sorted(p.name for p in folder.iterdir()) == [".trainyard-job", "epoch-2.pt"],
            300,  # a hang guard only
            "the older checkpoint to go",
        )
    finally:
        sup.shutdown()
        shipper.close()


def test_the_agent_removes_a_deleted_jobs_checkpoints_but_never_a_running_ones(
    client: redis.Redis, tmp_path: Path
) -> None:
    reports = Reports()
    shipper = LogShipper(client, tmp_path / "spool")
    sup = Supervisor("n1", client, shipper, reports, tmp_path / "work", FIXTURE_CODE_ROOT)
    deleted = sup.checkpoint_root / "job-40-ab12"
    running = sup.checkpoint_root / "job-41-cd34"
    checkpoints(deleted, [("epoch-1.pt", 100.0)])
    try:
        assert sup.start(spec("sleep_tree.py", job_id=41, checkpoint_key="cd34"))
        reports.wait_for(contract.TASK_REPLICA_STARTED, job_id=41)
        assert sup.remove_checkpoints(40, "ab12")
        assert not deleted.exists()
        assert not sup.remove_checkpoints(40, "ab12")  # twice: nothing left, no error
        assert not sup.remove_checkpoints(41, "cd34")  # it runs here
        assert running.is_dir()
        assert not sup.remove_checkpoints(42, "../../etc")  # a key names nothing but a key
    finally:
        sup.shutdown()
        shipper.close()
