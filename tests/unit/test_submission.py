"""Validation and admission: every bad request gets its field's message and writes nothing."""

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Group, User

from jobs.models import Job, Package, Quota, Replica
from jobs.services.submission import ValidationFailed, check_job_request, submit_job
from tests.conftest import set_quota
from tests.unit.helpers import SentTasks, job_request
from workers import contract

pytestmark = pytest.mark.usefixtures("catalog", "code_root", "nodes")

Capture = Callable[..., Any]


def errors_of(data: Any) -> dict[str, list[str]]:
    with pytest.raises(ValidationFailed) as caught:
        check_job_request(data)
    assert Job.objects.count() == 0
    return caught.value.errors


def test_it_accepts_a_valid_request() -> None:
    request = check_job_request(job_request(instances=3))
    assert [(r.role, r.instances) for r in request.roles] == [("master", 1), ("worker", 2)]
    assert request.totals.cpu == 3
    assert request.program == {"example": "digits-ddp"}


def test_it_accepts_a_script_under_the_code_root(code_root: Path) -> None:
    request = check_job_request(job_request(program={"script": "fail.py"}))
    assert request.program == {"path": "fail.py"}


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"image": "tensorflow:1"}, "image"),
        ({"name": ""}, "name"),
        ({"name": "   "}, "name"),
        ({"name": "x" * 201}, "name"),
        ({"name": "bad\x07name"}, "name"),
        ({"program": {"script": "../etc/passwd"}}, "program.script"),
        ({"program": {"script": "/etc/passwd"}}, "program.script"),
        ({"program": {"script": "nope.py"}}, "program.script"),
        ({"program": {"script": "digits-ddp", "args": "--epochs 2"}}, "program.args"),
        ({"program": {"script": "digits-ddp", "args": [1, 2]}}, "program.args"),
        ({"program": {"script": "digits-ddp", "args": ["a"] * 300}}, "program.args"),
        ({"program": "digits-ddp"}, "program"),
        ({"roles": {}}, "roles"),
        (
            {
                "roles": {
                    "master": {"package": "cpu-1", "instances": 1},
                    "ps": {"package": "cpu-1", "instances": 1},
                }
            },
            "roles",
        ),
        ({"roles": {"worker": {"package": "cpu-1", "instances": 2}}}, "roles.master"),
        ({"roles": {"master": {"package": "cpu-1", "instances": 2}}}, "roles.master.instances"),
        ({"roles": {"master": {"package": "cpu-1", "instances": 0}}}, "roles.master.instances"),
        ({"roles": {"master": {"package": "gold", "instances": 1}}}, "roles.master.package"),
        ({"surprise": 1}, "request"),
    ],
)
def test_it_names_the_field_that_is_wrong(overrides: dict[str, Any], field: str) -> None:
    assert field in errors_of(job_request(**overrides))


@pytest.mark.parametrize("instances", [-1, 65, 10**9, "3", 2.5, True, None])
def test_it_refuses_bad_instance_counts(instances: Any) -> None:
    data = job_request()
    data["roles"]["worker"]["instances"] = instances
    assert "roles.worker.instances" in errors_of(data)


def test_it_refuses_a_package_not_allowed_for_the_role() -> None:
    Package.objects.filter(name="server-2c12g").update(roles=["server"])
    errors = errors_of(job_request(package="server-2c12g"))
    assert "is for server, not master" in errors["roles.master.package"][0]


def admission_errors(user: User, data: Any) -> dict[str, list[str]]:
    with pytest.raises(ValidationFailed) as caught:
        submit_job(user, check_job_request(data))
    assert Job.objects.count() == 0
    return caught.value.errors


def test_it_refuses_at_once_a_package_no_node_can_ever_hold(alice: User) -> None:
    errors = admission_errors(alice, job_request(package="worker-p100x2"))
    assert "could never start" in errors["roles.master.package"][0]


def test_it_refuses_a_body_that_is_not_an_object() -> None:
    assert "request" in errors_of(["not", "an", "object"])


def test_it_passes_shell_metacharacters_through_as_plain_arguments() -> None:
    args = ["--name", "$(rm -rf /); `id` | cat > /tmp/x && echo ${HOME}"]
    request = check_job_request(job_request(program={"script": "digits-ddp", "args": args}))
    assert request.args == args


def test_it_admits_within_quota(alice: User) -> None:
    set_quota(alice, cpu=3)
    job = submit_job(alice, check_job_request(job_request(instances=3)))
    assert job.state == Job.State.QUEUED
    assert job.cpu_total == 3
    tags = [r.tag for r in job.replicas.order_by("id")]
    assert tags == ["master", "worker-1", "worker-2"]
    assert set(job.replicas.values_list("state", flat=True)) == {Replica.State.PENDING}


