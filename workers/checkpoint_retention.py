"""Checkpoint retention: of what a job's trainers saved in its checkpoint folder, the agent keeps
the newest `--keep-checkpoints` (TRAINYARD_AGENT_KEEP_CHECKPOINTS; 0, the default: all) once the
job no longer runs on its node, as Determined keeps a trial's latest checkpoints.

A checkpoint is an entry at the top of the folder (a file such as `epoch-7.pt`, or a folder that
a framework writes per step); the newest by modification time stay. Hidden entries (the
platform's marker, a writer's temporaries) and `*.tmp` files (a save in progress) are never
counted or removed. Every node's agent may prune the same shared folder: removing what another
agent removed already is not an error. A deleted job's whole folder goes when the console asks
(jobs/services/deletion.py, remove_folder).
"""

import logging
import re
from pathlib import Path

from workers import jobfiles

log = logging.getLogger(__name__)

# A job's checkpoint key (jobs.models.new_checkpoint_key): it names a folder, so nothing else.
_KEY = re.compile(r"[0-9a-f]{1,32}")

KEEP_ENV = "TRAINYARD_AGENT_KEEP_CHECKPOINTS"
DEFAULT_KEEP = 0  # all: a checkpoint is the user's work, removed only where an admin says so


def _counts(entry: Path) -> bool:
    return not entry.name.startswith(".") and not entry.name.endswith(".tmp")


def old_checkpoints(folder: Path, keep: int) -> list[Path]:
    """The checkpoints beyond the newest `keep`, oldest first; none when `keep` is 0."""
    if keep <= 0 or not folder.is_dir():
        return []
    dated = []
    for entry in folder.iterdir():
        if _counts(entry):
            try:
                dated.append((entry.lstat().st_mtime, entry.name, entry))
            except FileNotFoundError:
                continue  # removed meanwhile, by another node's agent
    dated.sort()
    return [entry for _, _, entry in dated[: max(0, len(dated) - keep)]]


def prune(folder: Path, keep: int) -> list[str]:
    """Remove the checkpoints beyond the newest `keep`; the names removed."""
    removed = []
    for entry in old_checkpoints(folder, keep):
        try:
            if entry.is_dir() and not entry.is_symlink():
                if not jobfiles.remove_tree(entry):
                    log.warning("cannot remove old checkpoint %s whole", entry)
                    continue
            else:
                entry.unlink()
        except FileNotFoundError:
            continue
        except OSError as exc:
            log.warning("cannot remove old checkpoint %s: %s", entry, exc)
            continue
        removed.append(entry.name)
    if removed:
        log.info("removed old checkpoints of %s: %s", folder.name, ", ".join(removed))
    return removed


def is_key(checkpoint_key: str) -> bool:
    return bool(_KEY.fullmatch(checkpoint_key))


def remove_folder(folder: Path) -> bool:
    """Remove a deleted job's whole checkpoint folder; False when there was none."""
    if not folder.is_dir() or folder.is_symlink():
        return False
    jobfiles.remove_tree(folder)
    log.info("removed the checkpoints of deleted job folder %s", folder.name)
    return not folder.exists()
