"""Who a person is, as their profile page tells them: how they sign in (the organisation's
directory, or a password of this console's), their groups, and the Unix identity their jobs
run as where a job runs as its owner, with where that identity came from."""

import os
import pwd
from dataclasses import dataclass

from django.contrib.auth.models import User

from jobs.models import DirectoryAccount, UnixAccount
from workers import unixids
from workers.sandbox import DEFAULT_UID_BASE


class NoUnixIdentity(ValueError):
    """The person's Unix account cannot run jobs; the message says why and what to do."""


@dataclass(frozen=True)
class Resolved:
    """A person's Unix identity, as jobs run as it."""

    uid: int
    gid: int
    groups: tuple[int, ...]  # the primary group first, as initgroups makes them
    home: str = "/"


def resolve(account: UnixAccount) -> Resolved:
    """The account's numbers: the directory's (or an admin's) where stored, else what the
    console host's passwd (sssd) says of its name. Never root nor a system account, whatever
    the directory or an admin said. Raises NoUnixIdentity."""
    whose = account.user.get_username()
    lowest = unixids.uid_min()
    if account.uid is not None and account.gid is not None:
        # The directory's numbers (or an admin's): the console host need not know the person.
        if refusal := unixids.system_account_refusal(account.uid, lowest, whose):
            raise NoUnixIdentity(refusal)
        user = unixids.own_user(account.uid, account.gid, [int(g) for g in account.groups])
        return Resolved(user.uid, user.gid, user.groups)
    try:
        entry = pwd.getpwnam(account.username)
    except KeyError:
        raise NoUnixIdentity(
            f"the Unix account {account.username!r} of {whose} does not exist on the console "
            "host (a Slurm submit host knows the cluster's users)"
        ) from None
    if refusal := unixids.system_account_refusal(entry.pw_uid, lowest, whose):
        raise NoUnixIdentity(refusal)
    groups = tuple(os.getgrouplist(entry.pw_name, entry.pw_gid))
    user = unixids.own_user(entry.pw_uid, entry.pw_gid, groups)
    return Resolved(user.uid, user.gid, user.groups, entry.pw_dir or "/")


def unix_identity_of(user: User) -> Resolved | None:
    """The identity the person's jobs run as, None where they have no Unix account (their
    trainers then get a uid of Trainyard's own). Raises NoUnixIdentity."""
    account = UnixAccount.objects.filter(user=user).select_related("user").first()
    return None if account is None else resolve(account)


@dataclass(frozen=True)
class UnixIdentity:
    name: str
    uid: int | None  # None: the console host looks the name up (its passwd, sssd)
    gid: int | None
    groups: tuple[int, ...]
    source: str  # "the directory" or "an admin"


@dataclass(frozen=True)
class Profile:
    signs_in_through: str  # the directory entry's DN (or OIDC subject), "": a password of ours
    via: str  # "ldap", "oidc" or "" (a password of this console's)
    groups: tuple[str, ...]
    unix: UnixIdentity | None
    # The uid of Trainyard's own a node's sandbox gives the person's trainers (an agent's
    # --uid-base may differ: this is the default's).
    sandbox_uid: int


def _source(account: UnixAccount, directory: DirectoryAccount | None) -> str:
    if not account.from_directory:
        return "an admin"
    return "the single sign-on" if directory and directory.via == "oidc" else "the directory"


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
            _source(account, directory),
        )
    return Profile(
        directory.dn if directory is not None else "",
        directory.via if directory is not None else "",
        tuple(user.groups.order_by("name").values_list("name", flat=True)),
        unix,
        DEFAULT_UID_BASE + user.pk,
    )
