"""On-disk records of the process groups an agent started, and how to kill one safely.

The supervisor writes one small JSON file per trainer process right after starting it, in
`<workdir>/procs/`, and deletes it once the process's whole group has stopped. Whatever is left
there belongs to an agent that died: its guardian (workers/guardian.py), or the next agent on the
same work dir, reaps it, unless the group's keeper (workers/keeper.py) still runs: the keeper
holds it for the next agent, and stops it itself if none comes within its grace.

Every trainer leads its own process group (the supervisor starts it in a new session), so
killing the group also kills the children it started. A child that calls setsid leaves the
group and escapes this; nothing short of a cgroup would catch it.

Killing a process group by a number read from a file is only safe while that number still
means our group, so `reap` checks first (see `still_ours`). This module is imported by the
guardian: it must stay light (the standard library and psutil only).
"""

import json
import logging
import os
import re
import signal
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from workers.contract import tag_of

log = logging.getLogger(__name__)

# How long `reap` waits for a killed group to disappear before it gives up (the record stays,
# for the next try).
REAP_WAIT_SECONDS = 5.0
POLL_SECONDS = 0.05
# create_time is derived from clock ticks since boot: equal for the same process, whoever reads
# it; a different process on the same pid started at least a tick (10 ms) apart.
CREATE_TIME_TOLERANCE = 0.005
_UNSAFE_IN_NAME = re.compile(r"[^A-Za-z0-9_.-]")


@dataclass(frozen=True)
class ProcRecord:
    job_id: int
    role: str
    index: int
    pid: int
    pgid: int
    create_time: float
    # The replica's keeper (workers/keeper.py), which holds the group across agent restarts:
    # while it lives, the group is its to stop, not a leftover. 0: started without one.
    keeper_pid: int = 0
    keeper_create_time: float = 0.0

    @property
    def tag(self) -> str:
        """The instance as logs name it: `master`, `worker-1` (the rule of ReplicaSpec.tag)."""
        return tag_of(self.role, self.index)

    @property
    def filename(self) -> str:
        role = _UNSAFE_IN_NAME.sub("_", self.role)
        return f"{self.job_id}-{role}-{self.index}-{self.pid}.json"


class ProcRecords:
    """The folder of records; each write is atomic, so a reader never sees half a record."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def write(self, record: ProcRecord) -> Path:
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / record.filename
        temp = path.with_name(f".{path.name}.tmp")
        # No fsync: the records only matter until the machine reboots, which ends every process.
        temp.write_text(json.dumps(asdict(record)))
        os.replace(temp, path)
        return path

    def remove(self, record: ProcRecord) -> None:
        (self.directory / record.filename).unlink(missing_ok=True)

    def load(self, job_id: int | None = None) -> list[ProcRecord]:
        """Every record (of one job, if given); a file that is not a record is reported and
        skipped, never acted on."""
        records: list[ProcRecord] = []
        if not self.directory.is_dir():
            return records
        for path in sorted(self.directory.glob("*.json")):
            try:
                record = ProcRecord(**json.loads(path.read_text()))
            except FileNotFoundError:
                continue  # removed meanwhile: its group has stopped
            except (ValueError, TypeError) as exc:
                log.warning("ignoring %s: not a process record (%s)", path, exc)
                continue
            if job_id is None or record.job_id == job_id:
                records.append(record)
        return records


def group_members(pgid: int) -> list[int]:
    """The live (not zombie) processes whose process group is `pgid`."""
    members = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                members.append(proc.pid)
        except (ProcessLookupError, psutil.NoSuchProcess):
            continue  # ended while we looked
        except (PermissionError, psutil.AccessDenied):
            continue  # not ours to read, so not ours to kill
    return members


def still_ours(record: ProcRecord) -> bool:
    """Whether the recorded group id still names the group we started.

    Linux does not reuse a number as a pid while it is still in use as a process group id, so:
    if a process has pid == pgid, it is our leader only if it started when ours did (otherwise
    the number was reused and that process, and any group it leads, belong to someone else);
    if no process has it, the group can still have members, and those must be ours.
    """
    try:
        leader = psutil.Process(record.pgid)
        return abs(leader.create_time() - record.create_time) < CREATE_TIME_TOLERANCE
    except psutil.NoSuchProcess:
        return bool(group_members(record.pgid))


def kept(record: ProcRecord) -> bool:
    """Whether the record's keeper still runs (it stops the group itself, after its grace)."""
    if not record.keeper_pid:
        return False
    return alive(record.keeper_pid, record.keeper_create_time)


def alive(pid: int, create_time: float) -> bool:
    """Whether the process that started at `create_time` still runs under `pid` (a zombie
    does not: nobody may have reaped a dead keeper whose agent is gone)."""
    try:
        proc = psutil.Process(pid)
        same = abs(proc.create_time() - create_time) < CREATE_TIME_TOLERANCE
        return same and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def reap(record: ProcRecord, wait: float = REAP_WAIT_SECONDS) -> list[int] | None:
    """SIGKILL the recorded process group if it is still ours, and wait for it to go.

    Returns the pids it killed ([] when nothing of the group was left), or None when the group
    did not stop within `wait` (it is tried again by whoever reaps next).
    """
    killed: list[int] = []
    deadline = time.monotonic() + wait
    while True:
        if not still_ours(record):
            return killed
        members = group_members(record.pgid)
        if not members:
            return killed
        killed.extend(pid for pid in members if pid not in killed)
        try:
            os.killpg(record.pgid, signal.SIGKILL)
        except ProcessLookupError:
            return killed
        except PermissionError:
            log.warning("may not kill process group %s of job %s", record.pgid, record.job_id)
            return None
        if time.monotonic() >= deadline:
            return None
        time.sleep(POLL_SECONDS)


@dataclass(frozen=True)
class Reaped:
    record: ProcRecord
    killed: list[int]


def reap_all(
    records: ProcRecords, job_id: int | None = None, spare: frozenset[int] = frozenset()
) -> list[Reaped]:
    """Reap every recorded group (of one job, if given) except those led by a pid in `spare`
    and those a live keeper holds, and delete the records of the groups that are gone."""
    reaped = []
    for record in records.load(job_id):
        if record.pid in spare or kept(record):
            continue
        killed = reap(record)
        if killed is None:
            log.warning(
                "process group %s of job %s %s did not stop; its record stays",
                record.pgid, record.job_id, record.tag,
            )  # fmt: skip
            continue
        records.remove(record)
        reaped.append(Reaped(record, killed))
    return reaped


def summary(reaped: list[Reaped], left_by: str) -> str:
    """`2 processes left by <left_by>: job 3 worker-1 pid 1234, pid 1240`: the ones killed."""
    killed = [r for r in reaped if r.killed]
    count = sum(len(r.killed) for r in killed)
    details = "; ".join(
        f"job {r.record.job_id} {r.record.tag} "
        + ", ".join(f"pid {pid}" for pid in sorted(r.killed))
        for r in killed
    )
    return f"{count} {'process' if count == 1 else 'processes'} left by {left_by}: {details}"
