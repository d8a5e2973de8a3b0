"""What a user may still take: their quota minus what their active jobs hold."""

from dataclasses import dataclass

from django.contrib.auth.models import User
from django.db.models import Count, Sum
from django.db.models.functions import Coalesce

from jobs.models import Job, Quota
from jobs.services.totals import RESOURCE_LABELS, Totals


class NoQuota(Exception):
    """Neither the user nor the default has a quota: nothing may run until an admin sets one."""


@dataclass(frozen=True)
class Usage:
    cpu: int
    gpus: int
    memory_gb: int
    jobs: int


@dataclass(frozen=True)
class Excess:
    resource: str
    requested: int
    left: int
    limit: int

    @property
    def over_by(self) -> int:
        return self.requested - self.left

    @property
    def message(self) -> str:
        label = RESOURCE_LABELS[self.resource]
        return (
            f"Over quota on {label}: this job needs {self.requested}, you have {self.left} "
            f"left of {self.limit} (over by {self.over_by})."
        )


def effective_quota(user: User) -> Quota:
    quota = Quota.objects.filter(user=user).first() or Quota.objects.filter(is_default=True).first()
    if quota is None:
        raise NoQuota("No quota is set for you and there is no default quota; ask an admin.")
    return quota


def usage(user: User) -> Usage:
    agg = Job.objects.filter(owner=user, state__in=Job.ACTIVE_STATES).aggregate(
        cpu=Coalesce(Sum("cpu_total"), 0),
        gpus=Coalesce(Sum("gpus_total"), 0),
        memory_gb=Coalesce(Sum("memory_gb_total"), 0),
        jobs=Count("id"),
    )
    return Usage(**agg)


def remaining(quota: Quota, used: Usage) -> dict[str, int]:
    return {
        "cpu": quota.cpu - used.cpu,
        "gpus": quota.gpus - used.gpus,
        "memory_gb": quota.memory_gb - used.memory_gb,
        "jobs": quota.running_jobs - used.jobs,
    }


def excesses(quota: Quota, used: Usage, totals: Totals) -> list[Excess]:
    """Every resource on which the request would go over; empty when it fits."""
    left = remaining(quota, used)
    wanted = dict(totals.as_dict(), jobs=1)
    limits = {
        "cpu": quota.cpu,
        "gpus": quota.gpus,
        "memory_gb": quota.memory_gb,
        "jobs": quota.running_jobs,
    }
    return [
        Excess(resource, wanted[resource], max(left[resource], 0), limits[resource])
        for resource in ("cpu", "gpus", "memory_gb", "jobs")
        if wanted[resource] > left[resource]
    ]
