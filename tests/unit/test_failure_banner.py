"""A failed job's page leads with a banner: what failed, where, the exit code or the signal
by name, the last error lines, and Run again. Other pages have none."""

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from jobs.models import Job
from jobs.services.lifecycle import reports
from jobs.services.submission import check_job_request, submit_job
from tests.unit.helpers import job_request

pytestmark = pytest.mark.usefixtures("catalog", "code_root", "nodes", "redis_url", "sent_tasks")

Capture = Callable[..., Any]


def failed_job(alice: User, capture: Capture, code: int, tail: list[str]) -> Job:
    with capture(execute=True):
        job = submit_job(alice, check_job_request(job_request(instances=2)))
    replicas = list(job.replicas.select_related("node").order_by("id"))
    for r in replicas:
        with capture(execute=True):
            reports.replica_started(job.pk, r.role, r.index, r.node.name)  # type: ignore[union-attr]
    worker = replicas[1]
    assert worker.node is not None
    how = "killed by signal SIGTERM" if code == -15 else f"exited with code {code}"
    with capture(execute=True):
        reports.replica_exited(
            job.pk,
            worker.role,
            worker.index,
            worker.node.name,
            "failed",
            code,
            how,
            tail,
        )
    job.refresh_from_db()
    assert job.state == Job.State.FAILED
    return job


def test_it_names_the_instance_node_and_signal_and_shows_the_last_lines(
    client: Client, alice: User, django_capture_on_commit_callbacks: Capture
) -> None:
    tail = ["Traceback (most recent call last):", "<b>ValueError</b>: bad batch"]
    job = failed_job(alice, django_capture_on_commit_callbacks, -15, tail)
    client.force_login(alice)
    html = client.get(f"/jobs/{job.pk}/").content.decode()
    banner = html[html.index('id="failure-banner"') : html.index("</section>")]
    assert (
        '<strong>Instance</strong> [worker-1] · <strong>Node</strong> <span class="node-name">node-'
        in banner
    )
    assert '<span id="failure-how">killed by signal SIGTERM</span>' in banner
    assert "-15" not in banner
    assert "&lt;b&gt;ValueError&lt;/b&gt;: bad batch" in banner  # a trainer's text is text
    assert 'id="banner-run-again"' in banner
    # The first thing offered changes what failed; Run again repeats the failing arguments.
    assert banner.index('class="button primary" id="banner-edit-again"') < banner.index(
        'id="banner-run-again"'
    )
    worker = client.get(f"/api/v1/jobs/{job.pk}").json()["replicas"][1]
    assert (worker["exit_code"], worker["signal"]) == (-15, "SIGTERM")
    # The banner comes before everything else the page shows of the job.
    assert html.index('id="failure-banner"') < html.index('class="summary card"')


def test_an_exit_code_is_shown_as_a_code(
    client: Client, alice: User, django_capture_on_commit_callbacks: Capture
) -> None:
    job = failed_job(alice, django_capture_on_commit_callbacks, 3, [])
    client.force_login(alice)
    html = client.get(f"/jobs/{job.pk}/").content.decode()
    assert '<span id="failure-how">exited with code 3</span>' in html
    assert 'id="failure-lines"' not in html


def test_a_job_that_did_not_fail_has_no_banner_but_can_run_again(
    client: Client, alice: User
) -> None:
    job = submit_job(alice, check_job_request(job_request(instances=1)))
    client.force_login(alice)
    html = client.get(f"/jobs/{job.pk}/").content.decode()
    assert 'id="failure-banner"' not in html
    assert 'id="run-again"' in html and 'id="edit-again"' in html


def test_an_ended_jobs_cost_is_its_cost_not_so_far(
    client: Client, alice: User, django_capture_on_commit_callbacks: Capture
) -> None:
    running = submit_job(alice, check_job_request(job_request(instances=1)))
    client.force_login(alice)
    assert "Cost so far" in client.get(f"/jobs/{running.pk}/").content.decode()
    ended = failed_job(alice, django_capture_on_commit_callbacks, 1, ["boom"])
    html = client.get(f"/jobs/{ended.pk}/").content.decode()
    assert "Cost so far" not in html
    assert '<span class="figure-label">Cost</span>' in html
