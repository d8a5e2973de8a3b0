"""Sending work to node agents through Celery: short messages on each node's own queue."""

import logging
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from console.celery import app
from jobs.models import Job, Package, Replica
from jobs.redis_client import get_redis
from jobs.services import agent_access, snapshots
from workers import contract
from workers.logquota import LogLimits
from workers.spec import FRAMEWORK_KVSTORE, FRAMEWORK_PYTORCH, ReplicaSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Slot:
    """Where one instance runs: the node's name and address, as far as they are known. Agents'
    jobs know them when placed; a Slurm job's instances learn theirs from Slurm once it starts
    them (workers/slurmstep.py fills them in), so there both are empty."""

    role: str
    index: int
    package: Package | None
    node: str = ""
    address: str = ""


def build_specs(job: Job) -> list[tuple[str, ReplicaSpec]]:
    """(node, spec) for every replica of a placed job's current attempt."""
    replicas = list(job.replicas.filter(attempt=job.attempt).select_related("node", "package"))
    slots = []
    for replica in replicas:
        assert replica.node is not None
        slots.append(
            Slot(replica.role, replica.index, replica.package, replica.node.name,
                 replica.node.address)
        )  # fmt: skip
    return [(spec.node, spec) for spec in specs_in_rank_order(job, slots)]


def specs_in_rank_order(job: Job, slots: list[Slot]) -> list[ReplicaSpec]:
    """Every instance's spec, the one that hosts the rendezvous first, in rank order."""
    if job.kvstore:
        return _parameter_server_specs(job, slots)
    return _pytorch_specs(job, slots)


def _pytorch_specs(job: Job, slots: list[Slot]) -> list[ReplicaSpec]:
    """In rank order: the master is node rank 0 and hosts the rendezvous; an instance runs
    its package's processes (one per GPU by default), so ranks advance by each local world
    size."""
    slots = sorted(slots, key=lambda s: (s.role != "master", s.index))
    master = slots[0]
    assert master.role == "master"
    local_sizes = [s.package.processes_per_instance if s.package else 1 for s in slots]
    world_size = sum(local_sizes)
    specs = []
    rank = 0
    for node_rank, (slot, local_size) in enumerate(zip(slots, local_sizes, strict=True)):
        assert slot.package is not None
        specs.append(
            ReplicaSpec(
                job_id=job.pk,
                role=slot.role,
                index=slot.index,
                node=slot.node,
                framework=FRAMEWORK_PYTORCH,
                program=job.program,
                args=job.args_of_attempt(job.attempt),
                master_addr=master.address,
                hosts_rendezvous=slot.role == "master",
                world_size=world_size,
                node_rank=node_rank,
                rank_offset=rank,
                local_world_size=local_size,
                group_world_size=len(slots),
                cpus=slot.package.cpu,
                gpus=slot.package.gpus,
                **_package_limits(slot.package),
                metric_definitions=_metric_definitions(job),
                python=job.image.python_on(slot.node),
                **_attempt_fields(job, len(slots)),
            )
        )
        rank += local_size
    return specs


PS_ROLE_ORDER = {"scheduler": 0, "server": 1, "worker": 2}


def _parameter_server_specs(job: Job, slots: list[Slot]) -> list[ReplicaSpec]:
    """The scheduler hosts the rendezvous (DMLC_PS_ROOT_URI/PORT); everyone learns how many
    servers and workers there are. One process per instance."""
    slots = sorted(slots, key=lambda s: (PS_ROLE_ORDER[s.role], s.index))
    scheduler = slots[0]
    assert scheduler.role == "scheduler"
    servers = sum(1 for s in slots if s.role == "server")
    workers = sum(1 for s in slots if s.role == "worker")
    specs = []
    for position, slot in enumerate(slots):
        specs.append(
            ReplicaSpec(
                job_id=job.pk,
                role=slot.role,
                index=slot.index,
                node=slot.node,
                framework=FRAMEWORK_KVSTORE,
                program=job.program,
                args=job.args_of_attempt(job.attempt),
                master_addr=scheduler.address,
                hosts_rendezvous=slot.role == "scheduler",
                world_size=len(slots),
                node_rank=position,
                rank_offset=position,
                local_world_size=1,
                cpus=slot.package.cpu if slot.package else 1,
                gpus=slot.package.gpus if slot.package else 0,
                **(_package_limits(slot.package) if slot.package else {}),
                num_servers=servers,
                num_workers=workers,
                kvstore=job.kvstore,
                metric_definitions=_metric_definitions(job),
                python=job.image.python_on(slot.node),
                **_attempt_fields(job, len(slots)),
            )
        )
    return specs


def _package_limits(package: Package) -> dict[str, Any]:
    """What the agent holds the instance to besides its cores and GPUs (workers/limits.py)."""
    return {
        "package": package.name,
        "memory_gb": float(package.memory_gb),
        "max_processes": package.max_processes,
        "disk_gb": float(package.disk_gb),
    }


