"""Whether a Slurm partition could ever hold a job, from its configuration (slurm_fit), and how a
failed Slurm command is read (slurm_client). The real cluster's answers are checked in
tests/integration/test_slurm.py; here, the rules on scontrol's own text."""

import pytest

from jobs.services.slurm import slurm_client, slurm_fit
from jobs.services.slurm.slurm_fit import Demand

# scontrol --oneliner, as Slurm 22.05 prints them (values with spaces, double spaces).
PARTITION = (
    "PartitionName=gpuq AllowGroups=ALL Default=YES MaxNodes=UNLIMITED MaxTime=2:00:00 "
    "MinNodes=0 MaxCPUsPerNode=UNLIMITED Nodes=c[1-3] State=UP TotalCPUs=18 TotalNodes=3 "
    "DefMemPerNode=UNLIMITED MaxMemPerNode=UNLIMITED TRES=cpu=18,mem=12000M,node=3"
)


def node(name: str, state: str = "IDLE", gres: str = "(null)", partitions: str = "gpuq") -> str:
    return (
        f"NodeName={name} Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=6 CPUTot=6 "
        f"CPULoad=0.39 Gres={gres} NodeAddr=10.0.0.1 Version=22.05.8 "
        f"OS=Linux 6.1.0-18-amd64 #1 SMP PREEMPT_DYNAMIC Debian 6.1.76-1 (2024-02-01)  "
        f"RealMemory=4000 AllocMem=0 State={state} Partitions={partitions}  "
        f"Reason=Not responding [slurm@2026-11-29T07:35:19]"
    )


def shape(*nodes: str) -> slurm_fit.PartitionShape:
    return slurm_fit.partition_from(
        "gpuq", slurm_fit.fields_of(PARTITION), [slurm_fit.fields_of(n) for n in nodes]
    )


CLUSTER = shape(node("c1"), node("c2", state="DOWN+DRAIN"), node("c3"), node("x9", partitions="x"))


def test_the_configuration_is_read_whatever_the_nodes_state() -> None:
    assert [n.name for n in CLUSTER.nodes] == ["c1", "c2", "c3"]
    assert CLUSTER.nodes[1] == slurm_fit.NodeShape("c2", 6, 4000, {})
    assert CLUSTER.max_time_seconds == 2 * 3600 and CLUSTER.max_nodes is None


def test_a_job_that_fits_is_not_refused_while_a_node_is_down() -> None:
    # Three instances of 6 cores need all three nodes, c2 (down, drained) included.
    assert slurm_fit.why_never_fits(CLUSTER, [Demand("the workers (cpu-6)", 3, 6, 1000)]) == ""


def test_each_limit_is_named() -> None:
    nodes = slurm_fit.why_never_fits(CLUSTER, [Demand("the workers (cpu-1)", 4, 1, 3000)])
    assert nodes == (
        "4 instances of the workers (cpu-1) need at least 4 nodes, as a node holds at most 1 "
        "of them; Slurm's partition 'gpuq' has 3"
    )
    memory = slurm_fit.why_never_fits(CLUSTER, [Demand("the workers (cpu-2)", 1, 2, 4096)])
    assert memory == (
        "one instance of the workers (cpu-2) needs 4096 MB of memory on one node; the nodes of "
        "Slurm's partition 'gpuq' have 4000 MB at most (RealMemory less MemSpecLimit)"
    )
    cpus = slurm_fit.why_never_fits(CLUSTER, [Demand("the workers (cpu-1)", 19, 1, 100)])
    assert cpus == "it needs 19 CPU cores in all; Slurm's partition 'gpuq' has 18 on 3 nodes"
    wide = slurm_fit.why_never_fits(CLUSTER, [Demand("the master (cpu-8)", 1, 8, 100)])
    assert wide.startswith("one instance of the master (cpu-8) needs 8 CPU cores on one node")
    late = slurm_fit.why_never_fits(CLUSTER, [Demand("the master", 1, 1, 100)], 3 * 3600)
    assert late == (
        "its time limit of 3 h is longer than Slurm's partition 'gpuq' allows (MaxTime 2 h)"
    )


def test_a_heterogeneous_jobs_components_never_share_a_node() -> None:
    # Four small components would fit one node's cores, but each needs a node of its own.
    parts = [
        Demand("the scheduler", 1, 1, 100),
        Demand("the server (cpu-1)", 1, 1, 100),
        Demand("the worker (cpu-2)", 2, 2, 100),
        Demand("the evaluator (cpu-2)", 1, 2, 100),
    ]
    said = slurm_fit.why_never_fits(CLUSTER, parts)
    assert "Slurm never puts two of its components on one node" in said, said
    assert "need 1 + 1 + 1 + 1 = 4 nodes; Slurm's partition 'gpuq' has 3" in said, said
    assert slurm_fit.why_never_fits(CLUSTER, parts[:3]) == ""


def test_gpus_are_counted_by_their_gres_type() -> None:
    gpus = shape(node("c1", gres="gpu:a100:4(S:0-1),gpu:t4:2"), node("c2", gres="gpu:2"))
    assert gpus.nodes[0].gpus == {"a100": 4, "t4": 2} and gpus.nodes[1].gpus == {"": 2}
    assert slurm_fit.why_never_fits(gpus, [Demand("the workers", 2, 1, 100, 2, "a100")]) == ""
    said = slurm_fit.why_never_fits(gpus, [Demand("the workers", 1, 1, 100, 3, "t4")])
    assert said.startswith("one instance of the workers needs 3 t4 GPUs on one node"), said


@pytest.mark.parametrize(
    ("words", "kind"),
    [
        ("Batch job submission failed: Unable to contact slurm controller (connect failure)",
         slurm_client.SlurmUnavailable),
        ("Batch job submission failed: Socket timed out on send/recv operation",
         slurm_client.SlurmUnavailable),
        ("Munge encode failed: Failed to access \"/run/munge/munge.socket.2\"",
         slurm_client.SlurmUnavailable),
        ("Batch job submission failed: Invalid account or account/partition combination "
         "specified", slurm_client.SlurmRefused),
        ("Batch job submission failed: Job violates accounting/QOS policy",
         slurm_client.SlurmRefused),
    ],
)  # fmt: skip
def test_an_outage_is_told_apart_from_a_refusal(words: str, kind: type) -> None:
    assert type(slurm_client.error_of(words)) is kind


def test_slurms_durations() -> None:
    assert slurm_fit.duration_seconds("UNLIMITED") is None
    assert slurm_fit.duration_seconds("30") == 1800
    assert slurm_fit.duration_seconds("1-12:00:00") == 36 * 3600
    assert slurm_fit.duration_seconds("45:00") == 2700
