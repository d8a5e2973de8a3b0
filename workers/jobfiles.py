"""Opening a file in a folder a job can write to, from the privileged side.

The agent, the Slurm step wrapper and the console's cleanup run as root (or the agent's user),
and a trainer may write in its own folders: it can put a symbolic link, a FIFO, a hard link,
a folder or a huge sparse file where the agent expects its metrics or error file. A plain
`open(path)` would then read any file root can (the link), block for ever (the FIFO), or
echo another user's file (a hard link). So every such file is opened here, the way
slurmstepd opens user files:

- each folder below a trusted one (the agent's work folder, the checkpoint root, a Slurm
  pool's attempt folder: folders no job can write to) is opened with O_NOFOLLOW and the next
  one from it with openat, so no folder on the way may be a link the job planted;
- the file itself with O_NOFOLLOW | O_NONBLOCK (a FIFO opens without a writer and is then
  refused; it never blocks a thread);
- it must then be a regular file, owned by the job's uid (what the job wrote, not a file of
  root's or of another user's that it hard-linked: protected_hardlinks lets a user link only
  files it owns, and the owner check holds where that sysctl is off) and with one link;
- reads are bounded by the caller.

A refusal raises UnsafeFile with the reason in words; the caller says so in the job's log and
reads nothing.

A job's folder is listed with list_tree (its artifacts, workers/artifacts.py): each entry is
looked at with lstat through its folder's descriptor, folders are opened as above, and only
what open_file would read is listed; the rest is named with the reason.

Folders a job wrote in are removed with remove_tree, which follows no link, opens no FIFO and
does not recurse however deep the job nested its folders.
"""

import errno
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# A folder below a trusted one: never through a link, never blocking (a FIFO put in its place
# fails O_DIRECTORY at once).
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_FILE_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


class UnsafeFile(Exception):
    """A file of the job's that the privileged side will not read, and why."""


def _relative_parts(path: Path, below: Path) -> tuple[Path, tuple[str, ...]]:
    """The trusted folder, resolved once (an admin may reach it through links), and the names
    from it down to `path` (which the job may control, so they are never resolved)."""
    trusted = Path(os.path.realpath(below))
    absolute = Path(os.path.abspath(path))
    if absolute.is_relative_to(trusted):
        relative = absolute.relative_to(trusted)
    elif absolute.is_relative_to(os.path.abspath(below)):
        relative = absolute.relative_to(os.path.abspath(below))
    else:
        raise UnsafeFile(f"{path} is not under {below}")
    if any(part in ("..", "") for part in relative.parts):
        raise UnsafeFile(f"{path} is not a plain path under {below}")
    return trusted, relative.parts


