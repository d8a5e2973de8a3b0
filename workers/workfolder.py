"""A job's working folder: where every trainer of the job starts, the same folder for all its
instances and all its attempts, on the shared checkpoint root
(`<checkpoint root>/workdirs/job-<id>-<key>/`).

Most scripts save where they stand (`torch.save(..., "snapshot.pt")`, as pytorch/examples'
ddp-tutorial-series does) and look there when they start again. A folder per node would let
only the instance that comes back on the same node resume; one folder on the root that every
node already shares lets each instance of each attempt find what any of them saved.

How the code and the folder meet (option (b) of issue 25, the folder as the working directory
and the code on the path), and why not a read-only copy under a writable overlay: an overlay's
upper layer may not be on NFS or most cloud file stores (the very file systems that the
checkpoint root is), overlayfs forbids two mounts sharing one upper layer (two nodes of one
job would), and nodes without the sandbox or with containers could not mount one at all. So:
- the job's code snapshot is unpacked once per job into the folder's `.code/` (bound read-only
  in the sandbox), and the script runs by that absolute path: Python puts the script's own
  folder first on `sys.path` (sibling imports work) and `__file__` names the code, the same
  path on every node;
- each top-level entry of the code is linked into the folder by a relative link
  (`data.csv -> .code/data.csv`), so what a script opens relative to where it stands, as when
  it ran in its project's folder, is still there on every node; what the job writes under a
  new name lands in the folder itself, shared. A name the job itself wrote first is never
  replaced by a link;
- a script under the code root (a shared file system) is linked the same way, by absolute
  links into the root.

Removed with the job's checkpoints when the job is deleted (jobs/services/deletion.py), and at
the end of its retention (jobs/services/retention.py); never by checkpoint pruning.
"""

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from workers import jobfiles

log = logging.getLogger(__name__)

# Under the checkpoint root: a folder of their own, so that no job's folder and no checkpoint
# pruning ever meets them.
WORKDIRS = "workdirs"
# The job's code inside its working folder; a hidden name, so `ls` in a script shows its files.
CODE_DIR = ".code"
STAGING_PREFIX = ".code-staging-"
# Names never linked into the folder: the code's own folder, the platform's markers.
_NEVER_LINKED = (CODE_DIR, ".trainyard")


class WorkFolderError(ValueError):
    """The working folder is not as the agent left it; the message says why."""


def folder_name(job_id: int, checkpoint_key: str) -> str:
    """The same name as the job's checkpoint folder (job-<id>-<key>), under WORKDIRS."""
    return f"job-{job_id}-{checkpoint_key}" if checkpoint_key else f"job-{job_id}"


def folder_of(checkpoint_root: Path, job_id: int, checkpoint_key: str) -> Path:
    return checkpoint_root / WORKDIRS / folder_name(job_id, checkpoint_key)


def install_code(work: Path, unpack: Callable[[Path], None]) -> Path:
    """The job's code at `work/.code`, unpacked once for the whole job by whichever node comes
    first: into a staging folder of its own, then renamed, so that no trainer ever sees half of
    it and two nodes starting at once keep one copy. `unpack` fills the folder it is given
    (which does not exist yet)."""
    code = work / CODE_DIR
    if code.is_symlink():
        # The job owns its folder: a link there would have the agent bind whatever it names
        # into the job's next sandbox. (In the sandbox `.code` is a mount: it cannot be moved.)
        raise WorkFolderError(
            f"{code} is a link, not the job's code: remove the job's working folder"
        )
    if code.is_dir():
        return code
    # Staged beside the working folder, not in it: the job's trainers on another node may
    # already write there, and could put a link in place of a staging folder while it is
    # filled (as root). The folder of working folders is the agents' alone.
    staging = work.with_name(f"{STAGING_PREFIX}{work.name}-{os.getpid()}-{time.time_ns()}")
    try:
        unpack(staging)
        staging.chmod(0o755)  # the trainers run as the job's user, not the agent's
        try:
            staging.rename(code)
        except OSError:
            if not code.is_dir():
                raise
            # Another node renamed its copy in first: the same files, by their hash.
    finally:
        jobfiles.remove_tree(staging)
    return code


def link_entries(work: Path, code: Path, relative: bool) -> list[str]:
    """Link each top-level entry of `code` into `work` where that name is free; the names
    linked now. Links are relative (`.code/x`) for the job's own copy, the same on every node,
    or absolute into a shared code root."""
    linked = []
    for entry in sorted(code.iterdir()):
        name = entry.name
        if name.startswith(_NEVER_LINKED):
            continue
        link = work / name
        target = Path(CODE_DIR) / name if relative else entry
        try:
            os.symlink(target, link)
        except FileExistsError:
            continue  # the job's own file, or a link an earlier start (or node) made
        linked.append(name)
    return linked


def remove(folder: Path) -> bool:
    """Remove a deleted or expired job's working folder; False when there was none."""
    if not folder.is_dir() or folder.is_symlink():
        return False
    jobfiles.remove_tree(folder)
    log.info("removed the working folder %s", folder.name)
    return not folder.exists()
