"""One instance per node (issue 49, item 11): no two instances of the job on one node, however
small their packages, as Slurm's --ntasks-per-node=1; a job that never could be placed so is
refused at submission, one that waits says why."""

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User

from jobs.models import Job, Node, Replica
from jobs.services import rerun
from jobs.services.slurm import slurm_batch, slurm_client, slurm_fit
from jobs.services.submission import ValidationFailed, check_job_request, submit_job
from tests.unit.helpers import SentTasks, job_request
from tests.unit.test_restarts import exit_of, start_all
from trainyard_cli import jobfile

pytestmark = pytest.mark.usefixtures("catalog", "code_root", "redis_url")

Capture = Callable[..., Any]


@pytest.fixture
def submit(
    alice: User, sent_tasks: SentTasks, django_capture_on_commit_callbacks: Capture
) -> Callable[..., Job]:
    def go(instances: int, package: str = "cpu-2", **overrides: Any) -> Job:
        with django_capture_on_commit_callbacks(execute=True):
            job = submit_job(alice, check_job_request(job_request(instances, package, **overrides)))
        job.refresh_from_db()
        return job

    return go


def nodes_of(job: Job) -> list[str]:
    return sorted(r.node.name for r in job.replicas.select_related("node") if r.node is not None)


def test_it_puts_two_small_instances_on_two_nodes_where_best_fit_packs_them_on_one(
    nodes: list[Node], submit: Callable[..., Job]
) -> None:
    packed = submit(2)
    assert len(set(nodes_of(packed))) == 1
    spread = submit(2, one_instance_per_node=True)
    assert spread.one_instance_per_node
    assert nodes_of(spread) == ["node-1", "node-2"]


def test_more_instances_than_nodes_is_refused_at_submission_saying_why(
    nodes: list[Node], alice: User
) -> None:
    request = check_job_request(job_request(3, "cpu-2", one_instance_per_node=True))
    with pytest.raises(ValidationFailed) as refused:
        submit_job(alice, request)
    assert refused.value.errors["roles"][0] == (
        "The 3 instances go one per node, and there are only 2 nodes. Use fewer instances, "
        "or let instances share a node."
    )
    assert not Job.objects.exists()
    # Sharing nodes, the same three fit.
    submit_job(alice, check_job_request(job_request(3, "cpu-2")))


def test_a_job_waiting_for_a_node_of_its_own_says_so(
    nodes: list[Node], submit: Callable[..., Job]
) -> None:
    filler = submit(4)  # 8 cores: one whole node
    assert len(set(nodes_of(filler))) == 1
    waiting = submit(2, one_instance_per_node=True)
    assert not nodes_of(waiting)
    assert waiting.replicas.filter(state=Replica.State.PENDING).count() == 2
    full = nodes_of(filler)[0]
    assert waiting.reason == (
        "waiting: needs a node with 2 CPU cores and 4 GB free besides the nodes its other "
        f"instances take (one instance per node); {full} frees 8 CPU cores when job "
        f"{filler.pk} ends"
    )
    # The same job sharing nodes would start now, on the other node.
    assert len(nodes_of(submit(2))) == 2


def test_the_api_says_it_and_a_rerun_keeps_it(
    nodes: list[Node], submit: Callable[..., Job], alice: User, client: Any
) -> None:
    job = submit(2, one_instance_per_node=True)
    client.force_login(alice)
    shown = client.get(f"/api/v1/jobs/{job.pk}").json()
    assert shown["one_instance_per_node"] is True
    assert rerun.request_of(job, alice)["one_instance_per_node"] is True
    plain = submit(1)
    assert "one_instance_per_node" not in rerun.request_of(plain, alice)
    assert client.get(f"/api/v1/jobs/{plain.pk}").json()["one_instance_per_node"] is False


def test_a_value_that_is_not_a_boolean_is_refused(nodes: list[Node]) -> None:
    with pytest.raises(ValidationFailed) as refused:
        check_job_request(job_request(2, one_instance_per_node="yes"))
    assert refused.value.errors == {"one_instance_per_node": ["Give true or false."]}


