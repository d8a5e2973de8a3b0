"""Fair-share order (issue 25, item 3): among waiting jobs of the same priority, the group that
is furthest below its share goes first, and within a group the user furthest below theirs.

"Below its share" is measured on decayed usage, as Slurm's fair-share factor and Kueue's
AdmissionFairSharing measure it: every resource-second a tenant's jobs held counts, weighted by
2^(-age / half-life), so yesterday's burst is forgiven while this hour's is not. A tenant's
ratio is its decayed usage over what its nominal share would have accrued in the same decay
(a share held without pause for ever accrues share × half-life / ln 2), on its dominant
resource: 1.0 means it has used exactly its share, 0.0 nothing, 2.0 twice.

The policy (decay, ratio, key) is pure, tested without a database; `owner_keys` feeds it from the
database once per call (one scheduling pass, one queue page), reading only attempts that
ended within a few half-lives.

Shares: a group's is its quota (its nominal share); a member's, an equal part of it; a user in
no group with a quota is a tenant of their own, with their own (or the default) quota as share.
A user in several groups with quotas is ordered with the first of them by name.
"""

import math
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth.models import User
from django.db.models import Q
from django.utils import timezone

from jobs.models import JobAttempt, Quota
from jobs.services.plain_rows import aware_dates, plain_rows

# Usage older than this many half-lives weighs less than 0.1 %: not read at all.
HORIZON_HALF_LIVES = 10


@dataclass(frozen=True)
class Resources:
    cpu: float = 0.0
    gpus: float = 0.0
    memory_gb: float = 0.0

    def __add__(self, other: "Resources") -> "Resources":
        return Resources(
            self.cpu + other.cpu, self.gpus + other.gpus, self.memory_gb + other.memory_gb
        )

    def scaled(self, factor: float) -> "Resources":
        return Resources(self.cpu * factor, self.gpus * factor, self.memory_gb * factor)


@dataclass(frozen=True)
class UsageRecord:
    """One attempt of a job: what it held from `start` until `end` (None: it still runs)."""

    start: datetime
    end: datetime | None
    held: Resources


def decayed_weight(start: datetime, end: datetime, now: datetime, half_life: float) -> float:
    """∫ 2^(-(now - t)/h) dt over [start, end], in seconds: the decayed length of an interval."""
    if end <= start:
        return 0.0
    age_end = max(0.0, (now - end).total_seconds())
    age_start = max(0.0, (now - start).total_seconds())
    k = math.log(2) / half_life
    return (math.exp(-k * age_end) - math.exp(-k * age_start)) / k


def decayed_usage(records: Iterable[UsageRecord], now: datetime, half_life: float) -> Resources:
    """Resource-seconds held, each weighted by its age's decay."""
    total = Resources()
    for record in records:
        end = min(record.end or now, now)
        total = total + record.held.scaled(decayed_weight(record.start, end, now, half_life))
    return total


def share_ratio(usage: Resources, share: Resources, half_life: float) -> float:
    """Decayed usage against what `share` held without pause would have accrued, on the
    dominant resource (the one of which the tenant used the largest part). A resource the share
    gives none of does not count (a CPU team's ratio is not its GPU use); no share at all: 0."""
    accrued = share.scaled(half_life / math.log(2))
    parts = [
        used / given
        for used, given in (
            (usage.cpu, accrued.cpu),
            (usage.gpus, accrued.gpus),
            (usage.memory_gb, accrued.memory_gb),
        )
        if given > 0
    ]
    return max(parts, default=0.0)


@dataclass(frozen=True)
class Tenancy:
    """Whose share a job's owner draws on: their group (or themselves alone) and their part."""

    group: str  # "group:NAME", or "user:ID" for a user in no group with a quota
    group_share: Resources
    members: tuple[int, ...]  # the group's members' user ids (just the user, alone)


def sort_key(
    group_ratio: float, user_ratio: float, created: datetime, job_id: int
) -> tuple[float, float, datetime, int]:
    """Furthest below its group's share first, then its user's, then first come first served."""
    return (round(group_ratio, 9), round(user_ratio, 9), created, job_id)


def ratios(
    tenancies: dict[int, Tenancy],
    usage_by_user: dict[int, Resources],
    half_life: float,
) -> dict[int, tuple[float, float]]:
    """(group ratio, user ratio) for each user of `tenancies`: a group's usage is its members'
    sum against its share; a member's against an equal part of it."""
    found: dict[int, tuple[float, float]] = {}
    for user_id, tenancy in tenancies.items():
        members = tenancy.members or (user_id,)
        group_usage = Resources()
        for member in members:
            group_usage = group_usage + usage_by_user.get(member, Resources())
        own_share = tenancy.group_share.scaled(1 / len(members))
        found[user_id] = (
            share_ratio(group_usage, tenancy.group_share, half_life),
            share_ratio(usage_by_user.get(user_id, Resources()), own_share, half_life),
        )
    return found


