"""Who a Slurm pool's job runs as: the console's own Unix user, or, on a pool that runs jobs as
their owners (SlurmPool.run_as_owner), the owner's Unix account (UnixAccount, set by an admin).

The account is resolved on the console host, which a site makes a submit host with the same
users as its nodes (LDAP, sssd): its uid and primary gid go to sbatch as --uid/--gid, which
Slurm 22.05 takes from root (the console must then run as root; Slurm's later releases dropped
the options: docs/slurm.md says what to do there). Slurm then runs the job as that user, so
squeue, sacct, fair share, per-user limits and DisableRootJobs see the person. Never root and
never a system account, whatever an admin typed: a uid below the host's UID_MIN is refused.
"""

import pwd
import re
from dataclasses import dataclass
from pathlib import Path

from django.contrib.auth.models import User

from jobs.models import UnixAccount
from jobs.services.slurm.slurm_client import SlurmRefused

LOGIN_DEFS = Path("/etc/login.defs")
DEFAULT_UID_MIN = 1000


@dataclass(frozen=True)
class Identity:
    name: str
    uid: int
    gid: int
    account: str  # sbatch --account; "" leaves the pool's


class NoIdentity(SlurmRefused):
    """The job's owner has no usable Unix account; the message says why and what to do."""


def uid_min(login_defs: Path = LOGIN_DEFS) -> int:
    """The lowest uid of a person's account on this host (login.defs' UID_MIN)."""
    try:
        text = login_defs.read_text()
    except OSError:
        return DEFAULT_UID_MIN
    found = re.search(r"^\s*UID_MIN\s+(\d+)", text, re.MULTILINE)
    return int(found.group(1)) if found else DEFAULT_UID_MIN


def identity_of(user: User) -> Identity:
    """The owner's Unix account, resolved here. Raises NoIdentity."""
    account = UnixAccount.objects.filter(user=user).first()
    if account is None:
        raise NoIdentity(
            f"{user.get_username()} has no Unix account for this pool, whose jobs run as their "
            "owners: an admin sets one (admin → Unix accounts)"
        )
    try:
        entry = pwd.getpwnam(account.username)
    except KeyError:
        raise NoIdentity(
            f"the Unix account {account.username!r} of {user.get_username()} does not exist on "
            "the console host (a Slurm submit host knows the cluster's users)"
        ) from None
    lowest = uid_min()
    if entry.pw_uid < lowest:
        raise NoIdentity(
            f"the Unix account {account.username!r} has uid {entry.pw_uid}: root and system "
            f"accounts (uid below {lowest}) never run jobs"
        )
    return Identity(account.username, entry.pw_uid, entry.pw_gid, account.slurm_account)
