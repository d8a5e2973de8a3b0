"""What an instance used, as its agent reports it when it ends (workers/cgroups.Usage, from the
instance's cgroup): kept on the replica, and a malformed figure kept as unknown. The specs the
console sends carry the package's limits for the agent to hold the instance to."""

import pytest

from jobs.models import Job, Replica
from jobs.services.lifecycle import reports
from tests.unit.helpers import SentTasks
from tests.unit.test_lifecycle import Capture, launched, node_of, report_started
from workers import contract

pytestmark = pytest.mark.usefixtures("catalog", "code_root", "redis_url")
__all__ = ["launched"]  # the job, as test_lifecycle submits it


@pytest.fixture
def running(launched: Job, django_capture_on_commit_callbacks: Capture) -> Job:
    report_started(launched, django_capture_on_commit_callbacks)
    return launched


def end(job: Job, tag: str, usage: object) -> Replica:
    replica = next(r for r in job.replicas.select_related("node") if r.tag == tag)
    reports.replica_exited(
        job.pk, replica.role, replica.index, node_of(replica), "succeeded", 0, "", [],
        usage=usage,  # type: ignore[arg-type]
    )  # fmt: skip
    replica.refresh_from_db()
    return replica


def test_the_specs_carry_the_packages_limits(running: Job, sent_tasks: SentTasks) -> None:
    specs = [kw["spec"] for _, kw, _ in sent_tasks.named(contract.TASK_START_REPLICA)]
    assert {(s["package"], s["cpus"], s["memory_gb"], s["disk_gb"]) for s in specs} == {
        ("cpu-2", 2, 4.0, 20.0)
    }
    assert {s["max_processes"] for s in specs} == {4096}


def test_an_instances_use_is_kept_and_nonsense_is_not(running: Job) -> None:
    kept = end(running, "master", {"cpu_seconds": 12.5, "memory_peak_bytes": 3 << 30})
    assert (kept.cpu_seconds, kept.memory_peak_bytes) == (12.5, 3 << 30)
    odd = end(running, "worker-1", {"cpu_seconds": float("nan"), "memory_peak_bytes": -1})
    assert (odd.cpu_seconds, odd.memory_peak_bytes) == (None, None)


def test_an_agent_without_limits_reports_no_use(running: Job) -> None:
    replica = end(running, "master", None)
    assert (replica.cpu_seconds, replica.memory_peak_bytes) == (None, None)
