"""Read model for the Nodes page's Slurm pools: each pool's nodes as Slurm sees them now.

A Slurm pool has no node agents, so no Node rows: without this the Nodes page showed nothing of
where its jobs run. The nodes come from `scontrol show node` on the console host (the pool's
own slurm.conf), filtered to the pool's partitions; what each holds is Slurm's count (every
user's jobs, a fact about the cluster), and the job ids are only those of the viewer's jobs
whose instances Slurm placed there (Replica.slurm_node). A pool whose controller does not
answer is shown with Slurm's words; the page never fails for it.
"""

from dataclasses import dataclass

from django.contrib.auth.models import AnonymousUser, User

from jobs.access import visible_jobs
from jobs.models import Job, Replica, SlurmPool
from jobs.services.slurm import slurm_batch, slurm_fit
from jobs.services.slurm.slurm_client import SlurmError, run_client


@dataclass(frozen=True)
class SlurmNodeRow:
    name: str
    state: str  # Slurm's, lower case: "idle", "mixed", "allocated", "down*", "idle+drain"…
    reason: str  # why it is down or drained, as the admin or slurmd said
    cpus_used: int
    cpus: int
    memory_gb_used: float
    memory_gb: float
    gres: str  # "gpu:a100:4" or ""
    partitions: list[str]  # of the pool's
    jobs: list[int]  # the viewer's jobs with an instance here


@dataclass(frozen=True)
class SlurmPoolNodes:
    pool: SlurmPool
    nodes: list[SlurmNodeRow]
    error: str  # Slurm's words when it did not answer; "" when it did


def pool_rows(viewer: User | AnonymousUser) -> list[SlurmPoolNodes]:
    return [pool_nodes(pool, viewer) for pool in SlurmPool.objects.order_by("name")]


def pool_nodes(pool: SlurmPool, viewer: User | AnonymousUser) -> SlurmPoolNodes:
    target = slurm_batch.target_of(pool)
    try:
        listed = run_client(["scontrol", "--oneliner", "show", "node"], target)
    except SlurmError as exc:
        return SlurmPoolNodes(pool, [], str(exc))
    records = [slurm_fit.fields_of(line) for line in listed.stdout.splitlines() if line.strip()]
    return SlurmPoolNodes(pool, node_rows(pool, records, jobs_by_node(pool, viewer)), "")


def node_rows(
    pool: SlurmPool, records: list[dict[str, str]], jobs: dict[str, list[int]]
) -> list[SlurmNodeRow]:
    """The pool's nodes among scontrol's records, in Slurm's order."""
    wanted = {p.strip() for p in pool.partition.split(",") if p.strip()}
    rows = []
    for fields in records:
        partitions = [p for p in fields.get("Partitions", "").split(",") if p in wanted]
        if not partitions:
            continue
        shape = slurm_fit.node_from(fields)
        name = fields.get("NodeName", "?")
        rows.append(
            SlurmNodeRow(
                name=name,
                state=fields.get("State", "unknown").lower(),
                reason=_reason(fields.get("Reason", "")),
                cpus_used=slurm_fit.count_or_none(fields.get("CPUAlloc", "")) or 0,
                cpus=shape.cpus,
                memory_gb_used=_gb(slurm_fit.count_or_none(fields.get("AllocMem", "")) or 0),
                memory_gb=_gb(shape.memory_mb),
                gres=_none_is_empty(fields.get("Gres", "")),
                partitions=partitions,
                jobs=jobs.get(name, []),
            )
        )
    return rows


def jobs_by_node(pool: SlurmPool, viewer: User | AnonymousUser) -> dict[str, list[int]]:
    """The Slurm node names the viewer's running jobs of the pool have instances on."""
    mine = visible_jobs(viewer).filter(slurm_pool=pool, state__in=Job.ACTIVE_STATES)
    placed = (
        Replica.objects.filter(job__in=mine)
        .exclude(slurm_node="")
        .values_list("slurm_node", "job_id")
        .distinct()
    )
    by_node: dict[str, set[int]] = {}
    for node, job_id in placed:
        by_node.setdefault(node, set()).add(job_id)
    return {node: sorted(ids) for node, ids in by_node.items()}


def _reason(value: str) -> str:
    # scontrol adds "[user@time]" after a reason an admin set: who and when, not why.
    return _none_is_empty(value.split(" [", 1)[0])


def _none_is_empty(value: str) -> str:
    return "" if value.strip().upper() in ("(NULL)", "N/A", "NONE") else value.strip()


def _gb(megabytes: int) -> float:
    return round(megabytes / 1024, 1)