def horizon(now: datetime, half_life: float) -> datetime:
    return now - timedelta(seconds=half_life * HORIZON_HALF_LIVES)


# The database side: reads what the pure part needs, once per call.


def owner_keys(owner_ids: set[int]) -> dict[int, tuple[float, float]]:
    """The fair-share part of each of these users' jobs' sort key (sort_key without the
    submission time): lower goes first."""
    return {u: sort_key(g, r, datetime.min, 0)[:2] for u, (g, r) in owner_ratios(owner_ids).items()}


def owner_ratios(owner_ids: set[int]) -> dict[int, tuple[float, float]]:
    """(group ratio, user ratio) of each of these users, from the database now."""
    now = timezone.now()
    half_life = float(settings.TRAINYARD_FAIR_SHARE_HALF_LIFE_SECONDS)
    tenancies = tenancies_of(owner_ids)
    users = {m for t in tenancies.values() for m in t.members} | set(tenancies)
    return ratios(tenancies, usage_by_user(users, now, half_life), half_life)


def tenancies_of(user_ids: set[int]) -> dict[int, Tenancy]:
    """Each user's group with a quota (the first by name) and its members, or the user alone
    with their own or the default quota."""
    # Two queries, not five: every quota that can matter, and every membership of a group with
    # a quota (its members are needed anyway); a scheduling pass reads them once each.
    quotas = list(
        Quota.objects.filter(
            Q(group__isnull=False) | Q(user_id__in=user_ids) | Q(is_default=True)
        ).select_related("group")
    )
    group_quotas = {q.group_id: q for q in quotas if q.group_id is not None}
    own = {q.user_id: q for q in quotas if q.user_id in user_ids}
    defaults = sorted((q for q in quotas if q.is_default), key=lambda q: q.pk)
    # As Quota.objects.filter(is_default=True).first() chose it: the model has no order.
    default = defaults[0] if defaults else None
    members: dict[int, list[int]] = {}
    for user_id, group_id in User.groups.through.objects.filter(
        group_id__in=list(group_quotas)
    ).values_list("user_id", "group_id"):
        members.setdefault(group_id, []).append(user_id)
    first_group: dict[int, int] = {}
    for group_id in sorted(members, key=lambda g: _name_of(group_quotas[g])):
        for user_id in members[group_id]:
            if user_id in user_ids:
                first_group.setdefault(user_id, group_id)
    found: dict[int, Tenancy] = {}
    for user_id in user_ids:
        first = first_group.get(user_id)
        if first is not None:
            q = group_quotas[first]
            found[user_id] = Tenancy(
                f"group:{_name_of(q)}", _share(q), tuple(sorted(members[first]))
            )
            continue
        quota = own.get(user_id) or default
        share = _share(quota) if quota is not None else Resources()
        found[user_id] = Tenancy(f"user:{user_id}", share, (user_id,))
    return found


def _name_of(quota: Quota) -> str:
    assert quota.group is not None
    return quota.group.name


def _share(quota: Quota) -> Resources:
    return Resources(float(quota.cpu), float(quota.gpus), float(quota.memory_gb))


def usage_by_user(user_ids: set[int], now: datetime, half_life: float) -> dict[int, Resources]:
    """Each user's decayed usage, from their jobs' attempts that started and had not ended
    before the horizon: decayed_usage's sums, worked out on plain floats."""
    rows = (
        JobAttempt.objects.filter(job__owner_id__in=user_ids, started__isnull=False)
        .filter(Q(finished__isnull=True) | Q(finished__gte=horizon(now, half_life)))
        # Unordered: nothing here needs an order, and the model's (by job id, then number)
        # would have the database sort what it reads off the attempts' index
        # (attempt_started_finished). Until migration 0029 it was the job's own order, which
        # had SQLite walk every job of the history by date.
        .order_by()
        .values_list(
            "job__owner_id", "started", "finished",
            "job__cpu_total", "job__gpus_total", "job__memory_gb_total",
        )
    )  # fmt: skip
    # Plain rows, the two dates converted here, and the sums kept as floats, added as
    # decayed_usage adds them (the same values for the same rows): a thousand running jobs'
    # attempts are read in every scheduling pass, and a Resources made per term was a tenth
    # of the fair-share order's cost.
    aware = aware_dates(rows.db)
    totals: dict[int, list[float]] = {}
    for owner_id, started, finished, cpu, gpus, memory_gb in plain_rows(rows):
        assert started is not None  # filtered so
        end = now if finished is None else min(aware(finished), now)
        weight = decayed_weight(aware(started), end, now, half_life)
        total = totals.setdefault(owner_id, [0.0, 0.0, 0.0])
        total[0] += cpu * weight
        total[1] += gpus * weight
        total[2] += memory_gb * weight
    return {u: Resources(*total) for u, total in totals.items()}
