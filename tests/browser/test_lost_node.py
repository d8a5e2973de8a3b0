"""What a person sees when a node is lost under their job: the job page turns to failed and
says which node, live, without a reload."""

import re
import signal
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.browser.conftest import admin_page
from tests.conftest import RunningStack, pytorch_request, signal_file

pytestmark = [pytest.mark.browser, pytest.mark.integration]


def test_a_lost_node_fails_the_job_on_its_page_with_the_reason(
    browser: Browser, fault_stack: RunningStack, tmp_path: Path
) -> None:
    release = signal_file()
    job = fault_stack.admin.submit(
        pytorch_request("watched node", "hold.py", 2, args=["--release", str(release)])
    )
    with admin_page(browser, fault_stack) as page:
        watch_the_node_go(page, fault_stack, job["id"])
    fault_stack.admin.wait_finished(job["id"])


def watch_the_node_go(page: Page, fault_stack: RunningStack, job_id: int) -> None:
    page.goto(f"{fault_stack.url}/jobs/{job_id}/")
    expect(page.locator("#job-state")).to_have_text("running")
    expect(page.locator("#log .line[data-tag=worker-1]").first).to_be_visible()
    node = next(
        r["node"] for r in fault_stack.admin.job(job_id)["replicas"] if r["tag"] == "master"
    )
    fault_stack.stack.kill(node, signal.SIGSTOP)
    try:
        expect(page.locator("#job-state")).to_have_text("failed")
        expect(page.locator("#job-reason")).to_contain_text(
            re.compile(rf"{node} lost: no heartbeat for \d+ s \(master")
        )
        # Each instance's own ending shows in its row.
        expect(page.locator("#replicas tr[data-tag=master]")).to_contain_text(f"{node} lost")
    finally:
        fault_stack.stack.kill(node, signal.SIGCONT)
