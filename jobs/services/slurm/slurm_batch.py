"""A Trainyard job as one Slurm job: its components, its plan, its batch script, its sbatch.

A PyTorch job whose roles share one package is one allocation of one task per instance; where
packages differ, and always for a parameter-server job, it is a heterogeneous job with one
component per role (scheduler, servers, workers), each with its own package's resources. Either
way one `srun` over every component starts `workers.slurmstep` once per instance, and task
SLURM_PROCID runs the spec of that rank (jobs.services.lifecycle.dispatch.specs_in_rank_order:
components and tasks come in the same order, so the numbering agrees).

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
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings

from jobs.models import CodeSnapshot, Job, Package, SlurmPool
from jobs.services.lifecycle.dispatch import Slot, specs_in_rank_order
from jobs.services.totals import RoleRequest
from workers import contract, snapshot
from workers.sandbox import SHARED_ENV as SANDBOX_SHARED_ENV

# A parameter-server job's scheduler: what the platform gives it (it is not charged).
SCHEDULER_MEMORY_MB = 1024

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


def target_of(pool: SlurmPool) -> SlurmTarget:
    return SlurmTarget(
        partition=pool.partition,
        shared_root=Path(pool.shared_root),
        python=pool.python,
        code_root=Path(pool.code_root or settings.TRAINYARD_CODE_ROOT),
        client_env={"SLURM_CONF": pool.slurm_conf} if pool.slurm_conf else {},
    )


@dataclass(frozen=True)
class Component:
    """One part of the allocation: its roles, their package and how many tasks. The package
    is None for a parameter-server job's scheduler, which the platform adds uncharged: one
    core and SCHEDULER_MEMORY_MB, as the agents give it beside server-0."""

    roles: tuple[str, ...]
    package: Package | None
    tasks: int

    @property
    def cpus(self) -> int:
        return self.package.cpu if self.package else 1

    @property
    def memory_mb(self) -> int:
        return self.package.memory_gb * 1024 if self.package else SCHEDULER_MEMORY_MB


ROLE_ORDER = {"scheduler": 0, "server": 1, "worker": 2, "master": 0}


def components_of(roles: list[RoleRequest], kvstore: bool) -> list[Component]:
    """The components of a job of these roles: one for a PyTorch job whose roles share a
    package, else one per role (the scheduler first for a parameter-server job)."""
    ordered = sorted(roles, key=lambda r: ROLE_ORDER.get(r.role, 1))
    if not kvstore and len({r.package.pk for r in ordered}) == 1:
        return [
            Component(
                tuple(r.role for r in ordered),
                ordered[0].package,
                sum(r.instances for r in ordered),
            )
        ]
    found = [Component((r.role,), r.package, r.instances) for r in ordered]
    if kvstore and not any(r.role == "scheduler" for r in ordered):
        found.insert(0, Component(("scheduler",), None, 1))
    return found


def role_requests(job: Job) -> list[RoleRequest]:
    return [
        RoleRequest(r.role, r.package, r.instances) for r in job.roles.select_related("package")
    ]


def components(job: Job) -> list[Component]:
    return components_of(role_requests(job), bool(job.kvstore))


def slots(job: Job) -> list[Slot]:
    """Every instance of the job, the platform's scheduler included."""
    found = []
    for component in components(job):
        for role in component.roles:
            instances = next((r.instances for r in role_requests(job) if r.role == role), 1)
            first = contract.first_index(role, bool(job.kvstore))
            found += [Slot(role, first + i, component.package) for i in range(instances)]
    return found


def jobs_folder(target: SlurmTarget) -> Path:
    return target.shared_root / "jobs"


def attempt_folder(target: SlurmTarget, job: Job, attempt: int | None = None) -> Path:
    """The folder of the job's current attempt (or of attempt number `attempt`)."""
    number = job.attempt if attempt is None else attempt
    return jobs_folder(target) / str(job.pk) / f"attempt-{number}"


def checkpoint_folder(target: SlurmTarget, job: Job) -> Path:
    return target.shared_root / "checkpoints" / job.checkpoint_key


def write_plan(job: Job, target: SlurmTarget, redis_url: str = "") -> Path:
    """The plan of the job's current attempt; with `redis_url`, the job's own Redis user's URL
    in a file beside it that only its owner (the Slurm job's user) may read."""
    folder = attempt_folder(target, job)
    folder.mkdir(parents=True, exist_ok=True)
    plan: dict[str, object] = {
        "job_id": job.pk,
        "attempt": job.attempt,
        "specs": [spec.to_dict() for spec in specs_in_rank_order(job, slots(job))],
        "code_root": str(code_root_for(job, target)),
        "checkpoint_dir": str(checkpoint_folder(target, job)),
        "python": target.python,
    }
    if redis_url:
        secret = folder / "credentials.url"
        secret.unlink(missing_ok=True)
        descriptor = os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as out:
            out.write(redis_url + "\n")
        plan["credentials"] = str(secret)
    path = folder / "plan.json"
    path.write_text(json.dumps(plan, indent=1))
    return path


