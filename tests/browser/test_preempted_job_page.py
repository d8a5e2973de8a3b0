"""What the owner of a preempted job reads on its page: the attempt a higher-priority job ended,
with who preempted it, and its priority class."""

from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, expect

from tests.browser.conftest import user_page
from tests.conftest import TERMINAL, RunningStack, StackClient, pytorch_request, signal_file

pytestmark = [pytest.mark.browser, pytest.mark.integration]

LOW_USER, HIGH_USER, PASSWORD = "prue-low", "hugo-high", "preempt-page-pw-1"
QUOTA = {"cpu": 8, "gpus": 0, "memory_gb": 32, "running_jobs": 2}


@pytest.fixture
def users(stack: RunningStack) -> Iterator[tuple[StackClient, StackClient]]:
    low = stack.create_user(LOW_USER, PASSWORD, quota=QUOTA)
    high = stack.create_user(HIGH_USER, PASSWORD, quota=QUOTA)
    yield low, high
    for client in (low, high):  # nothing of theirs outlives the test
        for job in client.http.get("/api/v1/jobs").json()["jobs"]:
            if job["state"] not in TERMINAL:
                client.http.post(f"/api/v1/jobs/{job['id']}/cancel")
            client.wait_finished(job["id"])


def test_a_preempted_jobs_page_says_which_job_preempted_it(
    browser: Browser, stack: RunningStack, users: tuple[StackClient, StackClient]
) -> None:
    low, high = users
    release = signal_file()
    hold = ["--release", str(release)]
    # 4 x 2 cores: the two nodes of 4 cores each, full.
    victim = low.submit(
        {**pytorch_request("fills", "hold.py", 4, package="cpu-2", args=hold), "priority": "low"}
    )
    low.wait(victim["id"], lambda j: j["state"] == "running")
    urgent = high.submit(
        {**pytorch_request("urgent", "hold.py", 1, package="cpu-2", args=hold), "priority": "high"}
    )
    reason = f"preempted by job {urgent['id']} (high) of {HIGH_USER}"
    low.wait(victim["id"], lambda j: j["attempts"][0]["reason"] == reason)
    high.wait(urgent["id"], lambda j: j["state"] == "running")

    with user_page(browser, stack, LOW_USER, PASSWORD) as page:
        page.goto(f"{stack.url}/jobs/{victim['id']}/")
        expect(page.locator("#priority-summary")).to_contain_text("low")
        expect(page.locator("#priority-summary")).to_contain_text("preempted 1 time")
        attempts = page.locator("#attempts tbody tr")
        expect(attempts.nth(0)).to_contain_text(reason)
        # Waiting again, in its old place, while the urgent job runs.
        expect(page.locator("#job-state")).to_have_text("queued")

    release.touch()
    assert high.wait_finished(urgent["id"])["state"] == "succeeded"
    done = low.wait_finished(victim["id"])
    assert done["state"] == "succeeded", done["reason"]
    assert done["restarts_used"] == 0 and not done["attempts"][0]["counted"]
