"""The agent's per-job folders (`<workdir>/jobs/<job id>/`: each instance's scratch folder and
its temporary files), removed once the job no longer runs on this node, keeping the last few
for inspection (`--keep-job-folders`, TRAINYARD_AGENT_KEEP_JOB_FOLDERS).

Checkpoints and the job's working folder with its code are not here (they live under the
shared checkpoint root, workers/workfolder.py) and are never touched.
A folder is first renamed out of the way, under the supervisor's lock, so that a replica of the
same job starting right then makes a fresh folder instead of losing files to the removal.
"""

import logging
import os
import time
from collections.abc import Callable, Collection
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from workers import jobfiles

log = logging.getLogger(__name__)

KEEP_ENV = "TRAINYARD_AGENT_KEEP_JOB_FOLDERS"
DEFAULT_KEEP = 20
# Folders renamed for removal; a crash halfway leaves them to the next pass.
TRASH_PREFIX = ".removing-"


def _last_used(folder: Path) -> float:
    """The latest change to the folder or its attempts' folders (a new attempt adds one)."""
    times = [folder.stat().st_mtime]
    with os.scandir(folder) as entries:
        times += [e.stat(follow_symlinks=False).st_mtime for e in entries]
    return max(times)


def ended_job_folders(jobs_dir: Path, busy: Collection[int], keep: int) -> list[Path]:
    """The job folders to remove: those of jobs not in `busy` (running here), beyond the
    `keep` most recently used. Oldest first."""
    if not jobs_dir.is_dir():
        return []
    idle = []
    for entry in jobs_dir.iterdir():
        if entry.name.isdigit() and int(entry.name) not in busy and entry.is_dir():
            try:
                idle.append((_last_used(entry), entry))
            except FileNotFoundError:
                continue  # removed meanwhile
    idle.sort(key=lambda pair: (pair[0], pair[1].name))
    return [path for _, path in idle[: max(0, len(idle) - keep)]]


def remove_ended(
    jobs_dir: Path,
    keep: int,
    busy_jobs: Callable[[], Collection[int]],
    lock: AbstractContextManager[Any],
) -> list[str]:
    """Remove the folders of jobs that ended here, but the last `keep`; the job ids removed.

    `busy_jobs` answers, under `lock` (the supervisor's, which it holds while it adds a
    replica), which jobs have a replica here; the folders are renamed under that lock and
    deleted after it."""
    with lock:
        doomed = ended_job_folders(jobs_dir, busy_jobs(), keep)
        moved = []
        for folder in doomed:
            trash = folder.with_name(f"{TRASH_PREFIX}{folder.name}-{time.time_ns()}")
            try:
                folder.rename(trash)
            except OSError as exc:
                log.warning("cannot remove the folder of job %s: %s", folder.name, exc)
                continue
            moved.append((folder.name, trash))
    for _, trash in moved:
        jobfiles.remove_tree(trash)
    for leftover in jobs_dir.glob(f"{TRASH_PREFIX}*"):  # an earlier pass cut short
        jobfiles.remove_tree(leftover)
    if moved:
        log.info("removed the folders of ended jobs %s", ", ".join(name for name, _ in moved))
    return [name for name, _ in moved]
