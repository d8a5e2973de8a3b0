"""Users, their groups and their quotas, as an admin manages them on the Users page.

Every write happens in one transaction: a request that fails halfway (a username taken by a
concurrent request, say) leaves no user without their groups or quota.
"""

import secrets
from collections.abc import Iterable
from dataclasses import asdict, dataclass

from django.contrib.auth.models import Group, User
from django.db import transaction
from django.db.models import Count, Sum
from django.db.models.functions import Coalesce

from jobs.models import Job, Quota
from jobs.services import revocation, tokens
from jobs.services.quota import Usage

# 16 characters of URL-safe base64: easy to paste, far beyond guessing.
GENERATED_PASSWORD_BYTES = 12


@dataclass(frozen=True)
class Limits:
    cpu: int
    gpus: int
    memory_gb: int
    running_jobs: int

    @classmethod
    def of(cls, quota: Quota) -> "Limits":
        return cls(quota.cpu, quota.gpus, quota.memory_gb, quota.running_jobs)


# (what the Usage calls it, what the Limits call it)
RESOURCES = (("cpu", "cpu"), ("gpus", "gpus"), ("memory_gb", "memory_gb"), ("jobs", "running_jobs"))


@dataclass(frozen=True)
class Cell:
    resource: str
    used: int
    limit: int | None

    @property
    def full(self) -> bool:
        """Nothing more fits. A limit of 0 (no GPUs on a CPU cluster) is a rule, not a
        shortage: not flagged."""
        return self.limit is not None and self.limit > 0 and self.used >= self.limit


def _cells(limits: Limits | None, used: Usage) -> list[Cell]:
    return [
        Cell(u, getattr(used, u), getattr(limits, q) if limits is not None else None)
        for u, q in RESOURCES
    ]


@dataclass(frozen=True)
class UserRow:
    user: User
    groups: list[str]
    kind: str  # "own", "default", or "none" (no own quota and no default: they cannot run)
    limits: Limits | None
    used: Usage

    @property
    def cells(self) -> list[Cell]:
        return _cells(self.limits, self.used)


@dataclass(frozen=True)
class GroupRow:
    group: Group
    members: int
    limits: Limits | None  # None: the group binds nobody
    used: Usage

    @property
    def cells(self) -> list[Cell]:
        return _cells(self.limits, self.used)


NOTHING = Usage(cpu=0, gpus=0, memory_gb=0, jobs=0)


def _usage_by(field: str) -> dict[int, Usage]:
    """What the active jobs hold, summed per value of `field` ("owner", "owner__groups")."""
    rows = (
        Job.objects.filter(state__in=Job.ACTIVE_STATES, **{f"{field}__isnull": False})
        .values(field)
        .annotate(
            cpu=Coalesce(Sum("cpu_total"), 0),
            gpus=Coalesce(Sum("gpus_total"), 0),
            memory_gb=Coalesce(Sum("memory_gb_total"), 0),
            jobs=Count("id"),
        )
    )
    return {
        r[field]: Usage(cpu=r["cpu"], gpus=r["gpus"], memory_gb=r["memory_gb"], jobs=r["jobs"])
        for r in rows
    }


def user_rows() -> list[UserRow]:
    """Every user, with their groups, the quota that is theirs (own or the default), and what
    their queued and running jobs hold now."""
    default = Quota.objects.filter(is_default=True).first()
    own = {q.user_id: q for q in Quota.objects.filter(user__isnull=False)}
    used = _usage_by("owner")
    rows = []
    for user in User.objects.order_by("username").prefetch_related("groups"):
        quota, kind = own.get(user.pk), "own"
        if quota is None:
            quota, kind = default, "default" if default is not None else "none"
        rows.append(
            UserRow(
                user=user,
                groups=sorted(g.name for g in user.groups.all()),
                kind=kind,
                limits=Limits.of(quota) if quota is not None else None,
                used=used.get(user.pk, NOTHING),
            )
        )
    return rows


