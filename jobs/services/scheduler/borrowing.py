"""Borrowing (issue 25, item 3): a group's quota is its nominal share; its members' jobs may
run beyond it, on capacity other groups leave unused, up to the group's borrowing limit.

At placement, per job: a job that would take its group's running usage beyond the nominal
share runs on borrowed capacity (`Job.borrowed`: the first given back, reclaim.py); one that
would take it beyond nominal + borrowing limit waits. A job that keeps its group within its
nominal share is a lender's: when it finds no room, borrowed jobs of other groups make room
for it (reclaim.py).

The arithmetic is pure (`Share`); `Ledger` reads each group's share and what its members'
placed jobs hold once per scheduling pass, and keeps it true as the pass places jobs.
"""

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

RESOURCES = ("cpu", "gpus", "memory_gb")
LABELS = {"cpu": "CPU cores", "gpus": "GPUs", "memory_gb": "GB of memory"}


def _vector(cpu: int, gpus: int, memory_gb: int) -> dict[str, int]:
    return {"cpu": cpu, "gpus": gpus, "memory_gb": memory_gb}


@dataclass
class Share:
    """One group's nominal share, borrowing limit, and what its members' placed jobs hold."""

    group: str
    nominal: dict[str, int]
    borrow: dict[str, int]
    used: dict[str, int] = field(default_factory=lambda: _vector(0, 0, 0))

    def beyond_nominal(self, need: dict[str, int]) -> bool:
        """Whether `need` placed now would take the group beyond its nominal share."""
        return any(self.used[r] + need[r] > self.nominal[r] for r in RESOURCES)

    def over_limit(self, need: dict[str, int]) -> list[str]:
        """The resources on which `need` would take the group beyond nominal + borrowing."""
        return [r for r in RESOURCES if self.used[r] + need[r] > self.nominal[r] + self.borrow[r]]

    def take(self, need: dict[str, int]) -> None:
        for r in RESOURCES:
            self.used[r] += need[r]

    def why_waiting(self, resource: str, need: dict[str, int]) -> str:
        limit = self.nominal[resource] + self.borrow[resource]
        label = LABELS[resource]
        terms = (
            f"{self.nominal[resource]} + borrowing {self.borrow[resource]}"
            if self.borrow[resource]
            else f"{self.nominal[resource]}, no borrowing"
        )
        return (
            f"waiting: group {self.group} runs {self.used[resource]} {label} of its {limit} "
            f"(nominal {terms}); this job needs {need[resource]} more"
        )


@dataclass(frozen=True)
class Verdict:
    """What a job's groups allow at placement."""

    wait: str | None  # why it may not start now (a group at its borrowing limit), or None
    borrowing: bool  # it would run beyond a group's nominal share
    lender: str | None  # a group within whose nominal share it fits: it may reclaim


def judge(shares: Iterable[Share], need: dict[str, int]) -> Verdict:
    """The verdict for a job needing `need` whose owner is in the groups of `shares` (a user in
    no group with a quota borrows nothing and lends nothing: None of either)."""
    shares = list(shares)
    for share in shares:
        over = share.over_limit(need)
        if over:
            return Verdict(share.why_waiting(over[0], need), True, None)
    beyond = [s for s in shares if s.beyond_nominal(need)]
    lender = None if beyond or not shares else shares[0].group
    return Verdict(None, bool(beyond), lender)


class Ledger:
    """Every group's share and use, read once per pass; `take` keeps it true as jobs start."""

    def __init__(self, shares: dict[str, Share], groups_of: dict[int, list[str]]) -> None:
        self.shares = shares
        self.groups_of = groups_of  # user id -> names of their groups with a quota, by name

    @classmethod
    def read(
        cls, held: Iterable[tuple[int, int, int, int]], owners: Mapping[int, int] | None = None
    ) -> "Ledger":
        """From the database; `held` is (job id, cpu, gpus, memory_gb) per holding on a node,
        `owners` the owner of each of those jobs where the caller has read them already."""
        from django.contrib.auth.models import User

        from jobs.models import Job, Quota

        quotas = list(Quota.objects.filter(group__isnull=False).select_related("group"))
        shares: dict[str, Share] = {}
        by_group_id: dict[int, str] = {}
        for q in quotas:
            assert q.group is not None
            shares[q.group.name] = Share(
                q.group.name,
                _vector(q.cpu, q.gpus, q.memory_gb),
                _vector(q.borrow_cpu, q.borrow_gpus, q.borrow_memory_gb),
            )
            by_group_id[q.group.pk] = q.group.name
        groups_of: dict[int, list[str]] = {}
        for user_id, group_id in User.groups.through.objects.filter(
            group_id__in=list(by_group_id)
        ).values_list("user_id", "group_id"):
            groups_of.setdefault(user_id, []).append(by_group_id[group_id])
        for names in groups_of.values():
            names.sort()
        ledger = cls(shares, groups_of)
        per_job: dict[int, dict[str, int]] = {}
        for job_id, cpu, gpus, memory_gb in held:
            total = per_job.setdefault(job_id, _vector(0, 0, 0))
            for r, v in zip(RESOURCES, (cpu, gpus, memory_gb), strict=True):
                total[r] += v
        if shares and per_job:
            if owners is None:
                owners = dict(
                    Job.objects.filter(pk__in=list(per_job)).values_list("pk", "owner_id")
                )
            for job_id, need in per_job.items():
                ledger.take(owners.get(job_id, 0), need)
        return ledger

    def shares_of(self, owner_id: int) -> list[Share]:
        return [self.shares[g] for g in self.groups_of.get(owner_id, [])]

    def judge(self, owner_id: int, need: dict[str, int]) -> Verdict:
        return judge(self.shares_of(owner_id), need)

    def take(self, owner_id: int, need: dict[str, int]) -> None:
        for share in self.shares_of(owner_id):
            share.take(need)

    def outside(self, group: str) -> Callable[[int], bool]:
        """Whether a user (by id) is not a member of `group`."""
        return lambda owner_id: group not in self.groups_of.get(owner_id, [])


def need_of(cpu: int, gpus: int, memory_gb: int) -> dict[str, int]:
    return _vector(cpu, gpus, memory_gb)
