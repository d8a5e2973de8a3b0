"""What Slurm says about a job, in Trainyard's states and the user's words.

Read with `squeue --json` (Slurm 21.08 and later; openapi v0.0.37/v0.0.38 in 22.05), which
lists pending and running jobs and, for MinJobAge (300 s by default), ended ones too. A
heterogeneous job is listed once per component; the job is as far along as its least
advanced component, and it failed if any component did.
"""

import dataclasses
import json
from dataclasses import dataclass

from jobs.models import Job
from jobs.services.slurm.slurm_client import SlurmError, SlurmTarget, SlurmUnavailable, run_client

# Slurm's job states (slurm.h, job_state_string) and what they are to a Trainyard job.
TRAINYARD_STATE = {
    "PENDING": Job.State.QUEUED,
    "CONFIGURING": Job.State.QUEUED,
    "REQUEUED": Job.State.QUEUED,
    "RESV_DEL_HOLD": Job.State.QUEUED,
    "SUSPENDED": Job.State.RUNNING,
    "RUNNING": Job.State.RUNNING,
    "COMPLETING": Job.State.RUNNING,
    "STAGE_OUT": Job.State.RUNNING,
    "COMPLETED": Job.State.SUCCEEDED,
    "CANCELLED": Job.State.CANCELLED,
    "FAILED": Job.State.FAILED,
    "NODE_FAIL": Job.State.FAILED,
    "TIMEOUT": Job.State.FAILED,
    "PREEMPTED": Job.State.FAILED,
    "OUT_OF_MEMORY": Job.State.FAILED,
    "BOOT_FAIL": Job.State.FAILED,
    "DEADLINE": Job.State.FAILED,
}
# Later in this list: further along. A heterogeneous job takes its least advanced component's.
PROGRESS = ["PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "COMPLETED"]

# Why an ended Slurm job did not succeed, as a reason reads on the job page.
ENDING_WORDS = {
    "CANCELLED": "cancelled in Slurm (scancel)",
    "FAILED": "an instance failed",
    "NODE_FAIL": "a Slurm node it ran on failed (NODE_FAIL)",
    "TIMEOUT": "Slurm's time limit for it was reached (TIMEOUT)",
    "PREEMPTED": "preempted by Slurm for another job (PREEMPTED)",
    "OUT_OF_MEMORY": "an instance ran out of memory (OUT_OF_MEMORY)",
    "BOOT_FAIL": "a Slurm node failed to boot for it (BOOT_FAIL)",
    "DEADLINE": "Slurm's deadline for it passed (DEADLINE)",
}
# Why a job waits in Slurm (squeue's REASON; slurm.h, job_reason_string), in words.
WAITING_WORDS = {
    "None": "waiting for Slurm to start it",
    "Resources": "waiting for free nodes in Slurm",
    "Priority": "waiting in Slurm behind jobs of higher priority",
    "PartitionConfig": "Slurm's partition can never hold it",
    "PartitionNodeLimit": "more nodes than Slurm's partition allows a job",
    "PartitionTimeLimit": "a longer time limit than Slurm's partition allows",
    "PartitionDown": "Slurm's partition is down",
    "PartitionInactive": "Slurm's partition is inactive",
    "NodeDown": "a node it needs is down in Slurm",
    "BeginTime": "waiting for its start time in Slurm",
    "Dependency": "waiting in Slurm for a job it depends on",
    "JobHeldUser": "held in Slurm by its user",
    "JobHeldAdmin": "held in Slurm by an administrator",
    "ReqNodeNotAvail": "a node it needs is not available in Slurm",
    "Reservation": "waiting in Slurm for a reservation",
    "QOSMaxJobsPerUserLimit": "at Slurm's limit of jobs per user",
    "AssocGrpCpuLimit": "at Slurm's CPU limit for its account",
    "AssocGrpGRES": "at Slurm's GPU limit for its account",
}


@dataclass(frozen=True)
class SlurmStatus:
    slurm_state: str  # Slurm's own word: PENDING, RUNNING, NODE_FAIL, …
    slurm_reason: str  # squeue's REASON: Resources, Priority, NonZeroExitCode, …
    nodes: str  # Slurm's node list, n[1-3]
    name: str = ""  # the job's name: trainyard-<id> for ours
    folder: str = ""  # its working folder: the attempt's, for ours
    partition: str = ""
    priority: int = 0  # Slurm's priority: the higher, the sooner its scheduler takes it
    submitted: int = 0  # when it was submitted, in seconds since the epoch

    @property
    def state(self) -> str:
        return TRAINYARD_STATE.get(self.slurm_state, Job.State.FAILED)

    @property
    def words(self) -> str:
        """Why it waits or how it ended, for the job page; empty while it runs or succeeded."""
        if self.state == Job.State.QUEUED:
            said = WAITING_WORDS.get(self.slurm_reason)
            return said or f"waiting in Slurm: {self.slurm_reason}"
        if self.state in (Job.State.FAILED, Job.State.CANCELLED):
            return ENDING_WORDS.get(self.slurm_state, f"ended in Slurm as {self.slurm_state}")
        return ""


def combined(components: list[dict[str, object]]) -> SlurmStatus:
    """One status for the components of one (possibly heterogeneous) Slurm job."""
    states = [str(c.get("job_state", "")) for c in components]
    failed = [
        s
        for s in states
        if TRAINYARD_STATE.get(s, Job.State.FAILED) in (Job.State.FAILED, Job.State.CANCELLED)
    ]
    if failed:
        state = failed[0]
    else:
        state = min(states, key=lambda s: PROGRESS.index(s) if s in PROGRESS else 0)
    first = next(c for c in components if c.get("job_state") == state)
    nodes = ",".join(str(c.get("nodes") or "") for c in components if c.get("nodes"))
    return SlurmStatus(
        state,
        str(first.get("state_reason") or "None"),
        nodes,
        name=str(components[0].get("name") or ""),
        folder=str(components[0].get("current_working_directory") or "").rstrip("/"),
        partition=str(components[0].get("partition") or ""),
        priority=_number(components[0].get("priority")),
        submitted=_number(components[0].get("submit_time")),
    )


def _number(value: object) -> int:
    return int(value) if isinstance(value, int | float) else 0


def places_in_queue(statuses: dict[str, "SlurmStatus"], partitions: str) -> dict[str, int]:
    """Each pending job's place among the pending jobs of the pool's partitions (Slurm's
    comma-separated list), in the order Slurm's scheduler takes them (priority, then
    submission): 1 for the next."""
    ours = set(partitions.split(","))
    waiting = [
        (key, s)
        for key, s in statuses.items()
        if s.state == Job.State.QUEUED and ours & set(s.partition.split(","))
    ]
    waiting.sort(key=lambda pair: (-pair[1].priority, pair[1].submitted, int(pair[0] or 0)))
    return {key: place for place, (key, _) in enumerate(waiting, 1)}


def query(target: SlurmTarget, slurm_ids: list[str]) -> dict[str, SlurmStatus]:
    """The status of each of these Slurm jobs that Slurm still knows; a job it has forgotten
    (ended more than MinJobAge ago, or never existed) is left out."""
    if not slurm_ids:
        return {}
    return {key: s for key, s in query_all(target).items() if key in slurm_ids}


def query_all(target: SlurmTarget) -> dict[str, SlurmStatus]:
    """Every job Slurm knows now, by its id (a heterogeneous job's: the first component's)."""
    # Not `--jobs`: squeue refuses the whole list when one id is no longer known.
    done = run_client(["squeue", "--json"], target)
    try:
        answer = json.loads(done.stdout)
    except ValueError as exc:
        raise SlurmUnavailable(f"squeue's JSON could not be read: {exc}") from None
    # With the controller away, `squeue --json` exits 0 with no jobs and its failure in
    # "errors" ("Failed while looking for jobs"): read as an answer, every job Slurm runs
    # would look ended.
    errors = answer.get("errors") or []
    if errors:
        said = "; ".join(
            f"{e.get('description') or e.get('error')} ({e.get('source', 'squeue')})"
            for e in errors
            if isinstance(e, dict)
        )
        raise SlurmUnavailable(f"squeue could not list Slurm's jobs: {said or errors}")
    listed = answer.get("jobs", [])
    by_job: dict[str, list[dict[str, object]]] = {}
    for entry in listed:
        het = entry.get("het_job_id") or 0
        key = str(het or entry.get("job_id"))
        by_job.setdefault(key, []).append(entry)
    return {key: combined(parts) for key, parts in by_job.items()}


# sacct's fields for accounting_of, in this order.
SACCT_FIELDS = ("JobID", "State", "ExitCode", "Start", "End", "MaxRSS")
MEMORY_UNITS = {"K": 1 / 1024, "M": 1.0, "G": 1024.0, "T": 1024.0 * 1024}


def accounting_of(target: SlurmTarget, slurm_id: str) -> dict[str, object] | None:
    """What Slurm's accounting (slurmdbd, through sacct) recorded of an ended Slurm job: its
    state, exit code ("0:0": status and signal), start and end (ISO, UTC, Slurm's clock) and the
    peak resident memory of its steps in MB; None where the cluster keeps no accounting (or
    has no record of it yet)."""
    # In UTC: sacct writes its times in its own time zone, with no zone in them.
    in_utc = dataclasses.replace(target, client_env={**target.client_env, "TZ": "UTC"})
    try:
        done = run_client(
            ["sacct", "--jobs", slurm_id, "--noheader", "--parsable2", "--noconvert",
             f"--format={','.join(SACCT_FIELDS)}"],
            in_utc,
        )  # fmt: skip
    except SlurmError:
        return None  # "Slurm accounting storage is disabled", or sacct away: nothing known
    rows = [
        dict(zip(SACCT_FIELDS, line.split("|"), strict=False)) for line in done.stdout.splitlines()
    ]
    jobs = [r for r in rows if "." not in r.get("JobID", ".")]  # the job (or its components)
    if not jobs:
        return None
    peaks = [_megabytes(r.get("MaxRSS", "")) for r in rows]
    codes = [r.get("ExitCode", "") for r in jobs]
    return {
        "state": jobs[0].get("State", "").split()[0] if jobs[0].get("State") else "",
        "exit_code": next((c for c in codes if c not in ("", "0:0")), codes[0]),
        "start": min((r["Start"] for r in jobs if _dated(r.get("Start"))), default=None),
        "end": max((r["End"] for r in jobs if _dated(r.get("End"))), default=None),
        "max_rss_mb": round(max(peaks), 1) if peaks else None,
    }


def _dated(value: str | None) -> bool:
    return bool(value) and value not in ("Unknown", "None")


def _megabytes(value: str) -> float:
    value = value.strip()
    if not value:
        return 0.0
    unit = value[-1].upper()
    if unit in MEMORY_UNITS:
        try:
            return float(value[:-1]) * MEMORY_UNITS[unit]
        except ValueError:
            return 0.0
    try:
        return float(value) / (1024 * 1024)  # bytes
    except ValueError:
        return 0.0
