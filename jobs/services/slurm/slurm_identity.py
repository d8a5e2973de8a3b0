"""Who a Slurm pool's job runs as: the console's own Unix user, or, on a pool that runs jobs as
their owners (SlurmPool.run_as_owner), the owner's Unix account (UnixAccount, set by an admin).

The account is resolved on the console host, which a site makes a submit host with the same
users as its nodes (LDAP, sssd). The console (root) then submits the job in one of two ways
(TRAINYARD_SLURM_SUBMIT_AS, found out by `submits_with_options` where "auto"):
- "options": sbatch --uid/--gid, which Slurm 22.05 takes from root;
- "person": sbatch itself runs as the person (their uid, primary gid and groups; no shell, no
  PAM session), for releases whose sbatch has no --uid: Slurm takes the person from munge's
  credential, as for a job they submit at a login node.
Either way Slurm runs the job as that user, so squeue, sacct, fair share, per-user limits and
DisableRootJobs see the person. Never root and never a system account, whatever an admin
typed: a uid below the host's UID_MIN is refused.
"""

import functools
import subprocess
from dataclasses import dataclass

from django.conf import settings
from django.contrib.auth.models import User

from jobs.models import UnixAccount
from jobs.services import identity as unix_identity
from jobs.services.slurm.slurm_client import (
    CLIENT_TIMEOUT_SECONDS,
    RunAs,
    SlurmRefused,
    SlurmTarget,
    SlurmUnavailable,
)


@dataclass(frozen=True)
class Identity:
    name: str
    uid: int
    gid: int
    account: str  # sbatch --account; "" leaves the pool's
    groups: tuple[int, ...] = ()  # supplementary groups, as at the person's login
    home: str = "/"

    def run_as(self) -> RunAs:
        return RunAs(self.uid, self.gid, self.groups or (self.gid,), self.home)


class NoIdentity(SlurmRefused):
    """The job's owner has no usable Unix account; the message says why and what to do."""


def identity_of(user: User) -> Identity:
    """The owner's Unix account, resolved here. Raises NoIdentity."""
    account = UnixAccount.objects.filter(user=user).first()
    if account is None:
        raise NoIdentity(
            f"{user.get_username()} has no Unix account for this pool, whose jobs run as their "
            "owners: an admin sets one (admin → Unix accounts)"
        )
    try:
        found = unix_identity.resolve(account)
    except unix_identity.NoUnixIdentity as exc:
        raise NoIdentity(str(exc)) from None
    return Identity(
        account.username, found.uid, found.gid, account.slurm_account, found.groups, found.home
    )


def submits_with_options(target: SlurmTarget) -> bool:
    """Whether a person's job goes to sbatch as --uid/--gid from root (True) or by running
    sbatch as the person (False): TRAINYARD_SLURM_SUBMIT_AS, or where "auto", whether the
    cluster's sbatch lists --uid in its help."""
    mode = settings.TRAINYARD_SLURM_SUBMIT_AS
    if mode != "auto":
        return mode == "options"
    return _sbatch_lists_uid(tuple(sorted(target.environment().items())))


@functools.cache
def _sbatch_lists_uid(environment: tuple[tuple[str, str], ...]) -> bool:
    # Once per process and client environment: the help of the sbatch found on that PATH.
    try:
        shown = subprocess.run(
            ["sbatch", "--help"],
            env=dict(environment),
            capture_output=True,
            text=True,
            timeout=CLIENT_TIMEOUT_SECONDS,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SlurmUnavailable(f"sbatch --help could not run: {exc}") from None
    if shown.returncode != 0:
        # Not an answer (no slurm.conf to be read, say), so not kept: asked again next time.
        words = " ".join(shown.stderr.split()) or f"exited with code {shown.returncode}"
        raise SlurmUnavailable(f"sbatch --help: {words}")
    return "--uid" in shown.stdout
