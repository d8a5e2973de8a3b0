"""workers/jobfiles.py: the privileged side reads a job's file only as the job's own regular file.

Each case puts in the file's place what a hostile trainer can make in its own folder, and
checks that nothing but the job's own bytes is ever read, and that nothing blocks."""

import os
import threading
from pathlib import Path

import pytest

from workers import jobfiles

JOB_UID = 1_900_000_007
OTHER_UID = 1_900_000_008


@pytest.fixture
def folders(tmp_path: Path) -> tuple[Path, Path]:
    """(the trusted folder, the job's folder under it, owned by the job's uid)."""
    job = tmp_path / "jobs" / "1" / "attempt-0" / "master"
    job.mkdir(parents=True)
    os.chown(job, JOB_UID, JOB_UID)
    return tmp_path, job


def secret(tmp_path: Path) -> Path:
    path = tmp_path / "root-only"
    path.write_text('{"message": "the secret key"}\n')
    path.chmod(0o600)
    return path


def owned(path: Path, text: str, uid: int = JOB_UID) -> Path:
    path.write_text(text)
    os.chown(path, uid, uid)
    return path


def test_the_jobs_own_file_is_read_within_the_bound(folders: tuple[Path, Path]) -> None:
    below, job = folders
    owned(job / "metrics-0.jsonl", '{"loss": 1}\n{"loss": 2}\n')
    assert (
        jobfiles.read_file(job / "metrics-0.jsonl", below, JOB_UID) == b'{"loss": 1}\n{"loss": 2}\n'
    )
    assert jobfiles.read_file(job / "metrics-0.jsonl", below, JOB_UID, 12, 5) == b'{"los'


def test_a_missing_file_is_not_found(folders: tuple[Path, Path]) -> None:
    below, job = folders
    with pytest.raises(FileNotFoundError):
        jobfiles.read_file(job / "metrics-0.jsonl", below, JOB_UID)


@pytest.mark.parametrize("target", ["root-only", "other-job"])
def test_a_symbolic_link_is_never_followed(
    folders: tuple[Path, Path], tmp_path: Path, target: str
) -> None:
    below, job = folders
    if target == "root-only":
        pointed = secret(tmp_path)
    else:
        pointed = owned(tmp_path / "other-metrics.jsonl", '{"loss": 9}\n', OTHER_UID)
    (job / "metrics-0.jsonl").symlink_to(pointed)
    with pytest.raises(jobfiles.UnsafeFile, match="symbolic link"):
        jobfiles.read_file(job / "metrics-0.jsonl", below, JOB_UID)


def test_a_fifo_is_refused_without_blocking(folders: tuple[Path, Path]) -> None:
    below, job = folders
    os.mkfifo(job / "metrics-0.jsonl")
    outcome: list[BaseException] = []

    def read() -> None:
        try:
            jobfiles.read_file(job / "metrics-0.jsonl", below, JOB_UID)
        except BaseException as exc:
            outcome.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(30)  # a guard against a hang, never reached: the open does not wait
    assert not reader.is_alive(), "a FIFO blocked the reader"
    assert isinstance(outcome[0], jobfiles.UnsafeFile)
    assert "a FIFO" in str(outcome[0])


def test_a_hard_link_to_another_users_file_is_refused(
    folders: tuple[Path, Path], tmp_path: Path
) -> None:
    below, job = folders
    theirs = owned(tmp_path / "theirs.json", '{"message": "not yours"}', OTHER_UID)
    os.link(theirs, job / "error-0.json")
    with pytest.raises(jobfiles.UnsafeFile, match="belongs to uid"):
        jobfiles.read_file(job / "error-0.json", below, JOB_UID)


def test_a_hard_link_of_the_jobs_own_file_is_refused_too(folders: tuple[Path, Path]) -> None:
    below, job = folders
    own = owned(job / "a.json", "{}")
    os.link(own, job / "error-0.json")
    with pytest.raises(jobfiles.UnsafeFile, match="2 links"):
        jobfiles.read_file(job / "error-0.json", below, JOB_UID)


def test_a_folder_in_the_files_place_is_refused(folders: tuple[Path, Path]) -> None:
    below, job = folders
    (job / "error-0.json").mkdir()
    with pytest.raises(jobfiles.UnsafeFile, match="not a regular file"):
        jobfiles.read_file(job / "error-0.json", below, JOB_UID)


def test_a_file_of_root_in_the_jobs_folder_is_refused(folders: tuple[Path, Path]) -> None:
    below, job = folders
    owned(job / "error-0.json", '{"message": "x"}', 0)
    with pytest.raises(jobfiles.UnsafeFile, match="belongs to uid 0"):
        jobfiles.read_file(job / "error-0.json", below, JOB_UID)


def test_a_huge_sparse_file_is_read_only_up_to_the_bound(folders: tuple[Path, Path]) -> None:
    below, job = folders
    path = owned(job / "metrics-0.jsonl", "")
    with open(path, "r+b") as f:
        f.truncate(1 << 40)  # a terabyte that takes no room
    assert jobfiles.size_of(path, below, JOB_UID) == 1 << 40
    assert len(jobfiles.read_file(path, below, JOB_UID, limit=4096)) == 4096


def test_a_folder_on_the_way_that_is_a_link_is_not_followed(
    folders: tuple[Path, Path], tmp_path: Path
) -> None:
    """A job that can write its attempt's folder could swap its instance folder for a link to
    a folder of root's: no folder below the trusted one is followed."""
    below, job = folders
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    owned(elsewhere / "metrics-0.jsonl", "theirs\n")
    os.rename(job, job.with_name("moved"))
    job.symlink_to(elsewhere)
    with pytest.raises(jobfiles.UnsafeFile, match="not a folder"):
        jobfiles.read_file(job / "metrics-0.jsonl", below, JOB_UID)


def test_a_path_that_climbs_out_of_the_trusted_folder_is_refused(
    folders: tuple[Path, Path],
) -> None:
    below, _ = folders
    with pytest.raises(jobfiles.UnsafeFile, match="not under"):
        jobfiles.read_file(below.parent / "x", below, JOB_UID)
