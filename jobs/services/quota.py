"""What a user may still take: every quota that applies to them, minus what it already holds.

A user is bound by their own quota (or the default one) and by the quota of each of their
groups, which all members share. Their effective room on each resource is the smallest room
left in any of these scopes.
"""

from collections.abc import Callable
from dataclasses import dataclass

from django.contrib.auth.models import User
from django.db.models import Count, Q, Sum
from django.db.models.functions import Coalesce

from jobs.models import Job, Quota
from jobs.services.totals import RESOURCE_LABELS, RoleRequest, Totals, compute_totals

LIMITED = ("cpu", "gpus", "memory_gb", "jobs")


class NoQuota(Exception):
    """Neither the user nor the default has a quota: nothing may run until an admin sets one."""


@dataclass(frozen=True)
class Usage:
    cpu: int
    gpus: int
    memory_gb: int
    jobs: int

    def as_dict(self) -> dict[str, int]:
        return {"cpu": self.cpu, "gpus": self.gpus, "memory_gb": self.memory_gb, "jobs": self.jobs}


@dataclass(frozen=True)
class Scope:
    """One quota that binds the user, with what its holders use now."""

    kind: str  # "user", "default" or "group"
    name: str
    quota: Quota
    used: Usage

    @property
    def limit(self) -> dict[str, int]:
        """What its holders may hold at once: a group's nominal share plus its borrowing limit
        (jobs.services.scheduler.borrowing decides, at placement, which jobs run on borrowed
        capacity)."""
        q, more = self.quota, self.borrow
        return {
            "cpu": q.cpu + more["cpu"],
            "gpus": q.gpus + more["gpus"],
            "memory_gb": q.memory_gb + more["memory_gb"],
            "jobs": q.running_jobs,
        }

    @property
    def borrow(self) -> dict[str, int]:
        """How much a group may borrow beyond its quota (its nominal share); users borrow none."""
        q = self.quota
        if self.kind != "group":
            return {"cpu": 0, "gpus": 0, "memory_gb": 0, "jobs": 0}
        return {
            "cpu": q.borrow_cpu,
            "gpus": q.borrow_gpus,
            "memory_gb": q.borrow_memory_gb,
            "jobs": 0,
        }

    @property
    def left(self) -> dict[str, int]:
        used = self.used.as_dict()
        return {r: self.limit[r] - used[r] for r in LIMITED}

    @property
    def label(self) -> str:
        return f"group {self.name}" if self.kind == "group" else "you"


@dataclass(frozen=True)
class Excess:
    resource: str
    requested: int
    left: int
    limit: int
    scope: Scope
    formula: str

    @property
    def over_by(self) -> int:
        return self.requested - self.left

    @property
    def message(self) -> str:
        label = RESOURCE_LABELS[self.resource]
        whose = "you have" if self.scope.kind != "group" else f"group {self.scope.name} has"
        where = "" if self.scope.kind != "group" else f" (group {self.scope.name})"
        borrow = self.scope.borrow[self.resource]
        terms = f"nominal {self.limit - borrow} + borrowing {borrow}; " if borrow else ""
        return (
            f"Over quota on {label}{where}: this job needs {self.requested}, {whose} "
            f"{self.left} left of {self.limit} ({terms}over by {self.over_by})."
        )

    def as_dict(self) -> dict[str, object]:
        return {
            "requested": self.requested,
            "left": self.left,
            "limit": self.limit,
            "over_by": self.over_by,
            "scope": self.scope.label,
            "formula": self.formula,
        }


def usage_of(owners: Q) -> Usage:
    """What the active jobs of the owners matching `owners` hold."""
    agg = Job.objects.filter(owners, state__in=Job.ACTIVE_STATES).aggregate(
        cpu=Coalesce(Sum("cpu_total"), 0),
        gpus=Coalesce(Sum("gpus_total"), 0),
        memory_gb=Coalesce(Sum("memory_gb_total"), 0),
        jobs=Count("id"),
    )
    return Usage(**agg)


def scopes_for(user: User, lock: bool = False) -> list[Scope]:
    """Every quota that binds the user. With lock, their rows stay locked to the transaction's
    end (group quotas first, by id, then the user's row: one order, so no deadlock)."""
    group_quotas = Quota.objects.filter(group__in=user.groups.all()).select_related("group")
    if lock:
        group_quotas = group_quotas.select_for_update().order_by("id")
        User.objects.select_for_update().filter(pk=user.pk).first()
    own = Quota.objects.filter(user=user).first()
    kind = "user"
    if own is None:
        own, kind = Quota.objects.filter(is_default=True).first(), "default"
    if own is None:
        raise NoQuota("No quota is set for you and there is no default quota; ask an admin.")
    scopes = [Scope(kind, user.get_username(), own, usage_of(Q(owner=user)))]
    for quota in group_quotas:
        assert quota.group is not None
        members = Q(owner__groups=quota.group)
        scopes.append(Scope("group", quota.group.name, quota, usage_of(members)))
    return scopes


def effective_left(scopes: list[Scope]) -> dict[str, int]:
    return {r: max(0, min(s.left[r] for s in scopes)) for r in LIMITED}


def excesses(scopes: list[Scope], totals: Totals) -> list[Excess]:
    """Every resource on which the request would go over, in every scope it goes over."""
    wanted = dict(totals.as_dict(), jobs=1)
    found = []
    for scope in scopes:
        for resource in LIMITED:
            if wanted[resource] > scope.left[resource]:
                formula = totals.formulas.get(resource, "1 job")
                found.append(
                    Excess(
                        resource,
                        wanted[resource],
                        max(scope.left[resource], 0),
                        scope.limit[resource],
                        scope,
                        formula,
                    )
                )
    return found


def largest_fitting(
    roles: list[RoleRequest],
    scopes: list[Scope],
    varying: str = "worker",
    placeable: Callable[[list[RoleRequest]], bool] | None = None,
) -> int | None:
    """The most instances of `varying` that fit every scope, the other roles as asked, and that
    `placeable` accepts (whether the nodes could ever hold them: advice to use a count they
    never could would only lead to the next refusal).

    None when not even zero fit (the other roles alone are over, or no job may start). Both
    tests only fail more as the count grows, so a binary search finds the largest.
    """
    fixed = [r for r in roles if r.role != varying]
    varied = next((r for r in roles if r.role == varying), None)
    if varied is None or effective_left(scopes)["jobs"] < 1:
        return None

    def fits(n: int) -> bool:
        trial = [*fixed, RoleRequest(varying, varied.package, n)] if n else fixed
        if excesses(scopes, compute_totals(trial)):
            return False
        return placeable is None or placeable(trial)

    if not fits(0):
        return None
    low, high = 0, varied.instances
    while low < high:  # the largest n that fits
        mid = (low + high + 1) // 2
        if fits(mid):
            low = mid
        else:
            high = mid - 1
    return low
