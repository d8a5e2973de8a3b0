"""Run a program with this machine's cgroup file systems mounted again, inside a "host" of
stack/netns.py.

    python -I -S nscgroups.py -- PROGRAM [ARG...]

`ip netns exec` gives what it runs a mount namespace of its own with a fresh /sys, in which
/sys/fs/cgroup is empty: a node agent there would find no cgroup to hold its instances in
(workers/cgroups.py) and say its limits are not enforced. This mounts, at the same places, the
cgroup hierarchies the machine's first process sees (/proc/1/mountinfo: the same hierarchies,
so the groups an agent makes are the machine's), then becomes the program with exec. The mounts
stay in that mount namespace, which `ip netns exec` made a slave of the machine's: nothing here
reaches the machine's own. Standard library only; run as root, as `ip netns exec` is.
"""

import ctypes
import os
import sys

MS_NOSUID, MS_NODEV, MS_NOEXEC = 2, 4, 8
CGROUP_ROOT = "/sys/fs/cgroup"


def _mount(source: str, target: str, fstype: str, data: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
    if libc.mount(source.encode(), target.encode(), fstype.encode(), flags, data.encode()) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"mount {fstype} at {target}: {os.strerror(errno)}")


def cgroup_mounts(mountinfo: str) -> list[tuple[str, str, str]]:
    """(mount point, file system type, options) of each cgroup mount below CGROUP_ROOT."""
    found = []
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 3 or tail[0] not in ("cgroup", "cgroup2"):
            continue
        if fields[3] == "/" and fields[4].startswith(CGROUP_ROOT + "/"):
            options = [o for o in tail[2].split(",") if o not in ("rw", "ro")]
            found.append((fields[4], tail[0], ",".join(options)))
    return found


def main(args: list[str]) -> int:
    if len(args) < 2 or args[0] != "--":
        print("usage: nscgroups.py -- PROGRAM [ARG...]", file=sys.stderr)
        return 2
    with open("/proc/1/mountinfo") as source:
        mounts = cgroup_mounts(source.read())
    if mounts and not os.listdir(CGROUP_ROOT):
        _mount("tmpfs", CGROUP_ROOT, "tmpfs", "mode=755")
        for point, fstype, options in mounts:
            os.makedirs(point, exist_ok=True)
            _mount(fstype, point, fstype, options)
    os.execvp(args[1], args[1:])  # noqa: S606 (an argv list, never a shell)
    return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