def test_it_says_which_resource_is_over_and_by_how_much(alice: User) -> None:
    set_quota(alice, cpu=2, memory_gb=100)
    with pytest.raises(ValidationFailed) as caught:
        submit_job(alice, check_job_request(job_request(instances=3)))
    assert caught.value.errors["quota"] == [
        "Over quota on CPU cores: this job needs 3, you have 2 left of 2 (over by 1).",
        "It fits with 1 worker (2 instances in all).",
    ]
    assert caught.value.detail["quota"]["cpu"]["over_by"] == 1
    assert caught.value.detail["quota"]["cpu"]["formula"] == "master 1×1 + worker 1×2 = 3"
    assert caught.value.detail["fits_with"] == {"role": "worker", "instances": 1}
    assert Job.objects.count() == 0


def in_group(user: User, name: str, **limits: int) -> Group:
    group, _ = Group.objects.get_or_create(name=name)
    user.groups.add(group)
    defaults = {"cpu": 100, "gpus": 0, "memory_gb": 1000, "running_jobs": 100}
    Quota.objects.get_or_create(group=group, defaults={**defaults, **limits})
    return group


def test_a_group_quota_binds_all_its_members_together(alice: User, bob: User) -> None:
    in_group(alice, "ml-team", cpu=5)
    in_group(bob, "ml-team")
    submit_job(alice, check_job_request(job_request(instances=3)))
    with pytest.raises(ValidationFailed) as caught:
        submit_job(bob, check_job_request(job_request(instances=3)))
    assert caught.value.errors["quota"][0] == (
        "Over quota on CPU cores (group ml-team): this job needs 3, group ml-team has 2 left "
        "of 5 (over by 1)."
    )
    assert caught.value.detail["quota"]["cpu"]["scope"] == "group ml-team"
    submit_job(bob, check_job_request(job_request(instances=2)))
    assert Job.objects.count() == 2


def test_the_tighter_of_user_and_group_limits_applies(alice: User) -> None:
    set_quota(alice, cpu=3)
    in_group(alice, "big-team", cpu=50)
    with pytest.raises(ValidationFailed) as caught:
        submit_job(alice, check_job_request(job_request(instances=4)))
    assert "you have 3 left of 3" in caught.value.errors["quota"][0]
    in_group(alice, "tight-team", cpu=2)
    with pytest.raises(ValidationFailed) as caught:
        submit_job(alice, check_job_request(job_request(instances=3)))
    assert caught.value.errors["quota"][0].startswith("Over quota on CPU cores (group tight-team)")
    assert "It fits with 1 worker (2 instances in all)." in caught.value.errors["quota"]


def test_it_suggests_nothing_when_even_the_master_alone_is_over(alice: User) -> None:
    set_quota(alice, cpu=0)
    with pytest.raises(ValidationFailed) as caught:
        submit_job(alice, check_job_request(job_request(instances=3)))
    assert "fits_with" not in caught.value.detail
    assert len(caught.value.errors["quota"]) == 1


def only_node(cpu: int, gpus: int = 0, memory_gb: int = 32) -> None:
    """The cluster becomes one node of this size."""
    from django.utils import timezone

    from jobs.models import Node

    Node.objects.all().delete()
    Node.objects.create(
        name="only", address="127.0.0.1", cpu=cpu, gpus=gpus, memory_gb=memory_gb,
        last_heartbeat=timezone.now(),
    )  # fmt: skip


def test_it_suggests_no_more_workers_than_the_nodes_could_ever_hold(alice: User) -> None:
    set_quota(alice, cpu=16)  # room for the master and 15 workers
    only_node(cpu=7)  # room for the master and 6 workers, ever
    with pytest.raises(ValidationFailed) as caught:
        submit_job(alice, check_job_request(job_request(instances=20)))
    assert "It fits with 6 workers (7 instances in all)." in caught.value.errors["quota"]
    assert caught.value.detail["fits_with"] == {"role": "worker", "instances": 6}


def test_it_suggests_the_quotas_count_when_that_is_the_smaller(alice: User) -> None:
    set_quota(alice, cpu=4)
    only_node(cpu=7)
    with pytest.raises(ValidationFailed) as caught:
        submit_job(alice, check_job_request(job_request(instances=20)))
    assert "It fits with 3 workers (4 instances in all)." in caught.value.errors["quota"]


def test_it_suggests_nothing_when_no_node_could_hold_even_the_master(alice: User) -> None:
    set_quota(alice, cpu=100, gpus=4, memory_gb=1000)  # the quota alone would allow 1 worker
    with pytest.raises(ValidationFailed) as caught:
        submit_job(alice, check_job_request(job_request(instances=3, package="worker-p100x2")))
    errors = caught.value.errors
    assert "could never start" in errors["roles.master.package"][0]
    assert "fits_with" not in caught.value.detail
    assert not any("fits with" in m for messages in errors.values() for m in messages)


