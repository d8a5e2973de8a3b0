"""The job page's Artifacts section: listed when asked, each file with its size and a link that
downloads it; the checkpoint the digits example saved comes down byte for byte (Playwright's
download API), and a planted link is named as not served."""

import uuid
from pathlib import Path

import pytest
from playwright.sync_api import Browser, expect

from tests.browser.conftest import keep_screenshot, user_page
from tests.conftest import RunningStack, pytorch_request

pytestmark = [pytest.mark.browser, pytest.mark.integration]

PASSWORD = "artifact-password-1"
QUOTA = {"cpu": 4, "gpus": 0, "memory_gb": 16, "running_jobs": 2}


def test_a_checkpoint_is_downloaded_from_the_job_page(
    browser: Browser, stack: RunningStack, tmp_path: Path
) -> None:
    username = f"ada-{uuid.uuid4().hex[:6]}"
    ada = stack.create_user(username, PASSWORD, quota=QUOTA)
    request = pytorch_request("digits, saved", "digits-ddp", 1, args=["--epochs", "1"])
    job_id = ada.submit(request)["id"]
    assert ada.wait_finished(job_id)["state"] == "succeeded"
    [folder] = (stack.stack.var_dir / "agents" / "checkpoints").glob(f"job-{job_id}-*")

    with user_page(browser, stack, username, PASSWORD) as page:
        page.goto(f"{stack.url}/jobs/{job_id}/")
        table = page.locator("#artifacts-table")
        expect(table).to_be_hidden()  # nothing is asked of the nodes before the user asks
        page.click("#artifacts-load")
        row = table.locator('tr[data-path="checkpoints/latest.pt"]')
        expect(row).to_be_visible()
        expect(page.locator("#artifacts-status")).to_contain_text("as node-")
        size = (folder / "latest.pt").stat().st_size
        expect(row.locator("td").nth(2)).to_have_attribute("title", f"{size} bytes")
        page.locator("#artifacts-section").scroll_into_view_if_needed()
        shot = keep_screenshot(page, "job-artifacts")
        with page.expect_download() as started:
            row.get_by_role("link", name="Download").click()
        download = started.value
        assert download.suggested_filename == "latest.pt"
        saved_to = tmp_path / "latest.pt"
        download.save_as(saved_to)
        assert saved_to.read_bytes() == (folder / "latest.pt").read_bytes()
    assert shot.exists()
