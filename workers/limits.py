"""What an instance may use on its node, taken from its package, and the reasons an instance
that reached a limit ends with: the supervisor's side of workers/cgroups.py, plus the disk limit
(which no cgroup holds: the agent measures the job's folders and stops it past the limit).

The reasons name the limit, the use and the package, so the failure banner says what happened
and what to change ("out of memory: used 2.0 of 2 GB (package cpu-1)"), never a bare SIGKILL.
"""

import os
import signal
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

from workers import cgroups, jobenv
from workers.spec import ReplicaSpec

GB = 1 << 30
# The trainers' OOM score, above the agent's (lowered by the agent at its start and inherited
# by its keepers): where a node runs out of memory outside any cgroup, a trainer goes first.
TRAINER_OOM_SCORE = 0
# A job past this share of its disk limit gets one warning line in its log.
DISK_WARN_SHARE = 0.9
# How often a running instance's counters are read and its folders measured against its disk
# limit: a walk of the job's folders is not free, and a job can write only so fast between two.
LIMITS_CHECK_SECONDS = 5.0
DU_TIMEOUT_SECONDS = 120
FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def request_for(spec: ReplicaSpec, gpu_devices: list[str]) -> cgroups.Request:
    """The limits of the spec's package; `gpu_devices`: the device nodes the sandbox binds."""
    devices = []
    for path in gpu_devices:
        try:
            found = os.stat(path)
        except OSError:
            continue  # the sandbox binds only those that exist, and so do we
        if stat.S_ISCHR(found.st_mode):
            devices.append((os.major(found.st_rdev), os.minor(found.st_rdev)))
    return cgroups.Request(
        memory_bytes=round(spec.memory_gb * GB),
        cpus=float(spec.cpus),
        max_processes=spec.max_processes,
        devices=tuple(devices),
    )


def share_of(request: cgroups.Request, processes: int) -> cgroups.Request:
    """One of `processes` equal shares of an instance's limits (a container per process)."""
    return cgroups.Request(
        memory_bytes=request.memory_bytes // processes,
        cpus=request.cpus / processes,
        max_processes=max(1, request.max_processes // processes) if request.max_processes else 0,
    )


def cores_of_process(
    cores: list[int] | tuple[int, ...], index: int, processes: int
) -> tuple[int, ...]:
    """The cores of process `index` of an instance's `processes` (a container each): an equal
    slice of the instance's, where there are at least as many cores as processes (8 processes
    on 96 cores get 12 each, none shared); all of them where there are fewer (they share)."""
    if processes <= 1 or len(cores) < processes:
        return tuple(cores)
    start, end = index * len(cores) // processes, (index + 1) * len(cores) // processes
    return tuple(cores[start:end])


def _package(spec: ReplicaSpec) -> str:
    return f" (package {spec.package})" if spec.package else ""


def _gb(size: float) -> str:
    return f"{size / GB:.1f}"


def _limit_gb(value: float) -> str:
    return f"{value:g}"


def end_reason(spec: ReplicaSpec, usage: cgroups.Usage) -> str | None:
    """What limit ended a failed instance, from its cgroup's counters; None: none did."""
    if usage.oom_kills and spec.memory_gb:
        return (
            f"out of memory: used {_gb(usage.memory_peak_bytes)} of "
            f"{_limit_gb(spec.memory_gb)} GB{_package(spec)}"
        )
    if usage.process_limit_hits and spec.max_processes:
        return process_limit_note(spec)
    return None


def process_limit_note(spec: ReplicaSpec) -> str:
    return f"process limit of {spec.max_processes} reached{_package(spec)}"


def killed_by_the_kernel(exit_code: int | None) -> bool:
    return exit_code == -signal.SIGKILL


@dataclass(frozen=True)
class DiskUse:
    used_bytes: int
    limit_bytes: int

    @property
    def over(self) -> bool:
        return self.used_bytes > self.limit_bytes

    @property
    def near(self) -> bool:
        return self.used_bytes >= self.limit_bytes * DISK_WARN_SHARE


def disk_use(folders: list[Path], limit_gb: float, uid: int) -> DiskUse | None:
    """What the job's folders on this node hold, against the limit; None when it cannot be
    measured. Measured by coreutils' du as the job's own uid (a root agent drops to it first):
    what the job planted in its folders (links, FIFOs, a nesting thousands deep) is never
    followed or opened with the agent's rights. The agent opens each folder (O_NOFOLLOW: its
    parents are the agent's) and du reads it through that descriptor, so the folders above,
    which the job's uid may not enter, need not be. du counts blocks on disk (a sparse file at
    what it holds), each inode once (hard links), and stays on each folder's file system."""
    fds: list[int] = []
    try:
        for folder in folders:
            try:
                fds.append(os.open(folder, FOLDER_FLAGS))
            except OSError:
                continue  # not made yet (no checkpoint so far)
        if not fds:
            return DiskUse(0, round(limit_gb * GB))
        argv = ["du", "--summarize", "--total", "--block-size=1", "--one-file-system", "-P", "--"]
        argv += [f"/proc/self/fd/{fd}/." for fd in fds]
        if os.geteuid() == 0 and uid != 0:
            argv = [
                "setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", *argv,
            ]  # fmt: skip
        done = subprocess.run(
            argv,
            env=jobenv.privileged_env(),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=DU_TIMEOUT_SECONDS,
            check=False,
            pass_fds=fds,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    finally:
        for fd in fds:
            os.close(fd)
    # du says on stderr what it could not read and counts the rest; its last line is the total.
    lines = done.stdout.decode(errors="replace").strip().splitlines()
    total = lines[-1].split("\t", 1)[0] if lines else ""
    if not total.isdigit():
        return None
    return DiskUse(int(total), round(limit_gb * GB))


def _size(size: int) -> str:
    return f"{size / GB:.1f} GB" if size >= GB else f"{size / (1 << 20):.0f} MB"


def unlinked_bytes(pids: list[int]) -> int:
    """Disk held by files the processes keep open after removing them: du counts names, and a
    file written, removed and held open has none, yet fills the disk all the same. Read with
    stat through /proc/PID/fd (no file is opened); each inode counted once."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue  # ended meanwhile
        for fd in fds:
            try:
                found = os.stat(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            key = (found.st_dev, found.st_ino)
            if stat.S_ISREG(found.st_mode) and found.st_nlink == 0 and key not in seen:
                seen.add(key)
                total += found.st_blocks * 512
    return total


def disk_warning(spec: ReplicaSpec, use: DiskUse) -> str:
    return (
        f"disk: the job's folders on this node hold {_size(use.used_bytes)} of its "
        f"{_size(use.limit_bytes)} limit{_package(spec)}; past it the job is stopped"
    )


def disk_reason(spec: ReplicaSpec, use: DiskUse) -> str:
    return (
        f"disk limit reached: the job's working folder, checkpoints and instance folders "
        f"hold {_size(use.used_bytes)} of {_size(use.limit_bytes)}{_package(spec)}"
    )
