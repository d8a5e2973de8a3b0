"""Folders a job names by path (the data it reads, the folder its results go to), checked before
they are bound into its sandbox or containers.

A job reaches such a folder only as its owner's own Unix identity may (workers/unixids.py):
- the node asks the kernel, as that identity: `test -d -r -x [-w]` run under setpriv with their
  uid, gid and groups, so the answer is the one the person gets at a login node, ACLs and a
  root-squashing NFS included. The console checks again at submission by the mode bits (it may
  not be root; ACLs are not read there), so a refusal comes at once where it can;
- every folder above the resolved folder must be root's alone: owned by root and writable by
  nobody else, or sticky with a root-owned entry below it (as sshd's StrictModes asks of a key's
  folders). The sandbox binds the folder by its path a moment after this check, as root: a
  folder above it that someone else could write would let them swap the folder for a link to
  another between the check and the bind;
- none of the agent's own folders (its work folder, the checkpoint root) may be the folder,
  lie inside it or hold it.
The lookups run as this process (root, on a node); what they find is said only once the
person is known to reach the folder: a folder that is not there, is no folder or is closed to
them gets the same words, so a refusal tells nobody what lies in folders closed to them.
Nothing here runs through a shell; the probe's argv names the resolved path.
"""

import os
import shutil
import stat
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from workers.unixids import JobUser

MAX_PATH_LENGTH = 4096
MAX_FOLDERS = 16
PROBE_TIMEOUT_SECONDS = 30
READ_AND_ENTER = 0o5
# What a check answers where the person may not have the folder (the caller says it in words
# that do not tell that apart from a folder that is not there).
_MAY_NOT = "may not"
WRITE_AND_ENTER = 0o3


class FolderRefused(ValueError):
    """The job may not have this folder; the message says why."""


@dataclass(frozen=True)
class NamedFolder:
    path: str  # as the job named it: where its trainers find it
    real: Path  # resolved on this host: what is bound there
    writable: bool


def requests(data: Iterable[str], results: str) -> list[tuple[str, bool]]:
    """The folders a job names, each with whether it is written: its data folders, then its
    results folder ("": none)."""
    return [*((path, False) for path in data), *([(results, True)] if results else [])]


def shape_problem(path: str) -> str | None:
    """What is wrong with a folder's name on its own (any host), or None."""
    if not path.startswith("/"):
        return f"{path!r} is not an absolute path"
    if len(path) > MAX_PATH_LENGTH:
        return f"the path is {len(path)} characters long; at most {MAX_PATH_LENGTH}"
    if path == "/":
        return "the whole file system is not a folder a job may name"
    if os.path.normpath(path) != path or path.startswith("//"):
        return f"{path!r} is not in its plain form ({os.path.normpath(path)!r}: no '..', '.', '//')"
    return None


def check(
    path: str,
    user: JobUser,
    writable: bool,
    guarded: Iterable[Path] = (),
    as_kernel: bool | None = None,
) -> NamedFolder:
    """The folder `path` names, resolved here, if `user` may read it (and write it, where
    `writable`). `as_kernel`: ask the kernel as `user` (None: where this process is root).
    Raises FolderRefused."""
    problem = shape_problem(path)
    if problem is not None:
        raise FolderRefused(problem)
    # Looked up as this process (root, on a node), but nothing of what it finds is said before
    # the person is known to reach the folder: "does not exist" against "may not read it" would
    # tell them what lies in folders closed to them.
    unreachable = FolderRefused(
        f"{path}: {user.describe()} may not {'write' if writable else 'read'} it, or it is no "
        "folder here"
    )
    try:
        real = Path(os.path.realpath(path, strict=True))
        found = os.stat(real)
    except OSError:
        raise unreachable from None
    if not stat.S_ISDIR(found.st_mode):
        raise unreachable
    if as_kernel is None:
        as_kernel = os.geteuid() == 0
    refusal = (
        _kernel_refusal(real, user, writable) if as_kernel else _mode_refusal(real, user, writable)
    )
    if refusal == _MAY_NOT:
        raise unreachable
    if refusal is not None:
        raise FolderRefused(f"{path}: {refusal}")
    for own in guarded:
        own = Path(os.path.realpath(own))
        if own == real or own.is_relative_to(real) or real.is_relative_to(own):
            raise FolderRefused(f"{path} is or holds a folder of Trainyard's own")
    _check_folders_above(path, real)
    return NamedFolder(path, real, writable)


