"""Who a person is, as their profile page tells them: how they sign in (the organisation's
directory, or a password of this console's), their groups, and the Unix identity their jobs
run as where a job runs as its owner, with where that identity came from."""

from dataclasses import dataclass

from django.contrib.auth.models import User

from jobs.models import DirectoryAccount, UnixAccount
from workers.sandbox import DEFAULT_UID_BASE


@dataclass(frozen=True)
class UnixIdentity:
    name: str
    uid: int | None  # None: the console host looks the name up (its passwd, sssd)
    gid: int | None
    groups: tuple[int, ...]
    source: str  # "the directory" or "an admin"


@dataclass(frozen=True)
class Profile:
    signs_in_through: str  # the directory entry's DN, or "" for a password of this console's
    groups: tuple[str, ...]
    unix: UnixIdentity | None
    # The uid of Trainyard's own a node's sandbox gives the person's trainers (an agent's
    # --uid-base may differ: this is the default's).
    sandbox_uid: int


def profile_of(user: User) -> Profile:
    directory = DirectoryAccount.objects.filter(user=user).first()
    account = UnixAccount.objects.filter(user=user).first()
    unix = None
    if account is not None:
        unix = UnixIdentity(
            account.username,
            account.uid,
            account.gid,
            tuple(int(g) for g in account.groups),
            "the directory" if account.from_directory else "an admin",
        )
    return Profile(
        directory.dn if directory is not None else "",
        tuple(user.groups.order_by("name").values_list("name", flat=True)),
        unix,
        DEFAULT_UID_BASE + user.pk,
    )