def code_root_for(job: Job, target: SlurmTarget) -> Path:
    """Where the nodes find the job's script: its code snapshot, unpacked once on the shared
    file system (`<shared root>/code/<sha256>`, checked as an agent checks it), or the pool's
    code root."""
    sha256 = job.program.get("snapshot")
    if not sha256:
        return target.code_root
    if not snapshot.is_sha256(sha256):
        raise SlurmError(f"not a code snapshot: {sha256!r}")
    folder = target.shared_root / "code" / sha256
    if folder.is_dir():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder.parent, prefix=".unpacking-") as scratch:
        archive = Path(scratch) / "code.tar.gz"
        archive.write_bytes(bytes(CodeSnapshot.objects.get(sha256=sha256).archive))
        unpacked = Path(scratch) / "code"
        try:
            snapshot.unpack(archive, unpacked)
        except snapshot.SnapshotError as exc:
            raise SlurmError(f"the code snapshot cannot be unpacked: {exc}") from None
        # A rename on one file system: a node sees the whole folder or none. Another console
        # worker may have won the race; its copy is the same files.
        try:
            unpacked.rename(folder)
        except OSError:
            if not folder.is_dir():
                raise
    return folder


def write_batch_script(job: Job, target: SlurmTarget, plan: Path) -> Path:
    """A Python batch script that execs one srun over every component, with Slurm's own
    variables and the exported names alone.

    Any sbatch --export but ALL makes slurmd add the job user's login environment (`su -`
    on the batch node) to the batch script's; the script drops it, so that srun runs with
    what sbatch sent. srun's own --export (rather than the SLURM_EXPORT_ENV sbatch sets)
    keeps the steps to those names even where the script is submitted some other way."""
    groups = len(components(job))
    srun = ["srun", "--kill-on-bad-exit=1", "--unbuffered", f"--export={target.exported()}"]
    if groups > 1:
        srun.append("--het-group=" + ",".join(str(i) for i in range(groups)))
    srun += [target.python, "-m", "workers.slurmstep", "--plan", str(plan)]
    script = plan.parent / "batch.py"
    script.write_text(
        f"#!{target.python}\n"
        f"# Trainyard job {job.pk}, attempt {job.attempt}: one srun starts every instance.\n"
        "import os\n"
        "# Slurm's variables (SLURM_*, SLURMD_NODENAME) and what the console exported, no\n"
        "# more: not the login environment slurmd adds to a job that exports a list.\n"
        f"exported = {target.exported_names()!r}\n"
        "env = {k: v for k, v in os.environ.items() if k.startswith('SLURM') or k in exported}\n"
        f"os.execvpe('srun', {srun!r}, env)\n"
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
        # Only these variables reach the job, and slurmctld's saved state: none of the
        # console's (the job's own reach its trainers through plan.json).
        f"--export={target.exported()}",
    ]
    argv += resource_options(components(job))
    argv.append(str(script))
    return argv


def resource_options(parts: list[Component]) -> list[str]:
    """sbatch's options for each component, separated by ":" (a heterogeneous job)."""
    options: list[str] = []
    for number, component in enumerate(parts):
        if number:
            options.append(":")
        options += [
            f"--ntasks={component.tasks}",
            f"--cpus-per-task={component.cpus}",
            f"--mem-per-cpu={max(1, component.memory_mb // component.cpus)}M",
        ]
        if component.package is not None and component.package.gpus:
            options.append(f"--gpus-per-task={component.package.gpus}")
    return options


def why_never_runs(roles: list[RoleRequest], kvstore: bool, target: SlurmTarget) -> str:
    """Why the pool's partition could never hold a job of these roles ("" when it could), as
    Slurm says it; asked before admission, with a probe script (`sbatch --test-only` queues
    nothing). Raises SlurmError when Slurm cannot be asked."""
    probe = target.shared_root / "probe.py"
    if not probe.exists():
        target.shared_root.mkdir(parents=True, exist_ok=True)
        probe.write_text("#!/bin/false\n# Trainyard's admission asks Slurm with this script.\n")
    argv = [
        "sbatch",
        f"--partition={target.partition}",
        *resource_options(components_of(roles, kvstore)),
        str(probe),
    ]
    try:
        check_fits(argv, target)
    except SlurmError as exc:
        if "could not run" in str(exc):
            raise
        return str(exc)
    return ""


def submit(job: Job, target: SlurmTarget, redis_url: str = "") -> str:
    """sbatch the job's current attempt; Slurm's job id. Raises SlurmError with Slurm's words."""
    plan = write_plan(job, target, redis_url)
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
