"""A Trainyard job as one Slurm job: its components, its plan, its batch script, its sbatch.

A job whose roles share one package is one allocation of one task per instance (a
parameter-server job's scheduler then takes one task of that package too); where packages
differ it is a heterogeneous job with one component per role (scheduler, servers, workers), each
with its own package's resources. One component where it can be, because Slurm never puts two
components of a heterogeneous job on one node: a scheduler, one server and two workers would
need three nodes at least, however small they are (slurm_fit checks that rule). Either
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
import math
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from jobs.models import CodeSnapshot, Job, Package, SlurmPool
from jobs.services.lifecycle.dispatch import Slot, specs_in_rank_order
from jobs.services.slurm import slurm_choices, slurm_fit, slurm_identity
from jobs.services.slurm.slurm_choices import SlurmChoices
from jobs.services.slurm.slurm_client import SlurmRefused, SlurmTarget, run_client
from jobs.services.slurm.slurm_identity import Identity
from jobs.services.totals import RoleRequest
from workers import contract, jobfiles, snapshot

# A parameter-server job's scheduler: what the platform gives it (it is not charged).
SCHEDULER_MEMORY_MB = 1024

JOB_NAME_PREFIX = "trainyard-"


def target_of(pool: SlurmPool) -> SlurmTarget:
    return SlurmTarget(
        partition=pool.partition,
        shared_root=Path(pool.shared_root),
        python=pool.python,
        code_root=Path(pool.code_root or settings.TRAINYARD_CODE_ROOT),
        client_env={"SLURM_CONF": pool.slurm_conf} if pool.slurm_conf else {},
        site_defaults={
            "account": pool.account,
            "qos": pool.qos,
            "constraint": pool.constraint,
            "reservation": pool.reservation,
            "exclusive": pool.exclusive,
        },
        run_as_owner=pool.run_as_owner,
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

    @property
    def memory_per_cpu_mb(self) -> int:
        """--mem-per-cpu: Slurm's memory is per CPU (so that it scales with --cpus-per-task);
        the package's memory divided by its cores, rounded down to whole MB."""
        return max(1, self.memory_mb // self.cpus)

    @property
    def gpus(self) -> int:
        return self.package.gpus if self.package else 0

    @property
    def gpu_type(self) -> str:
        return gres_type(self.package.gpu_model) if self.package and self.gpus else ""

    def demand(self, one_per_node: bool = False) -> slurm_fit.Demand:
        package = f" ({self.package.name})" if self.package else ""
        return slurm_fit.Demand(
            label=f"the {'/'.join(self.roles)}{package}",
            tasks=self.tasks,
            cpus=self.cpus,
            memory_mb=self.memory_per_cpu_mb * self.cpus,
            gpus=self.gpus,
            gpu_type=self.gpu_type,
            one_per_node=one_per_node,
        )


def gres_type(gpu_model: str) -> str:
    """A package's GPU model as a Slurm GRES type: "A100" → "a100", "RTX 6000" → "rtx_6000"
    (the name a site gives its GPUs in gres.conf; docs/slurm.md). Empty: any GPU."""
    return re.sub(r"[^a-z0-9_.-]+", "_", gpu_model.strip().lower()).strip("_")


ROLE_ORDER = {"scheduler": 0, "server": 1, "worker": 2, "master": 0}


def components_of(roles: list[RoleRequest], kvstore: bool) -> list[Component]:
    """The components of a job of these roles: one where its roles share a package (a
    parameter-server job's scheduler included, first), else one per role (the scheduler first
    for a parameter-server job)."""
    ordered = sorted(roles, key=lambda r: ROLE_ORDER.get(r.role, 1))
    if len({r.package.pk for r in ordered}) == 1:
        scheduler = ("scheduler",) if kvstore and ordered[0].role != "scheduler" else ()
        return [
            Component(
                scheduler + tuple(r.role for r in ordered),
                ordered[0].package,
                len(scheduler) + sum(r.instances for r in ordered),
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


def write_plan(
    job: Job, target: SlurmTarget, redis_url: str = "", identity: Identity | None = None
) -> Path:
    """The plan of the job's current attempt; with `redis_url`, the job's own Redis user's URL
    in a file beside it that only its owner (the Slurm job's user: `identity`, on a pool whose
    jobs run as their owners) may read."""
    folder = attempt_folder(target, job)
    folder.mkdir(parents=True, exist_ok=True)
    plan: dict[str, object] = {
        "job_id": job.pk,
        "attempt": job.attempt,
        "specs": [spec.to_dict() for spec in specs_in_rank_order(job, slots(job))],
        "code_root": str(code_root_for(job, target)),
        "checkpoint_dir": str(checkpoint_folder(target, job)),
        "python": target.python,
        # How long a step wrapper's heartbeat lasts in Redis (contract.alive_key): silent that
        # long, its instance is lost, as an agent's node is.
        "lost_seconds": settings.TRAINYARD_NODE_LOST_SECONDS,
    }
    if redis_url:
        secret = folder / "credentials.url"
        write_new(secret, redis_url + "\n", 0o600, identity)
        plan["credentials"] = str(secret)
    # It carries the job's variables: for the step wrapper (the Slurm job's user) alone.
    path = folder / "plan.json"
    write_new(path, json.dumps(plan, indent=1), 0o600, identity)
    return path


def write_new(path: Path, text: str, mode: int, owner: Identity | None = None) -> None:
    """Write `path` as a new file of `mode` (and of `owner`), whatever was there. On a pool
    whose jobs run as their owners a resubmitted attempt's folder is the person's, who may
    have put a link there: it is removed, never followed (O_EXCL | O_NOFOLLOW), and the mode
    and owner are set on the file written, not on whatever the name points to then."""
    path.unlink(missing_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    with os.fdopen(descriptor, "w") as out:
        if owner is not None:
            os.fchown(out.fileno(), owner.uid, owner.gid)
        os.fchmod(out.fileno(), mode)
        out.write(text)


def code_root_for(job: Job, target: SlurmTarget) -> Path:
    """Where the nodes find the job's script: its code snapshot, unpacked once on the shared
    file system (`<shared root>/code/<sha256>`, checked as an agent checks it), or the pool's
    code root."""
    sha256 = job.program.get("snapshot")
    if not sha256:
        return target.code_root
    if not snapshot.is_sha256(sha256):
        raise SlurmRefused(f"not a code snapshot: {sha256!r}")
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
            raise SlurmRefused(f"the code snapshot cannot be unpacked: {exc}") from None
        # A rename on one file system: a node sees the whole folder or none. Another console
        # worker may have won the race; its copy is the same files.
        try:
            unpacked.rename(folder)
        except OSError:
            if not folder.is_dir():
                raise
    return folder


def write_batch_script(
    job: Job, target: SlurmTarget, plan: Path, identity: Identity | None = None
) -> Path:
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
    write_new(
        script,
        f"#!{target.python}\n"
        f"# Trainyard job {job.pk}, attempt {job.attempt}: one srun starts every instance.\n"
        "import os\n"
        "# Slurm's variables (SLURM_*, SLURMD_NODENAME) and what the console exported, no\n"
        "# more: not the login environment slurmd adds to a job that exports a list.\n"
        f"exported = {target.exported_names()!r}\n"
        "env = {k: v for k, v in os.environ.items() if k.startswith('SLURM') or k in exported}\n"
        f"os.execvpe('srun', {srun!r}, env)\n",
        0o755,
        identity,
    )
    return script


def sbatch_argv(
    job: Job, target: SlurmTarget, script: Path, identity: Identity | None = None
) -> list[str]:
    """`identity`: the owner's, on a pool whose jobs run as their owners (--uid and --gid
    where sbatch is run as root with them, and the person's own --account before the
    pool's). The job's own choices (slurm_choices, checked at submission) replace the
    pool's."""
    folder = script.parent
    choices = SlurmChoices.of(job.slurm_options)
    options = slurm_choices.sbatch_options(
        target.site_defaults, choices, identity.account if identity else ""
    )
    if identity is not None and slurm_identity.submits_with_options(target):
        options = [f"--uid={identity.uid}", f"--gid={identity.gid}", *options]
    argv = [
        "sbatch",
        "--parsable",
        f"--job-name={JOB_NAME_PREFIX}{job.pk}",
        f"--partition={slurm_choices.partition_for(target.partition, choices)}",
        f"--output={folder / 'slurm-%j.out'}",
        f"--chdir={folder}",
        # A failed node fails the job: Trainyard, not Slurm, decides on a restart.
        "--no-requeue",
        # Only these variables reach the job, and slurmctld's saved state: none of the
        # console's (the job's own reach its trainers through plan.json).
        f"--export={target.exported()}",
        *options,
    ]
    if job.time_limit:
        argv.append(f"--time={slurm_minutes(job.time_limit)}")
    argv += resource_options(components(job), job.one_instance_per_node)
    argv.append(str(script))
    return argv


def slurm_minutes(time_limit: int) -> int:
    """--time for a job's limit (seconds): whole minutes, with the console's grace after it,
    so that the console's own stop (SIGTERM, the grace, SIGKILL; its reason "time limit of …
    reached") comes first and Slurm's TIMEOUT only backs it up. Both count from the start:
    Slurm's from the allocation, the console's from when the pass sees it running."""
    grace = settings.TRAINYARD_TIME_LIMIT_GRACE_SECONDS + settings.TRAINYARD_SLURM_SECONDS
    return max(1, math.ceil((time_limit + grace) / 60))


def resource_options(parts: list[Component], one_per_node: bool = False) -> list[str]:
    """sbatch's options for each component, separated by ":" (a heterogeneous job).
    `one_per_node`: each component's tasks on nodes of their own (its components never share
    a node: Slurm's rule), so no two instances of the job share one."""
    options: list[str] = []
    for number, component in enumerate(parts):
        if number:
            options.append(":")
        options += [
            f"--ntasks={component.tasks}",
            f"--cpus-per-task={component.cpus}",
            f"--mem-per-cpu={component.memory_per_cpu_mb}M",
        ]
        if one_per_node:
            options.append("--ntasks-per-node=1")
        if component.gpus:
            kind = f"{component.gpu_type}:" if component.gpu_type else ""
            options.append(f"--gpus-per-task={kind}{component.gpus}")
    return options


def why_never_runs(
    roles: list[RoleRequest],
    kvstore: bool,
    target: SlurmTarget,
    time_limit: int | None = None,
    partition: str = "",
    one_per_node: bool = False,
) -> str:
    """Why the pool's partitions (or the one chosen) could never hold a job of these roles
    ("" when one could), naming the limit; judged from the partitions' configuration,
    whatever their nodes' state now (slurm_fit). Raises SlurmUnavailable when Slurm cannot
    be asked."""
    demands = [c.demand(one_per_node) for c in components_of(roles, kvstore)]
    names = [partition] if partition else target.partition.split(",")
    refusals = []
    for name in names:
        refusal = slurm_fit.why_never_fits(
            slurm_fit.read_partition(target, name), demands, time_limit
        )
        if not refusal:
            return ""
        refusals.append(refusal)
    return f"{'; '.join(refusals)} (Slurm would keep it waiting for ever)"


def submit(job: Job, target: SlurmTarget, redis_url: str = "") -> str:
    """sbatch the job's current attempt; Slurm's job id. Raises SlurmRefused when the partition
    can never hold it or Slurm says no, SlurmUnavailable when Slurm cannot be asked."""
    identity = slurm_identity.identity_of(job.owner) if target.run_as_owner else None
    refusal = why_never_runs(
        role_requests(job),
        bool(job.kvstore),
        target,
        job.time_limit,
        SlurmChoices.of(job.slurm_options).partition,
        job.one_instance_per_node,
    )
    if refusal:
        raise SlurmRefused(refusal)
    if identity is not None:
        hand_over(job, target, identity)
    plan = write_plan(job, target, redis_url, identity)
    script = write_batch_script(job, target, plan, identity)
    # Slurm's output file is made with sbatch's umask: the job's lines, for its owner alone.
    # Where sbatch takes no --uid, it runs as the person (slurm_identity).
    as_person = identity is not None and not slurm_identity.submits_with_options(target)
    done = run_client(
        sbatch_argv(job, target, script, identity),
        target,
        umask=0o077,
        run_as=identity.run_as() if as_person and identity else None,
    )
    return done.stdout.strip().split(";")[0]


def hand_over(job: Job, target: SlurmTarget, identity: Identity) -> None:
    """The attempt's folder and the job's checkpoint folder to the owner's account, which the
    job runs as: its steps write their outcome, spool and scratch there. The console's own
    files in it (plan, credentials, batch script) are written as the person's by write_new.
    Nothing else in the folder is touched: on a resubmission it holds what the job made,
    where a hard link to another's file would hand that file over. The folders above stay
    the console's, so that what the job plants there can never be followed from them (the
    pass reads the wrapper's files with jobfiles, below the job's folder)."""
    for folder in (attempt_folder(target, job), checkpoint_folder(target, job)):
        folder.mkdir(parents=True, exist_ok=True)
        jobfiles.hand_over_folder(folder, (identity.uid, identity.gid))