def open_folder(path: Path, below: Path) -> int:
    """A descriptor of the folder `path`, every folder from `below` (trusted) down to it opened
    without following a link."""
    trusted, parts = _relative_parts(path, below)
    fd = os.open(trusted, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts:
            try:
                following = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise UnsafeFile(f"{part} in {path} is not a folder (a link?)") from None
                raise
            os.close(fd)
            fd = following
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_file(path: Path, below: Path, uid: int) -> int:
    """A read-only descriptor of the job's regular file `path`, owned by `uid` and with one
    link, every folder from `below` down opened without following a link. FileNotFoundError
    when it is not there; UnsafeFile when it is there but is not such a file."""
    folder = open_folder(path.parent, below)
    try:
        try:
            fd = os.open(path.name, os.O_RDONLY | _FILE_FLAGS, dir_fd=folder)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise UnsafeFile(f"{path.name} is a symbolic link") from None
            if exc.errno in (errno.ENXIO, errno.EISDIR):
                raise UnsafeFile(f"{path.name} is not a regular file") from None
            raise
    finally:
        os.close(folder)
    try:
        _check(fd, path.name, uid)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _check(fd: int, name: str, uid: int) -> None:
    _check_stat(os.fstat(fd), name, uid)


def _check_stat(found: os.stat_result, name: str, uid: int) -> None:
    if not stat.S_ISREG(found.st_mode):
        raise UnsafeFile(f"{name} is not a regular file ({_kind(found.st_mode)})")
    if found.st_uid != uid:
        raise UnsafeFile(f"{name} belongs to uid {found.st_uid}, not the job's")
    if found.st_nlink != 1:
        raise UnsafeFile(f"{name} has {found.st_nlink} links (a hard link?)")


def _kind(mode: int) -> str:
    for test, kind in (
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a device"),
        (stat.S_ISBLK, "a device"),
    ):
        if test(mode):
            return kind
    return "not a file"


def read_file(path: Path, below: Path, uid: int, offset: int = 0, limit: int = 1 << 20) -> bytes:
    """At most `limit` bytes of the job's file `path` from `offset` (see open_file)."""
    fd = open_file(path, below, uid)
    try:
        return os.pread(fd, limit, offset)
    finally:
        os.close(fd)


def size_of(path: Path, below: Path, uid: int) -> int:
    """The size of the job's file `path` (see open_file): a sparse file counts at its length."""
    fd = open_file(path, below, uid)
    try:
        return os.fstat(fd).st_size
    finally:
        os.close(fd)


# How many folders remove_tree holds open at once: a deeper folder is moved up beside the tree
# and removed after it, so that neither descriptors nor the stack grow with the job's nesting
# (shutil.rmtree recurses: 1,500 levels made it raise RecursionError, even when told to ignore
# errors, which stopped the agent's clean-up of every later job on the node).
_MAX_OPEN_FOLDERS = 32


def hand_over_folder(path: Path, ids: tuple[int, int] | None) -> None:
    """Make the folder at `path` a job's own and nobody else's (0700), given to uid and gid
    `ids` (None: its owner stays), through a descriptor of the folder itself: never through
    a link at its name, never blocking on a FIFO put there."""
    fd = os.open(path, _DIR_FLAGS)
    try:
        if ids is not None:
            os.fchown(fd, *ids)
        os.fchmod(fd, 0o700)
    finally:
        os.close(fd)


def remove_tree(path: Path) -> bool:
    """Remove the folder `path` (a job's, or one holding a job's) and everything in it; True
    when it is gone. Nothing in it is followed: a link is removed, never its target; every
    folder is opened from its parent's descriptor with O_NOFOLLOW; a FIFO is unlinked, never
    opened; nesting of any depth costs neither recursion nor more than a few dozen
    descriptors. `path` itself must not be a link (it is then left alone). Errors on single
    entries (one removed meanwhile) do not stop the rest."""
    try:
        parent = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return not os.path.lexists(path)
    try:
        pending = [path.name]
        while pending:
            pending += _remove_folder(parent, pending.pop(), f".{path.name}.deep-")
    finally:
        os.close(parent)
    return not os.path.lexists(path)


def _remove_folder(parent: int, name: str, prefix: str) -> list[str]:
    """Remove folder `name` in `parent` depth first; the names of folders too deep to hold
    open, moved into `parent` under `prefix` for the caller to remove next."""
    moved: list[str] = []
    try:
        top = os.open(name, _DIR_FLAGS, dir_fd=parent)
    except OSError:
        return moved
    # Each level: its descriptor, its name in the level above, and its subfolders to go.
    levels: list[tuple[int, str, list[str]]] = [(top, name, _empty_but_folders(top))]
    while levels:
        fd, own_name, subfolders = levels[-1]
        if not subfolders:
            os.close(fd)
            levels.pop()
            above = levels[-1][0] if levels else parent
            try:
                os.rmdir(own_name, dir_fd=above)
            except OSError:
                pass
            continue
        sub = subfolders.pop()
        if len(levels) >= _MAX_OPEN_FOLDERS:
            aside = f"{prefix}{len(moved)}-{os.urandom(4).hex()}"
            try:
                os.rename(sub, aside, src_dir_fd=fd, dst_dir_fd=parent)
                moved.append(aside)
            except OSError:
                pass
            continue
        try:
            child = os.open(sub, _DIR_FLAGS, dir_fd=fd)
        except OSError as exc:
            if exc.errno in (errno.ENOTDIR, errno.ELOOP):  # swapped for a file or a link
                _unlink(fd, sub)
            continue
        levels.append((child, sub, _empty_but_folders(child)))
    return moved


def _empty_but_folders(fd: int) -> list[str]:
    """Unlink every entry of the open folder `fd` that is not a folder (links, FIFOs and
    sockets included, never opened); the names of its subfolders."""
    folders = []
    try:
        with os.scandir(fd) as entries:
            for entry in entries:
                try:
                    is_folder = entry.is_dir(follow_symlinks=False)
                except OSError:
                    continue
                if is_folder:
                    folders.append(entry.name)
                else:
                    _unlink(fd, entry.name)
    except OSError:
        pass
    return folders


def _unlink(fd: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=fd)
    except OSError:
        pass


@dataclass(frozen=True)
class TreeListing:
    """What list_tree found: the job's own regular files, what it would not serve and why (by
    path relative to the listed folder), and whether it stopped at its bounds."""

    files: list[tuple[str, os.stat_result]]
    refused: list[tuple[str, str]]
    truncated: bool


# (the listed folder's descriptor, an entry's name, its lstat) -> True to leave it out: asked of
# the entries at the top of the listed folder only.
LeaveOut = Callable[[int, str, os.stat_result], bool]


def list_tree(
    path: Path,
    below: Path,
    uid: int,
    max_entries: int,
    max_depth: int,
    leave_out: LeaveOut | None = None,
) -> TreeListing:
    """The regular files under the folder `path` that open_file would read (owned by `uid`,
    one link), every folder from `below` down opened without following a link, every entry
    looked at with lstat through its folder's descriptor: nothing is followed or opened but
    folders. Links, FIFOs, sockets, devices, foreign-owned and hard-linked files are refused
    with the reason. At most `max_entries` entries are looked at and `max_depth` folders
    gone into (truncated says so); a folder the job nested deeper is refused, not walked.
    FileNotFoundError when `path` is not there."""
    files: list[tuple[str, os.stat_result]] = []
    refused: list[tuple[str, str]] = []
    seen = 0
    truncated = False
    # Depth first, one descriptor per level: (descriptor, its path relative to `path`).
    levels: list[tuple[int, str]] = [(open_folder(path, below), "")]
    pending: list[list[str]] = [_names(levels[0][0])]
    try:
        while levels:
            fd, prefix = levels[-1]
            if not pending[-1]:
                os.close(fd)
                levels.pop()
                pending.pop()
                continue
            name = pending[-1].pop()
            relative = f"{prefix}{name}"
            try:
                found = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                continue  # removed meanwhile
            if not prefix and leave_out is not None and leave_out(fd, name, found):
                continue
            seen += 1
            if seen > max_entries:
                truncated = True
                break
            if stat.S_ISDIR(found.st_mode):
                if len(levels) > max_depth:
                    refused.append((relative, f"deeper than {max_depth} folders: not listed"))
                    continue
                try:
                    child = os.open(name, _DIR_FLAGS, dir_fd=fd)
                except OSError as exc:  # swapped for a link or a file meanwhile, or no access
                    refused.append((relative, f"not a folder that can be opened ({exc.strerror})"))
                    continue
                levels.append((child, f"{relative}/"))
                pending.append(_names(child))
                continue
            reason = _refusal(found, name, uid)
            if reason is None:
                files.append((relative, found))
            else:
                refused.append((relative, reason))
    finally:
        for fd, _ in levels:
            os.close(fd)
    files.sort(key=lambda item: item[0])
    refused.sort()
    return TreeListing(files, refused, truncated)


def _names(fd: int) -> list[str]:
    """The entries of the open folder `fd`, in reverse order (popped from the end: sorted)."""
    return sorted(os.listdir(fd), reverse=True)


def _refusal(found: os.stat_result, name: str, uid: int) -> str | None:
    """Why open_file would refuse a file with this lstat, or None when it would read it."""
    if stat.S_ISLNK(found.st_mode):
        return f"{name} is a symbolic link"
    try:
        _check_stat(found, name, uid)
    except UnsafeFile as exc:
        return str(exc)
    return None
