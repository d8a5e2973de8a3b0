"""Use measured against the request, as Slurm's `seff` shows it for every job: how much of the
cores and memory a job's packages held it actually used, from each instance's cgroup counters
(workers/cgroups.py; the agent reports them when the instance ends: Replica.cpu_seconds,
Replica.memory_peak_bytes).

- CPU efficiency: CPU-seconds used over CPU-seconds held (cores × the instance's running time),
  summed over the instances; "used 1.9 on average" is the CPU-seconds over the running time,
  summed over the instances (cores busy at once, on average).
- Memory: the sum of the instances' peaks against the sum of what their packages gave (each
  instance's own on the page's table), as seff sums its tasks.

The cost figures (samples per dollar) stay on what was held: a job pays for its packages.
"""

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import QuerySet
from django.utils import timezone

from jobs.models import Job, Replica
from jobs.services.lifecycle import restarts

GB = 1 << 30


@dataclass(frozen=True)
class InstanceUse:
    tag: str
    node: str
    package: str
    cores_asked: int
    memory_asked_gb: float
    seconds: float  # how long it ran (started to finished)
    cpu_seconds: float
    memory_peak_bytes: int

    @property
    def cores_used(self) -> float:
        return self.cpu_seconds / self.seconds if self.seconds > 0 else 0.0

    @property
    def cpu_efficiency(self) -> float:
        held = self.cores_asked * self.seconds
        return self.cpu_seconds / held if held > 0 else 0.0

    @property
    def memory_peak_gb(self) -> float:
        return self.memory_peak_bytes / GB

    @property
    def memory_efficiency(self) -> float:
        return self.memory_peak_gb / self.memory_asked_gb if self.memory_asked_gb else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "instance": self.tag,
            "node": self.node,
            "package": self.package,
            "cores_asked": self.cores_asked,
            "cores_used": round(self.cores_used, 3),
            "cpu_seconds": round(self.cpu_seconds, 3),
            "seconds": round(self.seconds, 3),
            "cpu_efficiency": round(self.cpu_efficiency, 4),
            "memory_asked_gb": self.memory_asked_gb,
            "memory_peak_gb": round(self.memory_peak_gb, 3),
            "memory_efficiency": round(self.memory_efficiency, 4),
        }


@dataclass(frozen=True)
class JobUse:
    instances: list[InstanceUse]

    @property
    def cores_asked(self) -> int:
        return sum(i.cores_asked for i in self.instances)

    @property
    def cores_used(self) -> float:
        return sum(i.cores_used for i in self.instances)

    @property
    def cpu_seconds(self) -> float:
        return sum(i.cpu_seconds for i in self.instances)

    @property
    def cpu_efficiency(self) -> float:
        held = sum(i.cores_asked * i.seconds for i in self.instances)
        return self.cpu_seconds / held if held > 0 else 0.0

    @property
    def memory_asked_gb(self) -> float:
        return sum(i.memory_asked_gb for i in self.instances)

    @property
    def memory_peak_gb(self) -> float:
        return sum(i.memory_peak_gb for i in self.instances)

    @property
    def memory_efficiency(self) -> float:
        return self.memory_peak_gb / self.memory_asked_gb if self.memory_asked_gb else 0.0

    @property
    def headline(self) -> str:
        """ "CPU efficiency 23 %: asked 8 cores, used 1.9 on average; memory peak 3.1 of 16 GB" """
        cores = "1 core" if self.cores_asked == 1 else f"{self.cores_asked} cores"
        return (
            f"CPU efficiency {self.cpu_efficiency * 100:.0f} %: asked {cores}, used "
            f"{self.cores_used:.1f} on average; memory peak {self.memory_peak_gb:.1f} of "
            f"{self.memory_asked_gb:g} GB"
        )

    def over_jobs(self, jobs: int) -> str:
        """For use summed over jobs that ran at different times (a user's day), where cores
        busy at once mean nothing: core-hours used of those held, and memory peaks as a share
        of what each instance asked, on average."""
        held = sum(i.cores_asked * i.seconds for i in self.instances) / 3600
        shares = [i.memory_efficiency for i in self.instances]
        memory = sum(shares) / len(shares) * 100 if shares else 0.0
        return (
            f"CPU efficiency {self.cpu_efficiency * 100:.0f} %: used {self.cpu_seconds / 3600:.2f} "
            f"of {held:.2f} core-hours held over {jobs} job{'s' if jobs != 1 else ''}; memory "
            f"peaks {memory:.0f} % of what was asked, on average"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "summary": self.headline,
            "cores_asked": self.cores_asked,
            "cores_used": round(self.cores_used, 3),
            "cpu_seconds": round(self.cpu_seconds, 3),
            "cpu_efficiency": round(self.cpu_efficiency, 4),
            "memory_asked_gb": self.memory_asked_gb,
            "memory_peak_gb": round(self.memory_peak_gb, 3),
            "memory_efficiency": round(self.memory_efficiency, 4),
            "instances": [i.to_dict() for i in self.instances],
        }


