"""Slurm's client commands, run for one cluster, and what their failures mean.

Every Slurm command the console runs goes through `run_client` (an argv, never a shell), with
the cluster's environment and nothing of the console's. A failure is one of two kinds, and the
difference decides a job's fate:

- **SlurmUnavailable**: Slurm could not be asked (its commands missing or hung, the controller
  down or unreachable, munge failing). Nothing about the job is known: it stays queued, with a
  reason that says so, and the next pass asks again. Admission refuses nothing for it.
- **SlurmRefused**: Slurm answered, and said no (an invalid account, a limit of a QOS, a
  request the partition can never hold). Only this fails a job, with Slurm's words.
"""

import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from workers.sandbox import SHARED_ENV as SANDBOX_SHARED_ENV

# sbatch and squeue answer in well under a second; a controller that does not answer within
# this is as good as down for this pass.
CLIENT_TIMEOUT_SECONDS = 60

# What Slurm's commands print when they could not reach the controller or authenticate, not
# when the controller refused something (slurm_errno.c's strings, lower-cased): "Unable to
# contact slurm controller (connect failure)", "Socket timed out on send/recv operation",
# "Zero Bytes were transmitted or received", munge's "Munge encode failed: …", "Slurm
# temporarily unable to accept job", "Slurm backup controller in standby mode", ….
UNAVAILABLE_WORDS = (
    "unable to contact slurm controller",
    "socket timed out",
    "zero bytes were transmitted or received",
    "communication connection failure",
    "connection refused",
    "connection timed out",
    "no route to host",
    "network is unreachable",
    "munge",
    "protocol authentication error",
    "authentication failure",
    "temporarily unable",
    "temporarily unavailable",
    "standby mode",
    "slurmctld",
    "unable to establish",
)


class SlurmError(RuntimeError):
    """Slurm refused or could not be reached; the message is Slurm's own, on one line."""


class SlurmUnavailable(SlurmError):
    """Slurm could not be asked: its commands failed to run, or the controller did not answer."""


class SlurmRefused(SlurmError):
    """Slurm answered and refused: the request itself is at fault."""


def error_of(words: str) -> SlurmError:
    """The kind of error a failed Slurm command's message is."""
    lowered = words.lower()
    if any(marker in lowered for marker in UNAVAILABLE_WORDS):
        return SlurmUnavailable(words)
    return SlurmRefused(words)


@dataclass(frozen=True)
class SlurmTarget:
    """How to reach one Slurm cluster and what its nodes share."""

    partition: str  # the pool's partitions, Slurm's comma-separated list
    shared_root: Path  # the same path on the console host and on every node
    python: str  # an interpreter with Trainyard's `workers` package, at this path on every node
    code_root: Path  # the code root jobs' {"path": ...} programs are under, as the nodes see it
    client_env: dict[str, str] = field(default_factory=dict)  # SLURM_CONF and the like
    # What every job of the pool is sent with unless it chooses otherwise (SlurmPool's site
    # options, by sbatch's names: account, qos, constraint, reservation, exclusive).
    site_defaults: dict[str, str | bool] = field(default_factory=dict)
    # Jobs run as their owners' Unix accounts (slurm_identity), not as the console's user.
    run_as_owner: bool = False

    def environment(self) -> dict[str, str]:
        """The Slurm commands' environment: what they and the job's steps need, never the
        console's own (its REDIS_URL holds Redis's administrator password): sbatch gives the
        job what it is run with, and slurmctld keeps that in its saved state."""
        source = {**os.environ, **self.client_env}
        return {name: source[name] for name in SLURM_CLIENT_NAMES if name in source}

    def exported_names(self) -> tuple[str, ...]:
        """The names the batch script and its steps get besides Slurm's own SLURM_* variables:
        those of STEP_NAMES that the Slurm commands are run with."""
        environment = self.environment()
        return tuple(name for name in STEP_NAMES if name in environment)

    def exported(self) -> str:
        """--export for sbatch and for srun in the batch script: the exported names, no more."""
        return ",".join(self.exported_names()) or "NONE"


# What the Slurm commands are run with: how to find them and the cluster, and the locale.
SLURM_CLIENT_NAMES = ("PATH", "LANG", "LC_ALL", "TZ", "HOME", "SLURM_CONF", SANDBOX_SHARED_ENV)
# Of those, what the batch script and the step wrapper need on the nodes: PATH to find srun
# and the trainers' tools; the folders shared with every sandbox (workers/sandbox.py).
STEP_NAMES = ("PATH", "LANG", "LC_ALL", "TZ", SANDBOX_SHARED_ENV)


@dataclass(frozen=True)
class RunAs:
    """A person a client command runs as (sbatch of their job, where it has no --uid)."""

    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str


def run_client(
    argv: list[str], target: SlurmTarget, umask: int = -1, run_as: RunAs | None = None
) -> subprocess.CompletedProcess[str]:
    """Run one of Slurm's client commands for the target's cluster (with `umask`, where given:
    sbatch hands its own to the job; as `run_as`, where given: Slurm then takes the person
    from munge's credential). Raises SlurmUnavailable or SlurmRefused (error_of) with Slurm's
    words on one line."""
    env = target.environment()
    if run_as is not None:
        env["HOME"] = run_as.home
    try:
        done = subprocess.run(
            argv,
            env=env,
            capture_output=True,
            text=True,
            timeout=CLIENT_TIMEOUT_SECONDS,
            check=False,
            umask=umask,
            user=run_as.uid if run_as else None,
            group=run_as.gid if run_as else None,
            extra_groups=list(run_as.groups) if run_as else None,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SlurmUnavailable(f"{argv[0]} could not run: {exc}") from None
    if done.returncode != 0:
        words = " ".join(done.stderr.split()) or f"{argv[0]} exited with code {done.returncode}"
        raise error_of(words.removeprefix(f"{argv[0]}: error: "))
    return done
