"""Who a trainer is on its node: its owner's own Unix identity, or a uid of Trainyard's own.

A console user with a Unix identity (from the organisation's directory, posixAccount and
posixGroup, or set by an admin) has their trainers run as it: their uid, their primary gid and
their supplementary groups, as at a login node, so that the file system's permissions decide
what a job may read and write, and what it writes is theirs. Where the console knows no
identity, a sandboxing node gives the trainers a uid of Trainyard's own (uid_base + the user's
id), which owns nothing outside Trainyard.

Never root nor a system account: a uid below the host's UID_MIN (login.defs) is refused on the
console and, again, by every node, whatever the directory or an admin said.
"""

import re
from dataclasses import dataclass
from pathlib import Path

LOGIN_DEFS = Path("/etc/login.defs")
DEFAULT_UID_MIN = 1000


def uid_min(login_defs: Path = LOGIN_DEFS) -> int:
    """The lowest uid of a person's account on this host (login.defs' UID_MIN)."""
    try:
        text = login_defs.read_text()
    except OSError:
        return DEFAULT_UID_MIN
    found = re.search(r"^\s*UID_MIN\s+(\d+)", text, re.MULTILINE)
    return int(found.group(1)) if found else DEFAULT_UID_MIN


def system_account_refusal(uid: int, lowest: int, whose: str) -> str | None:
    """Why `uid` never runs a job (root, a system account), or None when it may."""
    if uid >= lowest:
        return None
    return (
        f"the Unix identity of {whose} has uid {uid}: root and system accounts (uid below "
        f"{lowest}) never run jobs"
    )


@dataclass(frozen=True)
class JobUser:
    """The identity a job's trainers run as on a node that gives them one."""

    uid: int
    gid: int
    # Supplementary groups, the primary one among them (as initgroups makes them at login).
    groups: tuple[int, ...] = ()
    # Their own identity (True), or a uid of Trainyard's own, which owns nothing outside it.
    own: bool = False

    @property
    def ids(self) -> tuple[int, int]:
        return self.uid, self.gid

    def setpriv_options(self) -> list[str]:
        """setpriv's options that make a process this user: uid, gid and exactly these groups
        (none of root's left behind)."""
        groups = ",".join(str(g) for g in self.groups)
        return [
            f"--reuid={self.uid}",
            f"--regid={self.gid}",
            f"--groups={groups}" if groups else "--clear-groups",
        ]

    def describe(self) -> str:
        if not self.own:
            return f"uid {self.uid} (Trainyard's own: no Unix identity is known for the owner)"
        extra = [g for g in self.groups if g != self.gid]
        groups = f", groups {','.join(str(g) for g in extra)}" if extra else ""
        return f"uid {self.uid}, gid {self.gid}{groups} (the owner's own)"


def own_user(uid: int, gid: int, groups: tuple[int, ...] | list[int] = ()) -> JobUser:
    """A person's own identity: their groups with the primary one first, each once."""
    return JobUser(uid, gid, tuple(dict.fromkeys([gid, *groups])), own=True)


def synthetic_user(uid_base: int, owner: int) -> JobUser:
    """The uid of Trainyard's own a sandbox gives a console user with no Unix identity."""
    uid = uid_base + owner
    return JobUser(uid, uid, (), own=False)