def test_the_cli_flag_and_the_job_file_set_it() -> None:
    flags: dict[str, Any] = dict(
        name=None, image=None, script=None, args=[], roles=[], kvstore=None, env=[],
        restart_policy=None, max_restarts=None,
    )  # fmt: skip
    assert jobfile.apply_flags({}, **flags, one_per_node=True)["one_instance_per_node"] is True
    from_file = {"one_instance_per_node": True}
    assert jobfile.apply_flags(from_file, **flags)["one_instance_per_node"] is True
    assert jobfile.apply_flags(from_file, **flags, one_per_node=False)[
        "one_instance_per_node"
    ] is False  # fmt: skip


def test_on_slurm_it_is_ntasks_per_node_1(
    nodes: list[Node], submit: Callable[..., Job], tmp_path: Path
) -> None:
    job = submit(2, one_instance_per_node=True)
    target = slurm_client.SlurmTarget("cpu", tmp_path, sys.executable, tmp_path)
    argv = slurm_batch.sbatch_argv(job, target, tmp_path / "batch")
    assert argv[-5:] == [
        "--ntasks=2", "--cpus-per-task=2", "--mem-per-cpu=2048M", "--ntasks-per-node=1",
        str(tmp_path / "batch"),
    ]  # fmt: skip
    plain = submit(2)
    assert "--ntasks-per-node=1" not in slurm_batch.sbatch_argv(plain, target, tmp_path / "b")


def test_slurm_refuses_more_instances_than_nodes_when_they_go_one_per_node() -> None:
    shape = slurm_fit.PartitionShape(
        "cpu", [slurm_fit.NodeShape(f"n{i}", 16, 65536, {}) for i in (1, 2)], None, None, None,
        None,
    )  # fmt: skip
    demand = slurm_fit.Demand("the master/worker (cpu-2)", 3, 2, 4096)
    assert slurm_fit.why_never_fits(shape, [demand]) == ""
    alone = slurm_fit.Demand("the master/worker (cpu-2)", 3, 2, 4096, one_per_node=True)
    assert slurm_fit.why_never_fits(shape, [alone]) == (
        "3 instances of the master/worker (cpu-2) need at least 3 nodes, as they go one per "
        "node (--ntasks-per-node=1); Slurm's partition 'cpu' has 2"
    )


def test_edit_and_run_again_keeps_the_box_ticked_and_launches_with_it(
    nodes: list[Node], submit: Callable[..., Job], alice: User, client: Any
) -> None:
    job = submit(2, one_instance_per_node=True)
    client.force_login(alice)
    initial = client.get(f"/jobs/{job.pk}/again/").context["form"].initial
    assert initial["one_instance_per_node"] is True
    fields = {k: v for k, v in initial.items() if v is not None}
    fields["one_instance_per_node"] = "on"
    answer = client.post(f"/jobs/{job.pk}/again/", fields)
    again = Job.objects.exclude(pk=job.pk).get()
    assert answer.status_code == 302 and again.one_instance_per_node


def test_a_restart_away_from_the_failed_node_keeps_it_when_one_per_node_needs_it(
    nodes: list[Node], alice: User, sent_tasks: SentTasks,
    django_capture_on_commit_callbacks: Capture,
) -> None:  # fmt: skip
    """Excluding the failed node would leave one node for two instances that go one per node:
    a restart that could never be placed, so the node is kept, as when no node would be left."""
    capture = django_capture_on_commit_callbacks
    request = job_request(2, "cpu-2", one_instance_per_node=True)
    request["restart"] = {
        "policy": "on-failure", "max_restarts": 2, "backoff_seconds": 0,
        "exclude_failed_node": True,
    }  # fmt: skip
    with capture(execute=True):
        job = submit_job(alice, check_job_request(request))
    start_all(job, capture)
    exit_of(job, capture, "worker-1", "failed", 1, 0)
    assert job.excluded_nodes == [] and "not excluded" in job.reason, job.reason
    exit_of(job, capture, "master", "stopped", -15, 0)
    assert nodes_of_attempt(job, 1) == ["node-1", "node-2"]


def nodes_of_attempt(job: Job, attempt: int) -> list[str]:
    return sorted(
        r.node.name
        for r in job.replicas.filter(attempt=attempt).select_related("node")
        if r.node is not None
    )
