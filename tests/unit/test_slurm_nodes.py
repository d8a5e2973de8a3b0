"""The Nodes page's Slurm pools: scontrol's node records, read as the page shows them."""

from jobs.models import SlurmPool
from jobs.services.slurm import slurm_fit
from jobs.services.views.slurm_nodes import node_rows

RECORDS = [
    "NodeName=n1 Arch=x86_64 CoresPerSocket=1 CPUAlloc=2 CPUEfctv=2 CPUTot=2 CPULoad=0.50 "
    "AvailableFeatures=(null) Gres=gpu:a100:4(S:0-1) NodeAddr=10.0.0.1 RealMemory=8192 "
    "AllocMem=4096 State=MIXED Partitions=trainyard,people Reason=(null)",
    "NodeName=n2 CPUAlloc=0 CPUTot=4 Gres=(null) RealMemory=16384 AllocMem=0 "
    "State=IDLE+DRAIN Partitions=trainyard Reason=disk check [root@2026-11-29T15:00:00]",
    "NodeName=n3 CPUAlloc=0 CPUTot=4 Gres=(null) RealMemory=16384 AllocMem=0 State=IDLE "
    "Partitions=other",
]


def test_only_the_pools_partitions_nodes_are_listed_with_what_slurm_says_of_them() -> None:
    records = [slurm_fit.fields_of(line) for line in RECORDS]
    rows = node_rows(SlurmPool(partition="trainyard,first-node"), records, {"n1": [7, 9]})
    assert [r.name for r in rows] == ["n1", "n2"]
    first, second = rows
    assert (first.state, first.cpus_used, first.cpus) == ("mixed", 2, 2)
    assert (first.memory_gb_used, first.memory_gb) == (4.0, 8.0)
    assert first.gres == "gpu:a100:4(S:0-1)" and first.partitions == ["trainyard"]
    assert first.jobs == [7, 9] and first.reason == ""
    # Who drained it and when is scontrol's addition, not the reason.
    assert (second.state, second.reason, second.gres, second.jobs) == (
        "idle+drain",
        "disk check",
        "",
        [],
    )
