"""Whether the agent's work disk is full, in words the console and a job's owner can act on.

"node-2: no space left on /var/lib/trainyard-agent"

The work folder holds the log spool, jobs' folders, unpacked code and the process records: an
agent whose disk is full can start nothing (the start would fail half way) and says so in its
heartbeat, so the console sends new work elsewhere. Full means no more free than a small margin:
the spool and the process records must still fit a few writes.
"""

import errno
import os
from pathlib import Path

MIN_FREE_ENV = "TRAINYARD_AGENT_MIN_FREE_MB"
DEFAULT_MIN_FREE_MB = 64
# Errors that mean "no room": out of blocks, and out of the user's quota of them.
NO_ROOM_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def is_no_room(exc: BaseException | None) -> bool:
    """Whether `exc`, or an exception it was raised from, is a full disk (or quota)."""
    seen = 0
    while exc is not None and seen < 20:
        if isinstance(exc, OSError) and exc.errno in NO_ROOM_ERRNOS:
            return True
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return False


class DiskWatch:
    """The free space of the file system that holds `path`, as the node's agent sees it."""

    def __init__(self, node: str, path: Path, min_free_bytes: int) -> None:
        self.node = node
        self.path = path
        self.min_free_bytes = min_free_bytes

    @property
    def reason(self) -> str:
        return f"{self.node}: no space left on {self.path}"

    def free_bytes(self) -> int:
        st = os.statvfs(self.path)
        # f_bavail: what an unprivileged writer gets; a root agent could dip into the reserve,
        # but its trainers (another uid) could not.
        return st.f_bavail * st.f_frsize

    def full_reason(self) -> str | None:
        """The reason when the disk is full, None while there is room. Asked afresh each time
        (one statvfs): space that someone frees counts at once."""
        try:
            free = self.free_bytes()
        except OSError as exc:
            return f"{self.node}: cannot read the free space of {self.path}: {exc.strerror}"
        return None if free > self.min_free_bytes else self.reason
