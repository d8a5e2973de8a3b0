"""The New-job form's "One instance per node" (issue 49, item 11): more instances than the
stack's two nodes is told before Launch and refused at Launch, saying why, and two instances
launched with it run on two nodes, which the job page says."""

import re

import pytest
from playwright.sync_api import Browser, expect

from tests.browser.conftest import keep_screenshot, user_page
from tests.conftest import RunningStack

pytestmark = [pytest.mark.browser, pytest.mark.integration]


def test_one_instance_per_node_from_the_form(browser: Browser, stack: RunningStack) -> None:
    ines = stack.create_user(
        "ines", "ines-password-1", quota={"cpu": 4, "gpus": 0, "memory_gb": 16, "running_jobs": 1}
    )
    with user_page(browser, stack, "ines", "ines-password-1") as page:
        page.goto(f"{stack.url}/jobs/new/")
        page.fill("#id_name", "spread")
        # Named, not left to the default (the first PyTorch image by name): tests beside
        # this one add images to the shared stack.
        page.select_option("#id_image", "pytorch:2.13-cpu")
        page.select_option("#id_script", "__path__")
        page.fill("#id_script_path", "env_dump.py")
        page.select_option("#id_package", "cpu-1")
        page.fill("#id_instances", "3")
        expect(page.locator("#advice")).to_be_hidden()  # sharing nodes, three fit
        page.check("#id_one_instance_per_node")
        # The preview says it before Launch, with the count that fits.
        expect(page.locator("#advice")).to_contain_text(
            "The 3 instances go one per node, and there are only 2 nodes."
        )
        expect(page.locator("#fits-with")).to_have_text(
            "It fits with 1 worker (2 instances in all)."
        )
        keep_screenshot(page, "new-job-one-per-node-preview")
        page.wait_for_load_state("networkidle")  # the preview redraws above Launch
        page.click("#launch")
        expect(page.locator("#form-errors")).to_contain_text(
            "The 3 instances go one per node, and there are only 2 nodes. Use fewer "
            "instances, or let instances share a node."
        )
        expect(page.locator("#id_one_instance_per_node")).to_be_checked()
        keep_screenshot(page, "new-job-one-per-node-refused")

        page.fill("#id_instances", "2")
        page.wait_for_load_state("networkidle")
        page.click("#launch")
        page.wait_for_url(re.compile(r"/jobs/\d+/$"))
        job_id = int(page.url.rstrip("/").rsplit("/", 1)[1])
        expect(page.locator("#one-per-node")).to_have_text("one instance per node")
        job = ines.wait_finished(job_id)
        keep_screenshot(page, "job-one-per-node")
    assert job["state"] == "succeeded", job["reason"]
    assert job["one_instance_per_node"] is True
    assert len({r["node"] for r in job["replicas"]}) == 2, job["replicas"]