def test_within_quota_it_says_how_many_workers_the_nodes_could_hold(alice: User) -> None:
    set_quota(alice, cpu=100, memory_gb=1000)
    errors = admission_errors(alice, job_request(instances=9, package="cpu-2"))  # 18 > 16
    assert "quota" not in errors
    assert errors["roles"][1] == "It fits with 7 workers (8 instances in all)."


def test_it_never_suggests_a_parameter_server_job_without_workers(alice: User) -> None:
    set_quota(alice, cpu=2)  # the server alone takes both cores
    request = job_request(
        image="kvstore-ps:2.13",
        program={"script": "digits-ps"},
        roles={
            "server": {"package": "cpu-2", "instances": 1},
            "worker": {"package": "cpu-1", "instances": 2},
        },
    )
    with pytest.raises(ValidationFailed) as caught:
        submit_job(alice, check_job_request(request))
    assert "Over quota on CPU cores" in caught.value.errors["quota"][0]
    assert "fits_with" not in caught.value.detail


def test_it_counts_what_active_jobs_hold(alice: User) -> None:
    set_quota(alice, cpu=4)
    submit_job(alice, check_job_request(job_request(instances=3)))
    with pytest.raises(ValidationFailed) as caught:
        submit_job(alice, check_job_request(job_request(instances=2)))
    assert "you have 1 left of 4 (over by 1)" in caught.value.errors["quota"][0]
    Job.objects.update(state=Job.State.SUCCEEDED)
    submit_job(alice, check_job_request(job_request(instances=2)))
    assert Job.objects.count() == 2


def test_it_uses_the_default_quota_for_users_without_one(alice: User) -> None:
    Quota.objects.filter(is_default=True).update(cpu=1)
    with pytest.raises(ValidationFailed) as caught:
        submit_job(alice, check_job_request(job_request(instances=2)))
    assert "left of 1" in caught.value.errors["quota"][0]


def test_it_refuses_everything_when_no_quota_applies(alice: User) -> None:
    Quota.objects.all().delete()
    with pytest.raises(ValidationFailed) as caught:
        submit_job(alice, check_job_request(job_request()))
    assert "ask an admin" in caught.value.errors["quota"][0]


def test_it_limits_the_number_of_running_jobs(alice: User) -> None:
    set_quota(alice, cpu=100, jobs=1)
    submit_job(alice, check_job_request(job_request(instances=1)))
    with pytest.raises(ValidationFailed) as caught:
        submit_job(alice, check_job_request(job_request(instances=1)))
    assert "Over quota on jobs" in caught.value.errors["quota"][0]


def test_it_refuses_at_once_a_gang_the_nodes_could_never_hold_together(alice: User) -> None:
    errors = admission_errors(alice, job_request(instances=9, package="cpu-2"))  # 18 > 16
    assert "could never all run at once" in errors["roles"][0]
    assert "16 CPU cores" in errors["roles"][0]


def test_it_reports_quota_and_capacity_problems_together(alice: User) -> None:
    set_quota(alice, cpu=10)
    errors = admission_errors(alice, job_request(instances=9, package="cpu-2"))
    assert set(errors) == {"roles", "quota"}


@pytest.mark.usefixtures("redis_url")  # the scheduler tells websocket clients of the reason
def test_it_queues_any_request_while_no_node_has_registered_yet(
    alice: User, sent_tasks: SentTasks, django_capture_on_commit_callbacks: Capture
) -> None:
    from jobs.models import Node

    Node.objects.all().delete()
    # Two GPU workers: no node could hold them were any known, but none is yet, so the job
    # waits for one instead of being refused. The commit runs the scheduler, as the console
    # worker would on the message.
    with django_capture_on_commit_callbacks(execute=True):
        job = submit_job(alice, check_job_request(job_request(2, package="worker-p100x2")))
    job.refresh_from_db()

    assert sent_tasks.named(contract.TASK_SCHEDULE)  # the scheduler was asked, and ran
    assert (job.state, job.reason) == (Job.State.QUEUED, "waiting for a node agent to register")
    assert job.gpus_total == 4
    replicas = list(job.replicas.order_by("role", "index"))
    assert [(r.tag, r.state, r.node) for r in replicas] == [
        ("master", Replica.State.PENDING, None),
        ("worker-1", Replica.State.PENDING, None),
    ]
    assert not sent_tasks.named(contract.TASK_START_REPLICA)  # nothing was started anywhere
