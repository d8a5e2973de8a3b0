"""A person's view of admission: a job that waits says why and where it stands; the quota
page shows use against limits."""

import re

import pytest
from playwright.sync_api import Page, expect

from tests.conftest import RunningStack, pytorch_request

pytestmark = [pytest.mark.browser, pytest.mark.integration]


def test_a_queued_job_shows_its_reason_and_position_then_starts(
    page: Page, stack: RunningStack
) -> None:
    admin = stack.admin
    # 3 x 2 cores on two nodes of 4: node-1 full, node-2 has 2 cores left.
    blocker = admin.submit(pytorch_request("blocker", "sleep_tree.py", 3, package="cpu-2"))
    admin.wait(blocker["id"], lambda j: j["state"] == "running")
    waiting = admin.submit(pytorch_request("waits", "sleep_tree.py", 2, package="cpu-2"))
    job = admin.wait(waiting["id"], lambda j: j["reason"].startswith("waiting:"))
    assert job["queue_position"] == 1

    page.goto(f"{stack.url}/jobs/{waiting['id']}/")
    expect(page.locator("#job-state")).to_have_text("queued")
    expect(page.locator("#queue-position")).to_have_text("Position in the queue: 1")
    expect(page.locator("#job-reason")).to_have_text(
        re.compile(
            r"^waiting: needs a node with 2 CPU cores and 4 GB free; node-\d frees 2 CPU cores "
            rf"when job {blocker['id']} ends$"
        )
    )

    assert admin.http.post(f"/api/v1/jobs/{blocker['id']}/cancel").status_code == 200
    # Freed room admits the waiting job, and the page follows without a reload.
    expect(page.locator("#job-state")).to_have_text("running")
    expect(page.locator("#queue-position")).to_be_hidden()
    assert admin.http.post(f"/api/v1/jobs/{waiting['id']}/cancel").status_code == 200
    admin.wait_finished(waiting["id"])
    admin.wait_finished(blocker["id"])


def test_the_quota_page_shows_each_users_use_against_the_limit(
    page: Page, stack: RunningStack
) -> None:
    quinn = stack.create_user("quinn", "quinn-password-1")
    stack.stack.manage(
        "shell",
        "-c",
        "from django.contrib.auth.models import User; from jobs.models import Quota; "
        "Quota.objects.create(user=User.objects.get(username='quinn'), cpu=2, gpus=0, "
        "memory_gb=8, running_jobs=2)",
    )
    job = quinn.submit(pytorch_request("quinn's", "sleep_tree.py", 1, package="cpu-2"))
    refused = quinn.http.post("/api/v1/jobs", json=pytorch_request("more", "markup.py", 1))
    assert refused.status_code == 400
    assert refused.json()["errors"]["quota"][0].startswith("Over quota on CPU cores")

    page.goto(f"{stack.url}/quotas/")
    row = page.locator("#quotas tr[data-name=quinn]")
    expect(row.locator("td[data-resource=cpu]")).to_have_text("2 / 2")
    expect(row.locator("td[data-resource=cpu]")).to_have_class("full")
    expect(row.locator("td[data-resource=jobs]")).to_have_text("1 / 2")
    expect(page.locator("#quotas tr[data-name=admin]")).to_be_visible()
    quinn.http.post(f"/api/v1/jobs/{job['id']}/cancel")
    quinn.wait_finished(job["id"])

    page.goto(f"{stack.url}/nodes/")
    expect(page.locator("#nodes tr[data-node=node-1] .state")).to_have_text("ready")
    expect(page.locator("#nodes tr[data-node=node-2] .state")).to_have_text("ready")
