"""What the agent removes in a job's folders (ended jobs' scratch folders, old checkpoints, a
deleted job's checkpoint and working folders) goes alone: a link, FIFO, hard link, folder,
sparse file or 1,500 nested folders that the job left there never make it remove, read or
block on anything else, or fail.
(tests/integration/test_hostile_files.py does the same through a real job and deletion.)"""

import os
import threading
from pathlib import Path

import pytest

from workers import checkpoint_retention, jobfolders, workfolder


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A root-only folder with a file in it: what a planted link points to."""
    folder = tmp_path / "root-only"
    folder.mkdir(mode=0o700)
    (folder / "secret").write_text("root's own\n")
    return folder


DEPTH = 1500  # past the interpreter's recursion limit: shutil.rmtree raised RecursionError


def nest(folder: Path, depth: int = DEPTH) -> None:
    """`depth` folders, one in the other, made from descriptors (a path that long is refused)."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            deeper = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = deeper
        os.symlink("/", "link-to-root", dir_fd=fd)
    finally:
        os.close(fd)


def plant_everything(folder: Path, outside: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "link-to-file").symlink_to(outside / "secret")
    (folder / "link-to-folder").symlink_to(outside)
    os.mkfifo(folder / "fifo")
    own = folder / "own"
    own.write_text("mine\n")
    os.link(own, folder / "hard-link")
    nested = folder / "nested"
    nested.mkdir()
    (nested / "link-to-folder").symlink_to(outside)
    with open(folder / "sparse", "wb") as f:
        f.truncate(1 << 40)
    (folder / "deep").mkdir()
    nest(folder / "deep")


def assert_untouched(outside: Path) -> None:
    assert sorted(p.name for p in outside.iterdir()) == ["secret"]
    assert (outside / "secret").read_text() == "root's own\n"


def in_a_thread(work: object) -> None:
    """Run `work`; fail, rather than hang, if a FIFO held it."""
    runner = threading.Thread(target=work, daemon=True)  # type: ignore[arg-type]
    runner.start()
    runner.join(60)  # a guard against a hang, never reached
    assert not runner.is_alive(), "the removal blocked"


def test_an_ended_jobs_scratch_folder_goes_alone(tmp_path: Path, outside: Path) -> None:
    jobs = tmp_path / "jobs"
    plant_everything(jobs / "7" / "attempt-0" / "master", outside)
    in_a_thread(lambda: jobfolders.remove_ended(jobs, 0, lambda: set(), threading.Lock()))
    assert not (jobs / "7").exists()
    assert_untouched(outside)


def test_old_checkpoints_go_alone(tmp_path: Path, outside: Path) -> None:
    folder = tmp_path / "job-7-abc"
    plant_everything(folder, outside)
    removed: list[str] = []
    in_a_thread(lambda: removed.extend(checkpoint_retention.prune(folder, keep=1)))
    assert len(removed) >= 6
    assert_untouched(outside)


@pytest.mark.parametrize("remove", [checkpoint_retention.remove_folder, workfolder.remove])
def test_a_deleted_jobs_folders_go_alone(tmp_path: Path, outside: Path, remove: object) -> None:
    folder = tmp_path / "job-7-abc"
    plant_everything(folder, outside)
    in_a_thread(lambda: remove(folder))  # type: ignore[operator]
    assert not folder.exists()
    assert_untouched(outside)


def test_a_folder_that_is_itself_a_link_is_not_removed_through(
    tmp_path: Path, outside: Path
) -> None:
    (tmp_path / "job-7-abc").symlink_to(outside)
    assert not checkpoint_retention.remove_folder(tmp_path / "job-7-abc")
    assert not workfolder.remove(tmp_path / "job-7-abc")
    assert_untouched(outside)
