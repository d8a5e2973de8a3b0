"""Could a Slurm partition ever hold a job? Judged from its configuration, not its state.

`sbatch --test-only` answers for the nodes as they are now: a node that is DOWN or DRAINED
counts as never available, so a job that fits the partition was refused for good while one
node was down ("Requested node configuration is not available"), and every cause of a refusal
read the same. This reads the partition and its nodes as configured (`scontrol show partition`,
`scontrol show node`: CPUs, RealMemory less MemSpecLimit, GRES, MaxNodes, MaxTime,
MaxCPUsPerNode, MaxMemPerNode) whatever their state, and says which limit a job is over.

It refuses only what can never fit (each check is a necessary condition), so a job it lets
through may still wait in Slurm, with Slurm's reason on its page:
- one instance larger than every node (CPUs, memory, GPUs of the package's model);
- more CPUs, or GPUs, in all than the partition has;
- more nodes than the partition has or allows: each component's instances need at least as
  many nodes as its largest nodes hold them in, and a heterogeneous job's components never
  share a node (Slurm 22.05 NEWS: "Prevent a heterogeneous job allocation from including the
  same nodes in multiple components"), so their counts add up;
- a time limit over the partition's MaxTime.
"""

import math
import re
from dataclasses import dataclass

from jobs.services.slurm.slurm_client import SlurmTarget, run_client

UNLIMITED = ("UNLIMITED", "INFINITE", "NONE", "N/A", "")
KEY_VALUE = re.compile(r"(\w+)=(.*?)(?= \w+=|$)")


@dataclass(frozen=True)
class NodeShape:
    name: str
    cpus: int
    memory_mb: int
    gpus: dict[str, int]  # by GRES type ("" for untyped), as the node's Gres says


@dataclass(frozen=True)
class PartitionShape:
    name: str
    nodes: list[NodeShape]
    max_nodes: int | None  # per job; None: unlimited
    max_time_seconds: int | None
    max_cpus_per_node: int | None
    max_memory_per_node_mb: int | None

    def usable(self, node: NodeShape) -> NodeShape:
        """What one job may have of a node: its size, within the partition's per-node caps."""
        cpus = min(node.cpus, self.max_cpus_per_node or node.cpus)
        memory = min(node.memory_mb, self.max_memory_per_node_mb or node.memory_mb)
        return NodeShape(node.name, cpus, memory, node.gpus)