def _attempt_fields(job: Job, instances: int) -> dict[str, Any]:
    """What every instance of an attempt shares: which attempt, how many may follow, the key
    that names the job's checkpoint folder on every attempt, the container to run in, and whose
    job it is, the Unix identity its trainers run as (the owner's own, as resolved at
    submission; absent: a uid of Trainyard's own) and the folders it named."""
    identity: dict[str, Any] = {}
    if job.run_uid is not None and job.run_gid is not None:
        identity = {"run_uid": job.run_uid, "run_gid": job.run_gid, "run_groups": job.run_groups}
    return {
        **identity,
        "data_folders": list(job.data_folders),
        "results_folder": job.results_folder,
        "attempt": job.attempt,
        "max_restarts": job.max_restarts,
        "resize_count": job.resizes,
        "checkpoint_key": job.checkpoint_key,
        "container_image": job.container_image,
        # The image's defaults as they were at submission, under the job's own variables.
        "extra_env": {**job.image_env, **job.env},
        "owner": job.owner_id,
        "log_limits": _log_limits(job, instances).to_dict(),
    }


def _log_limits(job: Job, instances: int) -> LogLimits:
    """Each instance gets the job's rates and an equal share of its bytes: the agents enforce
    them without asking one another, and so the job's total holds (the log keeper checks the
    total again, in case an agent does not)."""
    job_max_bytes = job.log_max_mb * 10**6
    return LogLimits(
        lines_per_second=job.log_lines_per_second,
        max_bytes=max(1, job_max_bytes // max(1, instances)),
        job_max_bytes=job_max_bytes,
        metric_points_per_second=job.metric_points_per_second,
    )


def _metric_definitions(job: Job) -> list[dict[str, str]]:
    """The image's regex metrics, then the job's own."""
    return [*job.image.metric_definitions, *job.metric_definitions]


def send_starts(job_id: int, specs: list[tuple[str, ReplicaSpec]]) -> None:
    """The first start messages of a placed attempt (after commit)."""
    attempt = specs[0][1].attempt if specs else 0
    if attempt == 0:
        # A job id can repeat when a fresh database meets an old Redis: clear what an earlier
        # job of that id left, so its log and rendezvous port are not mistaken for this one's.
        # (A restart keeps the log: it goes on with the new attempt's lines.)
        get_redis().delete(contract.log_stream_key(job_id), contract.log_cursor_key(job_id))
    get_redis().delete(contract.rendezvous_key(job_id, attempt))
    _send_specs(specs)


def _send_specs(specs: list[tuple[str, ReplicaSpec]]) -> None:
    # Before any agent looks for it: the code snapshot the job runs, in Redis (again).
    for sha256 in sorted({s.program["snapshot"] for _, s in specs if "snapshot" in s.program}):
        snapshots.publish(sha256)
    # Before any agent gets its start: its Redis user may touch the job's keys (its log, the
    # rendezvous). Should that fail, no start is sent: reconciliation sends it again later.
    agent_access.sync(sorted({node for node, _ in specs}))
    for node, spec in specs:
        app.send_task(
            contract.TASK_START_REPLICA,
            kwargs={"spec": spec.to_dict()},
            queue=contract.node_queue(node),
        )


def resend_starts(job: Job, replicas: list[Replica]) -> None:
    """Start messages again for replicas whose agent never acknowledged one. The agent ignores
    a start of a replica it already runs, so a message that was only slow does no harm."""
    wanted = {(r.role, r.index) for r in replicas if r.attempt == job.attempt}
    specs = [(n, s) for n, s in build_specs(job) if (s.role, s.index) in wanted]
    now = timezone.now()
    for replica in replicas:
        Replica.objects.filter(pk=replica.pk).update(
            start_sent=now, starts_sent=F("starts_sent") + 1
        )
    transaction.on_commit(lambda: _send_specs(specs), robust=True)


def send_stops_on_commit(
    job_id: int,
    replicas: list[Replica],
    reason: str,
    up_to_attempt: int | None = None,
    grace_seconds: float | None = None,
) -> None:
    """Ask each node's agent to stop the job there, naming the replicas the console expects
    on it: an agent that does not run one says so, and the console stops waiting for it.

    `up_to_attempt` spares later attempts (a restart stops the old attempt, never the new
    one); `grace_seconds` is how long the processes have between SIGTERM and SIGKILL.
    """
    by_node: dict[str, list[dict[str, object]]] = {}
    for replica in replicas:
        if replica.node is not None:
            by_node.setdefault(replica.node.name, []).append(
                {"role": replica.role, "index": replica.index, "attempt": replica.attempt}
            )
    Replica.objects.filter(pk__in=[r.pk for r in replicas]).update(stop_sent=timezone.now())
    transaction.on_commit(
        lambda: send_stops(job_id, by_node, reason, up_to_attempt, grace_seconds), robust=True
    )


def send_stops(
    job_id: int,
    by_node: dict[str, list[dict[str, object]]],
    reason: str,
    up_to_attempt: int | None = None,
    grace_seconds: float | None = None,
    only_listed: bool = False,
) -> None:
    """Stop messages, per node; `only_listed` stops just the replicas named (a stray), not
    every process of the job there."""
    for node, expected in sorted(by_node.items()):
        kwargs: dict[str, Any] = {"job_id": job_id, "reason": reason, "replicas": expected}
        if only_listed:
            kwargs["only_listed"] = True
        if up_to_attempt is not None:
            kwargs["up_to_attempt"] = up_to_attempt
        if grace_seconds is not None:
            kwargs["grace_seconds"] = grace_seconds
        app.send_task(contract.TASK_STOP_JOB, kwargs=kwargs, queue=contract.node_queue(node))