def may_look_where(path: str, user: JobUser) -> bool:
    """Whether `user` may enter the nearest folder above `path` that exists here (by the
    permission bits): where they may, that `path` is not there is theirs to know; where they
    may not, a refusal must not tell it apart from a folder closed to them."""
    above = Path(path).parent
    while not os.path.lexists(above):
        above = above.parent
    try:
        real = Path(os.path.realpath(above, strict=True))
        return all(_allows(os.stat(f), user, 0o1) for f in (*reversed(real.parents), real))
    except OSError:
        return False


def _check_folders_above(path: str, real: Path) -> None:
    for above in [*reversed(real.parents)]:
        child = real.parts[: len(above.parts) + 1]
        below = Path(*child)
        up = os.stat(above)
        if _others_may_replace(up, os.lstat(below)):
            raise FolderRefused(
                f"{path}: {above} can be written by {_writers(up)} (mode "
                f"{stat.S_IMODE(up.st_mode):04o}), so {below} could be swapped for a link "
                "elsewhere between this check and the bind: the folders above a data or results "
                "folder must be root's alone"
            )


def _others_may_replace(above: os.stat_result, below: os.stat_result) -> bool:
    """Whether someone other than root could rename or remove `below` from `above`."""
    if above.st_uid != 0:
        return True  # its owner may always chmod it writable
    if not above.st_mode & 0o022:
        return False
    # Sticky (/tmp): only the owner of an entry (or of the folder, root) may move it.
    return not (above.st_mode & stat.S_ISVTX and below.st_uid == 0)


def _writers(found: os.stat_result) -> str:
    if found.st_uid != 0:
        return f"its owner, uid {found.st_uid}"
    if found.st_mode & 0o002:
        return "everyone"
    return f"group {found.st_gid}"


def _kernel_refusal(real: Path, user: JobUser, writable: bool) -> str | None:
    """Ask the kernel as `user` (this process must be root): None where it may."""
    setpriv, test = shutil.which("setpriv"), shutil.which("test", path="/usr/bin:/bin")
    if setpriv is None or test is None:
        return "setpriv (util-linux) or test (coreutils) is missing here, so it cannot be checked"
    want = ["-d", str(real), "-a", "-r", str(real), "-a", "-x", str(real)]
    if writable:
        want += ["-a", "-w", str(real)]
    argv = [
        setpriv, *user.setpriv_options(),
        "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", test, *want,
    ]  # fmt: skip
    try:
        done = subprocess.run(
            argv, env={"PATH": "/usr/bin:/bin"}, capture_output=True, timeout=PROBE_TIMEOUT_SECONDS
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"could not be checked as {user.describe()}: {exc}"
    if done.returncode == 0:
        return None
    if done.returncode == 1:
        return _MAY_NOT
    said = done.stderr.decode(errors="replace").strip() or f"exit code {done.returncode}"
    return f"could not be checked as {user.describe()}: {said}"


def _mode_refusal(real: Path, user: JobUser, writable: bool) -> str | None:
    """The permission bits' answer for `user` (ACLs unread): None where it may."""
    for above in reversed(real.parents):
        if not _allows(os.stat(above), user, 0o1):
            return _MAY_NOT
    wanted = READ_AND_ENTER | (WRITE_AND_ENTER if writable else 0)
    if not _allows(os.stat(real), user, wanted):
        return _MAY_NOT
    return None


def _allows(found: os.stat_result, user: JobUser, wanted: int) -> bool:
    mode = found.st_mode
    if found.st_uid == user.uid:
        bits = mode >> 6
    elif found.st_gid == user.gid or found.st_gid in user.groups:
        bits = mode >> 3
    else:
        bits = mode
    return bits & wanted == wanted
