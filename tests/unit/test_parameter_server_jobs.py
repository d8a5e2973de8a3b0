"""Parameter-server jobs on the console side: validation, totals, replicas, placement, specs."""

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User

from jobs.models import Job, Node
from jobs.services.submission import ValidationFailed, check_job_request, submit_job
from tests.unit.helpers import SentTasks
from workers import contract
from workers.launcher import build_processes
from workers.spec import ReplicaSpec

pytestmark = pytest.mark.usefixtures("catalog", "code_root", "redis_url")

Capture = Callable[..., Any]


def ps_request(servers: int = 2, workers: int = 2, **overrides: Any) -> dict[str, Any]:
    request: dict[str, Any] = {
        "name": "ps digits",
        "image": "kvstore-ps:2.13",
        "program": {"script": "digits-ps", "args": ["--epochs", "2"]},
        "roles": {
            "server": {"package": "server-2c12g", "instances": servers},
            "worker": {"package": "cpu-1", "instances": workers},
        },
        "kvstore": "dist_async",
    }
    request.update(overrides)
    return request


def errors_of(data: dict[str, Any]) -> dict[str, list[str]]:
    with pytest.raises(ValidationFailed) as caught:
        check_job_request(data)
    return caught.value.errors


def test_totals_follow_seed_004_and_leave_the_scheduler_uncharged() -> None:
    request = check_job_request(ps_request(servers=1, workers=2))
    assert (request.totals.cpu, request.totals.memory_gb) == (2 * 1 + 1 * 2, 12 + 2 * 2)
    assert request.totals.formulas["cpu"] == "server 2×1 + worker 1×2 = 4"
    assert request.kvstore == "dist_async"


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"kvstore": "dist_sometimes"}, "kvstore"),
        ({"roles": {"worker": {"package": "cpu-1", "instances": 2}}}, "roles.server"),
        ({"roles": {"server": {"package": "cpu-1", "instances": 1}}}, "roles.worker"),
        (
            {
                "roles": {
                    "server": {"package": "cpu-1", "instances": 0},
                    "worker": {"package": "cpu-1", "instances": 1},
                }
            },
            "roles.server.instances",
        ),
        (
            {
                "roles": {
                    "scheduler": {"package": "cpu-1", "instances": 1},
                    "server": {"package": "cpu-1", "instances": 1},
                    "worker": {"package": "cpu-1", "instances": 1},
                }
            },
            "roles",
        ),
        ({"roles": {"master": {"package": "cpu-1", "instances": 1}}}, "roles"),
        ({"program": {"script": "digits-ddp"}}, "program.script"),
    ],
)
def test_it_names_what_is_wrong_with_a_parameter_server_request(
    overrides: dict[str, Any], field: str
) -> None:
    assert field in errors_of(ps_request(**overrides))


def test_a_pytorch_job_takes_no_kvstore_mode_nor_a_ps_program() -> None:
    base = {
        "name": "ddp",
        "image": "pytorch:2.13-cpu",
        "program": {"script": "digits-ddp"},
        "roles": {"master": {"package": "cpu-1", "instances": 1}},
    }
    assert "kvstore" in errors_of({**base, "kvstore": "dist_sync"})
    assert "program.script" in errors_of({**base, "program": {"script": "digits-ps"}})


def test_the_mode_defaults_to_dist_sync() -> None:
    request = ps_request()
    del request["kvstore"]
    assert check_job_request(request).kvstore == "dist_sync"


def test_it_places_scheduler_servers_and_workers_and_sends_dmlc_specs(
    alice: User,
    nodes: list[Node],
    sent_tasks: SentTasks,
    django_capture_on_commit_callbacks: Capture,
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        job = submit_job(alice, check_job_request(ps_request()))
    job.refresh_from_db()
    replicas = {r.tag: r for r in job.replicas.select_related("node")}
    assert sorted(replicas) == ["scheduler", "server-0", "server-1", "worker-0", "worker-1"]
    assert replicas["scheduler"].package is None
    assert replicas["scheduler"].node == replicas["server-0"].node
    assert job.cpu_total == 2 * 2 + 1 * 2  # the scheduler is not charged
    specs = [
        ReplicaSpec.from_dict(kw["spec"])
        for _, kw, _ in sent_tasks.named(contract.TASK_START_REPLICA)
    ]
    assert [(s.role, s.index) for s in specs] == [
        ("scheduler", 0),
        ("server", 0),
        ("server", 1),
        ("worker", 0),
        ("worker", 1),
    ]
    assert [s.hosts_rendezvous for s in specs] == [True, False, False, False, False]
    assert {(s.num_servers, s.num_workers, s.kvstore) for s in specs} == {(2, 2, "dist_async")}
    (proc,) = build_processes(specs[3], Path("t.py"), 9100, Path("/i"), Path("/ck"), [])
    env = proc.env
    assert {
        k: env[k]
        for k in (
            contract.DMLC_ROLE,
            contract.DMLC_PS_ROOT_URI,
            contract.DMLC_PS_ROOT_PORT,
            contract.DMLC_NUM_SERVER,
            contract.DMLC_NUM_WORKER,
            contract.TRAINYARD_KVSTORE,
        )
    } == {
        "DMLC_ROLE": "worker",
        "DMLC_PS_ROOT_URI": "127.0.0.1",
        "DMLC_PS_ROOT_PORT": "9100",
        "DMLC_NUM_SERVER": "2",
        "DMLC_NUM_WORKER": "2",
        "TRAINYARD_KVSTORE": "dist_async",
    }
    assert env["TRAINYARD_ROLE"] == "worker" and env["TRAINYARD_INDEX"] == "0"
    assert "MASTER_ADDR" not in env and "RANK" not in env
    assert Job.objects.get().kvstore == "dist_async"
