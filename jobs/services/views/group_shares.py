"""The admin's group view (issue 25, item 5): per group, its nominal share, what it borrows and
lends now, and what it used over the last day, for a section of the Quotas page."""

from dataclasses import dataclass
from datetime import timedelta

from django.db.models import Q
from django.utils import timezone

from jobs.models import JobAttempt, Node
from jobs.services.scheduler.borrowing import RESOURCES, Ledger
from jobs.services.scheduler.scheduling import holdings

DAY = timedelta(days=1)


@dataclass(frozen=True)
class GroupShareRow:
    group: str
    nominal: dict[str, int]
    borrow_limit: dict[str, int]
    in_use: dict[str, int]
    borrowed: dict[str, int]  # held now beyond the nominal share
    lent: dict[str, int]  # of its unused share, what other groups' borrowing uses now
    used_day: dict[str, float]  # resource-hours over the last 24 hours

    @property
    def day_share(self) -> float | None:
        """CPU used over the day as a part of its nominal share held all day (1.0: all of it)."""
        whole = self.nominal["cpu"] * 24
        return self.used_day["cpu"] / whole if whole else None

    @property
    def day_words(self) -> str:
        """e.g. "96.0 core-hours, 2.5 GPU-hours (50 % of its share)"."""
        words = f"{self.used_day['cpu']:.1f} core-hours"
        if self.used_day["gpus"]:
            words += f", {self.used_day['gpus']:.1f} GPU-hours"
        share = self.day_share
        return words + (
            f" ({share:.0%} of its share)".replace("%", " %") if share is not None else ""
        )


def lent(
    unused: dict[str, dict[str, int]], borrowed_total: dict[str, int]
) -> dict[str, dict[str, int]]:
    """What each group lends: the borrowing of all groups, split between the groups that leave
    some of their share unused, in proportion to how much they leave (pure)."""
    out: dict[str, dict[str, int]] = {g: dict.fromkeys(RESOURCES, 0) for g in unused}
    for r in RESOURCES:
        spare = sum(u[r] for u in unused.values())
        if not spare:
            continue
        for group, u in unused.items():
            out[group][r] = min(u[r], round(borrowed_total[r] * u[r] / spare))
    return out


def rows() -> list[GroupShareRow]:
    nodes = list(Node.objects.all())
    ledger = Ledger.read((h.job_id, h.cpu, h.gpus, h.memory_gb) for h in holdings(nodes))
    shares = [ledger.shares[name] for name in sorted(ledger.shares)]
    borrowed = {s.group: {r: max(0, s.used[r] - s.nominal[r]) for r in RESOURCES} for s in shares}
    unused = {s.group: {r: max(0, s.nominal[r] - s.used[r]) for r in RESOURCES} for s in shares}
    total = {r: sum(b[r] for b in borrowed.values()) for r in RESOURCES}
    lends = lent(unused, total)
    day = _used_over_the_day(ledger.groups_of)
    return [
        GroupShareRow(
            s.group,
            dict(s.nominal),
            dict(s.borrow),
            dict(s.used),
            borrowed[s.group],
            lends[s.group],
            day.get(s.group, dict.fromkeys(RESOURCES, 0.0)),
        )
        for s in shares
    ]


def _used_over_the_day(groups_of: dict[int, list[str]]) -> dict[str, dict[str, float]]:
    """Resource-hours each group's members' attempts held within the last 24 hours."""
    now = timezone.now()
    since = now - DAY
    used: dict[str, dict[str, float]] = {}
    for owner_id, started, finished, cpu, gpus, memory_gb in (
        JobAttempt.objects.filter(job__owner_id__in=list(groups_of), started__isnull=False)
        .filter(Q(finished__isnull=True) | Q(finished__gte=since))
        .values_list(
            "job__owner_id", "started", "finished",
            "job__cpu_total", "job__gpus_total", "job__memory_gb_total",
        )
    ):  # fmt: skip
        assert started is not None  # filtered so
        hours = ((finished or now) - max(started, since)).total_seconds() / 3600
        for group in groups_of.get(owner_id, []):
            total = used.setdefault(group, dict.fromkeys(RESOURCES, 0.0))
            for r, held in zip(RESOURCES, (cpu, gpus, memory_gb), strict=True):
                total[r] += held * max(0.0, hours)
    return used
