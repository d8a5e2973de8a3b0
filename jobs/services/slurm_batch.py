"""A Trainyard job as one Slurm job: its components, its plan, its batch script, its sbatch.

A PyTorch job whose roles share one package is one allocation of one task per instance; where
packages differ, and always for a parameter-server job, it is a heterogeneous job with one
component per role (scheduler, servers, workers), each with its own package's resources. Either
way one `srun` over every component starts `workers.slurmstep` once per instance, and task
SLURM_PROCID runs the spec of that rank (jobs.services.dispatch.specs_in_rank_order: components
and tasks come in the same order, so the numbering agrees).

Everything a node needs lies in the attempt's folder on the shared file system Slurm sites have
(`<shared root>/jobs/<job id>/attempt-<n>/`): plan.json, the batch script, Slurm's output and
each instance's outcome. The checkpoint folder is shared by every attempt
(`<shared root>/checkpoints/<checkpoint key>`), which is what resumes a restart.

The batch script is Python (`#!<python>`), not a shell script: it execs srun with an argv
list. Nothing of the user's (name, arguments, variables) reaches a command line: they travel
in plan.json.
"""

import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from jobs.models import Job, Package
from jobs.services.dispatch import Slot, specs_in_rank_order
from jobs.services.submission import first_index

SBATCH_TIMEOUT_SECONDS = 60
JOB_NAME_PREFIX = "trainyard-"


class SlurmError(RuntimeError):
    """Slurm refused or could not be reached; the message is Slurm's own, on one line."""


@dataclass(frozen=True)
class SlurmTarget:
    """How to reach one Slurm cluster and what its nodes share."""

    partition: str
    shared_root: Path  # the same path on the console host and on every node
    python: str  # an interpreter with Trainyard's `workers` package, at this path on every node
    code_root: Path  # the code root jobs' {"path": ...} programs are under, as the nodes see it
    client_env: dict[str, str] = field(default_factory=dict)  # SLURM_CONF and the like

    def environment(self) -> dict[str, str]:
        return {**os.environ, **self.client_env}


@dataclass(frozen=True)
class Component:
    """One part of the allocation: its roles, their package and how many tasks."""

    roles: tuple[str, ...]
    package: Package
    tasks: int


def components(job: Job) -> list[Component]:
    roles = sorted(job.roles.select_related("package"), key=lambda r: _role_order(job, r.role))
    if not job.kvstore and len({r.package_id for r in roles}) == 1:
        return [
            Component(
                tuple(r.role for r in roles), roles[0].package, sum(r.instances for r in roles)
            )
        ]
    return [Component((r.role,), r.package, r.instances) for r in roles]


def _role_order(job: Job, role: str) -> int:
    if job.kvstore:
        return {"scheduler": 0, "server": 1, "worker": 2}[role]
    return 0 if role == "master" else 1


def slots(job: Job) -> list[Slot]:
    found = []
    for role in job.roles.select_related("package"):
        first = first_index(role.role, bool(job.kvstore))
        found += [Slot(role.role, first + i, role.package) for i in range(role.instances)]
    return found


def attempt_folder(target: SlurmTarget, job: Job) -> Path:
    return target.shared_root / "jobs" / str(job.pk) / f"attempt-{job.attempt}"


def checkpoint_folder(target: SlurmTarget, job: Job) -> Path:
    return target.shared_root / "checkpoints" / job.checkpoint_key


def write_plan(job: Job, target: SlurmTarget) -> Path:
    folder = attempt_folder(target, job)
    folder.mkdir(parents=True, exist_ok=True)
    plan = {
        "job_id": job.pk,
        "attempt": job.attempt,
        "specs": [spec.to_dict() for spec in specs_in_rank_order(job, slots(job))],
        "code_root": str(target.code_root),
        "checkpoint_dir": str(checkpoint_folder(target, job)),
        "python": target.python,
    }
    path = folder / "plan.json"
    path.write_text(json.dumps(plan, indent=1))
    return path


def write_batch_script(job: Job, target: SlurmTarget, plan: Path) -> Path:
    """A Python batch script that execs one srun over every component."""
    groups = len(components(job))
    srun = ["srun", "--kill-on-bad-exit=1", "--unbuffered"]
    if groups > 1:
        srun.append("--het-group=" + ",".join(str(i) for i in range(groups)))
    srun += [target.python, "-m", "workers.slurmstep", "--plan", str(plan)]
    script = plan.parent / "batch.py"
    script.write_text(
        f"#!{target.python}\n"
        f"# Trainyard job {job.pk}, attempt {job.attempt}: one srun starts every instance.\n"
        "import os\n"
        f"os.execvp('srun', {srun!r})\n"
    )
    script.chmod(0o755)
    return script


def sbatch_argv(job: Job, target: SlurmTarget, script: Path) -> list[str]:
    folder = script.parent
    argv = [
        "sbatch",
        "--parsable",
        f"--job-name={JOB_NAME_PREFIX}{job.pk}",
        f"--partition={target.partition}",
        f"--output={folder / 'slurm-%j.out'}",
        f"--chdir={folder}",
        # A failed node fails the job: Trainyard, not Slurm, decides on a restart.
        "--no-requeue",
    ]
    for number, component in enumerate(components(job)):
        if number:
            argv.append(":")
        argv += [
            f"--ntasks={component.tasks}",
            f"--cpus-per-task={component.package.cpu}",
            f"--mem-per-cpu={_mem_per_cpu_mb(component.package)}M",
        ]
        if component.package.gpus:
            argv.append(f"--gpus-per-task={component.package.gpus}")
    argv.append(str(script))
    return argv


def _mem_per_cpu_mb(package: Package) -> int:
    return max(1, package.memory_gb * 1024 // max(1, package.cpu))


def submit(job: Job, target: SlurmTarget) -> str:
    """sbatch the job's current attempt; Slurm's job id. Raises SlurmError with Slurm's words."""
    plan = write_plan(job, target)
    script = write_batch_script(job, target, plan)
    argv = sbatch_argv(job, target, script)
    check_fits(argv, target)
    done = run_client(argv, target)
    return done.stdout.strip().split(";")[0]


def check_fits(argv: list[str], target: SlurmTarget) -> None:
    """Refuse a job the partition could never hold, before it is queued: Slurm would accept it
    and keep it waiting for ever (reason PartitionConfig). `sbatch --test-only` asks the
    scheduler without queuing anything."""
    try:
        run_client([argv[0], "--test-only", *argv[1:]], target)
    except SlurmError as exc:
        words = str(exc).removeprefix("allocation failure: ")
        raise SlurmError(
            f"Slurm's partition {target.partition!r} can never hold this job: {words}"
        ) from None


def run_client(argv: list[str], target: SlurmTarget) -> subprocess.CompletedProcess[str]:
    try:
        done = subprocess.run(
            argv,
            env=target.environment(),
            capture_output=True,
            text=True,
            timeout=SBATCH_TIMEOUT_SECONDS,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SlurmError(f"{argv[0]} could not run: {exc}") from None
    if done.returncode != 0:
        words = " ".join(done.stderr.split()) or f"{argv[0]} exited with code {done.returncode}"
        raise SlurmError(words.removeprefix(f"{argv[0]}: error: "))
    return done