@dataclass(frozen=True)
class Demand:
    """One component of the job: `tasks` instances of one size (what sbatch asks for it)."""

    label: str  # "the workers (cpu-2)", for the reason
    tasks: int
    cpus: int
    memory_mb: int  # per instance: --mem-per-cpu × --cpus-per-task
    gpus: int = 0
    gpu_type: str = ""  # "" asks for any GPU
    one_per_node: bool = False  # --ntasks-per-node=1

    def per_node(self, node: NodeShape) -> int:
        """How many of its instances one node holds."""
        fits = [node.cpus // self.cpus, node.memory_mb // max(1, self.memory_mb)]
        if self.gpus:
            have = sum(node.gpus.values()) if not self.gpu_type else node.gpus.get(self.gpu_type, 0)
            fits.append(have // self.gpus)
        if self.one_per_node:
            fits.append(1)
        return max(0, min(fits))


# --- reading the configuration ---------------------------------------------------------------


def read_partition(target: SlurmTarget, name: str) -> PartitionShape:
    """One of the pool's partitions and its nodes as configured. Raises SlurmError."""
    shown = run_client(["scontrol", "--oneliner", "show", "partition", name], target)
    fields = fields_of(shown.stdout.strip().splitlines()[0] if shown.stdout.strip() else "")
    listed = run_client(["scontrol", "--oneliner", "show", "node"], target)
    nodes = [fields_of(line) for line in listed.stdout.splitlines() if line.strip()]
    return partition_from(name, fields, nodes)


def fields_of(line: str) -> dict[str, str]:
    """scontrol's one-line record as Key=Value pairs (a value may hold spaces: OS=Linux 6.1 …)."""
    return {key: value.strip() for key, value in KEY_VALUE.findall(line.strip())}


def partition_from(
    name: str, partition: dict[str, str], nodes: list[dict[str, str]]
) -> PartitionShape:
    members = [node_from(n) for n in nodes if name in n.get("Partitions", "").split(",")]
    return PartitionShape(
        name=name,
        nodes=members,
        max_nodes=count_or_none(partition.get("MaxNodes", "")),
        max_time_seconds=duration_seconds(partition.get("MaxTime", "")),
        max_cpus_per_node=count_or_none(partition.get("MaxCPUsPerNode", "")),
        max_memory_per_node_mb=count_or_none(partition.get("MaxMemPerNode", "")),
    )


def node_from(fields: dict[str, str]) -> NodeShape:
    # CPUEfctv (22.05): the CPUs jobs may use, less those of CoreSpecCount/CpuSpecList.
    cpus = count_or_none(fields.get("CPUEfctv", "")) or count_or_none(fields.get("CPUTot", ""))
    memory = (count_or_none(fields.get("RealMemory", "")) or 0) - (
        count_or_none(fields.get("MemSpecLimit", "")) or 0
    )
    return NodeShape(fields.get("NodeName", "?"), cpus or 0, max(0, memory), gpus_of(fields))


def gpus_of(fields: dict[str, str]) -> dict[str, int]:
    """A node's GPUs by type from its Gres: "gpu:a100:4(S:0-1),gpu:t4:2" → {"a100": 4, "t4": 2};
    untyped "gpu:4" → {"": 4}."""
    found: dict[str, int] = {}
    for item in re.sub(r"\([^)]*\)", "", fields.get("Gres", "")).split(","):
        parts = item.strip().split(":")
        if parts[0] != "gpu" or len(parts) < 2:
            continue
        count = count_or_none(parts[-1])
        if count:
            kind = parts[1] if len(parts) > 2 else ""
            found[kind] = found.get(kind, 0) + count
    return found


def count_or_none(value: str) -> int | None:
    match = re.match(r"^(\d+)", value.strip())
    return int(match.group(1)) if match and value.strip().upper() not in UNLIMITED else None


def duration_seconds(value: str) -> int | None:
    """Slurm's time ("UNLIMITED", "30", "2:00:00", "1-12:00:00") in seconds; None: unlimited."""
    value = value.strip()
    if value.upper() in UNLIMITED:
        return None
    days, _, clock = value.rpartition("-")
    parts = [int(p) for p in clock.split(":") if p.isdigit()]
    if not parts:
        return None
    if len(parts) == 1:  # minutes alone
        seconds = parts[0] * 60
    else:
        parts = [0] * (3 - len(parts)) + parts
        seconds = parts[0] * 3600 + parts[1] * 60 + parts[2]
    return seconds + (int(days) * 86400 if days.isdigit() else 0)


# --- judging -----------------------------------------------------------------------------


def why_never_fits(
    shape: PartitionShape, demands: list[Demand], time_limit_seconds: int | None = None
) -> str:
    """Why the partition can never hold a job of these components ("" when it may), in words
    that name the limit."""
    where = f"Slurm's partition {shape.name!r}"
    nodes = [shape.usable(n) for n in shape.nodes]
    if not nodes:
        return f"{where} has no nodes"
    for demand in demands:
        refusal = _one_instance_refusal(where, nodes, demand)
        if refusal:
            return refusal
    total_cpus = sum(d.tasks * d.cpus for d in demands)
    have_cpus = sum(n.cpus for n in nodes)
    if total_cpus > have_cpus:
        return (
            f"it needs {total_cpus} CPU cores in all; {where} has {have_cpus} "
            f"on {_count(len(nodes), 'node')}"
        )
    total_gpus = sum(d.tasks * d.gpus for d in demands)
    have_gpus = sum(sum(n.gpus.values()) for n in nodes)
    if total_gpus > have_gpus:
        return f"it needs {total_gpus} GPUs in all; {where} has {have_gpus}"
    needed = [_nodes_needed(nodes, d) for d in demands]
    if sum(needed) > len(nodes):
        return _too_many_nodes(where, nodes, demands, needed)
    for demand, count in zip(demands, needed, strict=True):
        if shape.max_nodes is not None and count > shape.max_nodes:
            return (
                f"{demand.label} need at least {_count(count, 'node')}; {where} allows a job "
                f"{shape.max_nodes} (MaxNodes)"
            )
    if time_limit_seconds and shape.max_time_seconds is not None:
        if time_limit_seconds > shape.max_time_seconds:
            return (
                f"its time limit of {_minutes(time_limit_seconds)} is longer than {where} "
                f"allows (MaxTime {_minutes(shape.max_time_seconds)})"
            )
    return ""


def _one_instance_refusal(where: str, nodes: list[NodeShape], demand: Demand) -> str:
    if any(demand.per_node(n) >= 1 for n in nodes):
        return ""
    one = f"one instance of {demand.label}"
    most_cpus = max(n.cpus for n in nodes)
    if demand.cpus > most_cpus:
        return (
            f"{one} needs {demand.cpus} CPU cores on one node; the nodes of {where} have "
            f"{most_cpus} at most"
        )
    most_memory = max(n.memory_mb for n in nodes)
    if demand.memory_mb > most_memory:
        return (
            f"{one} needs {demand.memory_mb} MB of memory on one node; the nodes of {where} "
            f"have {most_memory} MB at most (RealMemory less MemSpecLimit)"
        )
    kind = f"{demand.gpu_type} " if demand.gpu_type else ""
    if demand.gpus:
        most = max(n.gpus.get(demand.gpu_type, 0) if demand.gpu_type else sum(n.gpus.values())
                   for n in nodes)  # fmt: skip
        if demand.gpus > most:
            return (
                f"{one} needs {demand.gpus} {kind}GPUs on one node; the nodes of {where} "
                f"have {most} at most (their Gres)"
            )
    return f"{one} fits none of the nodes of {where} (CPUs, memory and GPUs together)"


def _nodes_needed(nodes: list[NodeShape], demand: Demand) -> int:
    """The fewest nodes the component's instances fit on: the largest holders first."""
    holds = sorted((demand.per_node(n) for n in nodes), reverse=True)
    placed = 0
    for count, holding in enumerate(holds, 1):
        placed += holding
        if placed >= demand.tasks:
            return count
    return len(nodes) + 1


def _too_many_nodes(
    where: str, nodes: list[NodeShape], demands: list[Demand], needed: list[int]
) -> str:
    have = len(nodes)
    if len(demands) == 1:
        demand = demands[0]
        most = max(demand.per_node(n) for n in nodes)
        why = (
            "they go one per node (--ntasks-per-node=1)"
            if demand.one_per_node
            else f"a node holds at most {most} of them"
        )
        return (
            f"{_count(demand.tasks, 'instance')} of {demand.label} need at least "
            f"{_count(needed[0], 'node')}, as {why}; {where} has {have}"
        )
    parts = " + ".join(str(n) for n in needed)
    names = ", ".join(d.label for d in demands)
    return (
        f"it is a heterogeneous Slurm job and Slurm never puts two of its components on one "
        f"node: {names} need {parts} = {_count(sum(needed), 'node')}; {where} has {have}"
    )


def _count(number: int, what: str) -> str:
    return f"{number} {what}{'' if number == 1 else 's'}"


def _minutes(seconds: int) -> str:
    if seconds % 3600 == 0:
        return f"{seconds // 3600} h"
    return f"{math.ceil(seconds / 60)} min"
