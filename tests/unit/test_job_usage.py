"""Use against the request (jobs/services/views/efficiency.py), as seff shows it: the arithmetic,
and the figures on the job page and in the API."""

from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from jobs.models import ApiToken, Job, Node, Replica
from jobs.services.submission import check_job_request, submit_job
from jobs.services.views import comparison, efficiency
from tests.unit.helpers import SentTasks, job_request
from tests.unit.test_lifecycle import Capture

pytestmark = pytest.mark.usefixtures("catalog", "code_root", "redis_url")


@pytest.fixture
def measured(
    alice: User,
    nodes: list[Node],
    sent_tasks: SentTasks,
    django_capture_on_commit_callbacks: Capture,
) -> Job:
    """Two cpu-2 instances (2 cores, 4 GB each) that each ran 100 s: the master used 100
    CPU-seconds and peaked at 1 GB, the worker 50 and 3 GB."""
    with django_capture_on_commit_callbacks(execute=True):
        job = submit_job(alice, check_job_request(job_request(instances=2, package="cpu-2")))
    start = timezone.now() - timedelta(seconds=200)
    for replica, cpu, peak in zip(
        job.replicas.order_by("role"), (100.0, 50.0), (1 << 30, 3 << 30), strict=True
    ):
        Replica.objects.filter(pk=replica.pk).update(
            state=Replica.State.SUCCEEDED, started=start, finished=start + timedelta(seconds=100),
            cpu_seconds=cpu, memory_peak_bytes=peak,
        )  # fmt: skip
    return job


def test_the_figures_are_what_was_used_of_what_was_held(measured: Job) -> None:
    use = efficiency.of_job(measured)
    assert use is not None
    assert (use.cores_asked, use.cores_used) == (4, 1.5)
    assert use.cpu_efficiency == pytest.approx(150 / 400)
    assert (use.memory_peak_gb, use.memory_asked_gb) == (4.0, 8.0)
    assert use.headline == (
        "CPU efficiency 38 %: asked 4 cores, used 1.5 on average; memory peak 4.0 of 8 GB"
    )
    master = next(i for i in use.instances if i.tag == "master")
    assert (master.cores_used, master.cpu_efficiency, master.memory_efficiency) == (1.0, 0.5, 0.25)


def test_nothing_measured_says_nothing(
    alice: User, nodes: list[Node], sent_tasks: SentTasks
) -> None:
    job = submit_job(alice, check_job_request(job_request(instances=2, package="cpu-2")))
    assert efficiency.of_job(job) is None


def test_the_page_and_the_api_show_them(measured: Job, alice: User, client: Client) -> None:
    answer = client.get(
        f"/api/v1/jobs/{measured.pk}", HTTP_AUTHORIZATION=f"Token {ApiToken.issue(alice)}"
    ).json()
    usage = answer["usage"]
    assert usage["summary"].startswith("CPU efficiency 38 %")
    assert usage["cpu_efficiency"] == 0.375 and usage["cores_used"] == 1.5
    assert {i["instance"]: i["cpu_efficiency"] for i in usage["instances"]} == {
        "master": 0.5,
        "worker-1": 0.25,
    }
    listed = client.get("/api/v1/jobs", HTTP_AUTHORIZATION=f"Token {ApiToken.issue(alice)}")
    assert listed.json()["jobs"][0]["usage"]["cpu_efficiency"] == 0.375
    client.force_login(alice)
    html = client.get(f"/jobs/{measured.pk}/").content.decode()
    assert "CPU efficiency 38 %: asked 4 cores, used 1.5 on average" in html
    assert '<tr data-instance="worker-1"><td>worker-1</td>' in html
    assert "<td>25 %</td>" in html and "3.00 / 4 GB" in html


def test_the_least_efficient_jobs_and_users_of_the_day(measured: Job) -> None:
    jobs, users = efficiency.least_efficient()
    assert [w.job_id for w in jobs] == [measured.pk]
    assert [w.label for w in users] == ["alice"]
    assert jobs[0].use.cpu_efficiency == pytest.approx(0.375)
    # Over a user's jobs, which ran at different times: core-hours, not cores at once.
    assert users[0].summary == (
        "CPU efficiency 38 %: used 0.04 of 0.11 core-hours held over 1 job; memory peaks 50 % "
        "of what was asked, on average"
    )


def test_the_compare_page_rows_show_each_jobs_use(
    measured: Job, alice: User, sent_tasks: SentTasks
) -> None:
    other = submit_job(alice, check_job_request(job_request(instances=2, package="cpu-2")))
    rows = {r.key: r for r in comparison.configuration_rows([measured, other], alice)}
    assert rows["use.cpu"].values == ("38 % (1.5 of 4 cores on average)", "not measured")
    assert rows["use.memory"].values == ("4.0 of 8 GB", "not measured")
    assert rows["use.cpu"].differs


def test_admins_see_the_least_efficient_on_the_quotas_page(
    measured: Job, alice: User, charlie_admin: User, client: Client
) -> None:
    client.force_login(charlie_admin)
    html = client.get("/quotas/").content.decode()
    assert 'id="least-efficient-jobs"' in html
    assert f'<tr data-job="{measured.pk}">' in html and "CPU efficiency 38 %" in html
    assert '<tr data-user="alice"><td>alice</td>' in html
    client.force_login(alice)
    assert "least-efficient" not in client.get("/quotas/").content.decode()