def _instance_use(replica: Replica) -> InstanceUse | None:
    if (
        replica.cpu_seconds is None
        or replica.memory_peak_bytes is None
        or replica.started is None
        or replica.finished is None
        or replica.package is None
    ):
        return None
    return InstanceUse(
        tag=replica.tag,
        node=replica.node.name if replica.node is not None else replica.slurm_node,
        package=replica.package.name,
        cores_asked=replica.package.cpu,
        memory_asked_gb=float(replica.package.memory_gb),
        seconds=max(0.0, (replica.finished - replica.started).total_seconds()),
        cpu_seconds=replica.cpu_seconds,
        memory_peak_bytes=replica.memory_peak_bytes,
    )


def of_replicas(replicas: "QuerySet[Replica] | list[Replica]") -> JobUse | None:
    """The use of these replicas; None when none of them was measured (a node without
    limits, an agent older than them, or nothing has ended yet)."""
    measured = [u for r in replicas if (u := _instance_use(r)) is not None]
    return JobUse(sorted(measured, key=lambda u: u.tag)) if measured else None


def of_job(job: Job) -> JobUse | None:
    """The use of the job's current attempt, as far as its instances have ended."""
    return of_replicas(restarts.current_replicas(job).select_related("package", "node"))


@dataclass(frozen=True)
class Wasteful:
    """A job, or a user's jobs, that held much more than they used over a period."""

    label: str  # "#42 resnet (alice)" or "alice"
    job_id: int | None
    use: JobUse
    summary: str  # the job's headline, or a user's use over their jobs


def least_efficient(
    since: timedelta = timedelta(days=1), limit: int = 10, now: datetime | None = None
) -> tuple[list[Wasteful], list[Wasteful]]:
    """The jobs, and the users, that used the smallest share of the cores they held among the
    jobs that ended within `since`: what the Quotas page shows admins."""
    start = (now or timezone.now()) - since
    replicas = (
        Replica.objects.filter(finished__gte=start, cpu_seconds__isnull=False)
        .select_related("package", "node", "job", "job__owner")
        .order_by("job_id")
    )
    by_job: dict[int, list[Replica]] = {}
    for replica in replicas:
        by_job.setdefault(replica.job_id, []).append(replica)
    jobs: list[Wasteful] = []
    by_user: dict[str, list[JobUse]] = {}
    for rows in by_job.values():
        use = of_replicas(rows)
        if use is None:
            continue
        job = rows[0].job
        jobs.append(
            Wasteful(f"#{job.pk} {job.name} ({job.owner.username})", job.pk, use, use.headline)
        )
        by_user.setdefault(job.owner.username, []).append(use)
    users = []
    for name, uses in by_user.items():
        total = JobUse([i for use in uses for i in use.instances])
        users.append(Wasteful(name, None, total, total.over_jobs(len(uses))))
    jobs.sort(key=lambda w: w.use.cpu_efficiency)
    users.sort(key=lambda w: w.use.cpu_efficiency)
    return jobs[:limit], users[:limit]
