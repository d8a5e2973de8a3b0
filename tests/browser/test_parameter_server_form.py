"""Launching a parameter-server job from the form: servers, workers, mode and the formula."""

import re

import pytest
from playwright.sync_api import Page, expect

from tests.conftest import RunningStack

pytestmark = [pytest.mark.browser, pytest.mark.integration]


def test_launch_a_parameter_server_job_and_filter_its_roles(
    page: Page, stack: RunningStack
) -> None:
    page.goto(f"{stack.url}/jobs/new/")
    page.fill("#id_name", "ps from the browser")
    page.select_option("#id_image", "kvstore-ps:2.13")
    page.select_option("#id_image", "pytorch:2.13-cpu")
    # Each image's first example is its default: digits-ddp, not the benchmark.
    expect(page.locator("#id_script")).to_have_value("digits-ddp")
    page.select_option("#id_image", "kvstore-ps:2.13")
    expect(page.locator("#field-servers")).to_be_visible()
    expect(page.locator("#field-instances")).to_be_hidden()
    expect(page.locator("#id_script")).to_have_value("digits-ps")
    page.fill("#id_args", "--epochs 3 --batch-size 32")
    page.select_option("#id_server_package", "server-2c12g")
    page.fill("#id_servers", "1")
    page.select_option("#id_worker_package", "cpu-1")
    page.fill("#id_workers", "2")
    page.select_option("#id_kvstore", "dist_sync")
    # A parameter-server shape: server 2 cores × 1 + worker 1 core × 2.
    expect(page.locator("#formula")).to_contain_text("CPU_total = server 2×1 + worker 1×2 = 4")
    expect(page.locator("#ps-notes")).to_contain_text("scheduler (1 instance) is not charged")
    expect(page.locator("#ps-notes")).to_contain_text("global batch = 2 × 32 = 64")
    expect(page.locator("#roles-preview")).to_have_text(
        "Instances: [scheduler] [server-0] [worker-0] [worker-1]"
    )
    page.click("#launch")
    page.wait_for_url(re.compile(r"/jobs/\d+/$"))
    expect(page.locator("#global-batch")).to_contain_text("global batch = 2 × 32 = 64")
    log = page.locator("#log")
    expect(log.locator(".line[data-tag=scheduler]").first).to_be_visible()
    expect(log.locator(".line[data-tag=server-0]").first).to_be_visible()
    expect(page.locator("#job-state")).to_have_text("succeeded")
    page.click("#log-tabs >> text=[server-0]")
    expect(log.locator(".line[data-tag=worker-0]").first).to_be_hidden()
    expect(log.locator(".line[data-tag=server-0]").last).to_contain_text("bytes_in=")