def group_rows() -> list[GroupRow]:
    quotas = {q.group_id: q for q in Quota.objects.filter(group__isnull=False)}
    used = _usage_by("owner__groups")
    return [
        GroupRow(
            group=group,
            members=group.members,
            limits=Limits.of(quotas[group.pk]) if group.pk in quotas else None,
            used=used.get(group.pk, NOTHING),
        )
        for group in Group.objects.order_by("name").annotate(members=Count("user"))
    ]


def generate_password() -> str:
    return secrets.token_urlsafe(GENERATED_PASSWORD_BYTES)


@transaction.atomic
def create_user(
    username: str,
    password: str,
    email: str = "",
    groups: Iterable[Group] = (),
    new_group: str = "",
    is_staff: bool = False,
    quota: Limits | None = None,
) -> User:
    """A user who can log in with `password`, in these groups (and `new_group`, created if
    need be), with a quota of their own when given one, else the default's."""
    user = User.objects.create_user(username, email=email, password=password, is_staff=is_staff)
    user.groups.set(_with_new_group(groups, new_group))
    set_user_quota(user, quota)
    return user


@transaction.atomic
def update_user(
    user: User,
    groups: Iterable[Group],
    new_group: str,
    is_staff: bool,
    is_active: bool,
    quota: Limits | None,
) -> None:
    deactivated = user.is_active and not is_active
    user.is_staff, user.is_active = is_staff, is_active
    user.save(update_fields=["is_staff", "is_active"])
    if deactivated:
        # Their tokens and sessions stop working at once (they are checked on every request);
        # their open streams are told, or would relay on for as long as their jobs run.
        revocation.tell_streams_on_commit(user.pk)
    user.groups.set(_with_new_group(groups, new_group))
    set_user_quota(user, quota)


@transaction.atomic
def deactivate(user: User) -> None:
    """Take the user's access away, as unticking Active does: their tokens and sessions stop
    working at once, and their open streams are told (the directory's check signs people out
    through this)."""
    user.is_active = False
    user.save(update_fields=["is_active"])
    revocation.tell_streams_on_commit(user.pk)


def _with_new_group(groups: Iterable[Group], new_group: str) -> list[Group]:
    chosen = list(groups)
    if new_group:
        group, _ = Group.objects.get_or_create(name=new_group)
        chosen.append(group)
    return chosen


@transaction.atomic
def set_user_quota(user: User, limits: Limits | None) -> None:
    """Give the user a quota of their own, or (None) take it away: the default then applies.
    Jobs already admitted keep running; the new limits bind their next submissions."""
    if limits is None:
        Quota.objects.filter(user=user).delete()
    else:
        Quota.objects.update_or_create(user=user, defaults=asdict(limits))


@transaction.atomic
def set_group_quota(
    group: Group, limits: Limits | None, default_time_limit: int | None = None
) -> None:
    """A quota the group's members share, or (None) none: the group then binds nobody. With
    it, `default_time_limit` (seconds) is what its members' jobs that set no limit get."""
    if limits is None:
        Quota.objects.filter(group=group).delete()
    else:
        Quota.objects.update_or_create(
            group=group, defaults={**asdict(limits), "default_time_limit": default_time_limit}
        )


@transaction.atomic
def change_password(user: User, password: str | None, keep_tokens: bool = False) -> int:
    """Set the user's password (None: no usable password, they cannot log in with one).

    Their other sessions end (Django's session hash changes with the password) and so do their
    API tokens, unless they keep them: someone who changes a password because it leaked must
    not leave a token made with it working. Every stream opened with what ended closes.
    Returns how many tokens were revoked.
    """
    if password is None:
        user.set_unusable_password()
    else:
        user.set_password(password)
    user.save(update_fields=["password"])
    revoked = 0 if keep_tokens else tokens.revoke_all(user)
    revocation.tell_streams_on_commit(user.pk)
    return revoked
