"""A job whose trainers run in containers, as its owner sees it: the New job form says where
the chosen image runs (and offers a field for an image of one's own where the image lets one
in), and the job page names the container image beside the image and shows each instance's
node."""

import pytest
from playwright.sync_api import Browser, expect

from tests.browser.conftest import keep_screenshot, user_page
from tests.conftest import RunningStack, pytorch_request
from tests.integration.test_containers import (
    containers_of,
    register_container_image,
    retire_image,
    ticking,
    trainer_image_here,
)

pytestmark = [pytest.mark.browser, pytest.mark.integration]

IMAGE = "pytorch:2.13-in-a-container"
BRING = "pytorch:2.13-bring-your-own"
QUOTA = {"cpu": 4, "gpus": 0, "memory_gb": 32, "running_jobs": 2}


def test_the_job_page_names_the_container_image_and_the_nodes(
    browser: Browser, stack: RunningStack
) -> None:
    reference = trainer_image_here("the container job page")
    register_container_image(stack, IMAGE, "pytorch:2.13-cpu", reference)
    register_container_image(
        stack, BRING, "pytorch:2.13-cpu", "", lets_in=("localhost/trainyard-trainer",)
    )
    user = stack.create_user("contained", "contained-pw-1", quota=QUOTA)
    try:
        request = pytorch_request(
            "in containers", "ticker.py", 2, args=["--stop", "/never", "--every", "0.5"]
        )
        job = user.submit({**request, "image": IMAGE})
        user.wait(job["id"], lambda j: j["state"] == "running")
        with user_page(browser, stack, "contained", "contained-pw-1") as page:
            page.goto(f"{stack.url}/jobs/new/")
            page.select_option("#id_image", IMAGE)
            note = page.locator(f".image-runs-in[data-image='{IMAGE}']")
            expect(note).to_be_visible()
            expect(note).to_contain_text(f"Runs in the container image {reference}")
            expect(page.locator("#field-container_image")).to_be_hidden()  # it lets none in
            page.select_option("#id_image", BRING)
            expect(page.locator(f".image-runs-in[data-image='{BRING}']")).to_contain_text(
                "Runs on each node's own Python, no container."
            )
            expect(page.locator("#field-container_image")).to_be_visible()
            expect(page.locator(f".image-brought[data-image='{BRING}']")).to_contain_text(
                f"{BRING} lets in references starting with localhost/trainyard-trainer"
            )
            expect(page.locator(".image-runs-in:visible")).to_have_count(1)  # the chosen's
            expect(page.locator("#totals tr[data-resource=cpu] .need")).to_have_text("2")
            keep_screenshot(page, "new-job-own-image")

            page.goto(f"{stack.url}/jobs/{job['id']}/")
            expect(page.locator("#job-image")).to_contain_text(
                f"{IMAGE} · in the container image {reference}"
            )
            nodes = {r["node"] for r in user.job(job["id"])["replicas"]}
            for node in nodes:
                expect(page.locator("#replicas")).to_contain_text(node)
            expect(page.locator("#log .line[data-tag=worker-1]").first).to_be_visible()
            keep_screenshot(page, "job-in-containers")
        assert len(containers_of(job["id"])) == 2 and len(ticking(user, job["id"])) == 2
        assert user.http.post(f"/api/v1/jobs/{job['id']}/cancel").status_code == 200
        assert user.wait_finished(job["id"])["state"] == "cancelled"
    finally:
        retire_image(stack, IMAGE)
        retire_image(stack, BRING)
