"""Keeping a job from its page: the retention line says when its log and metrics go, the form
keeps the job, gives it days of its own, or refuses a bad number and changes nothing; the
admins' Storage page then says it never goes."""

import pytest
from playwright.sync_api import Browser, expect

from tests.browser.conftest import admin_page, user_page
from tests.conftest import RunningStack, pytorch_request

pytestmark = [pytest.mark.browser, pytest.mark.integration]

USER, PASSWORD = "rita", "rita-password-1"
QUOTA = {"cpu": 8, "gpus": 0, "memory_gb": 32, "running_jobs": 2}


def test_a_job_is_kept_and_given_days_from_its_page(browser: Browser, stack: RunningStack) -> None:
    rita = stack.create_user(USER, PASSWORD, quota=QUOTA)
    job_id = rita.submit(pytorch_request("short", "report_metrics.py", 1))["id"]
    assert rita.wait_finished(job_id)["state"] == "succeeded"

    with user_page(browser, stack, USER, PASSWORD) as page:
        page.goto(f"{stack.url}/jobs/{job_id}/")
        text = page.locator("#retention-text")
        expect(text).to_contain_text("log and metrics removed after")

        # The change is a setting behind the rule's own line, not a form in the summary.
        expect(page.locator("#retention-form")).to_be_hidden()
        page.click("#retention-edit")
        page.check("#retention-keep")
        page.click("#retention-save")
        expect(text).to_have_text("kept: its log and metrics are never removed")
        assert rita.job(job_id)["retention"]["keep"] is True

        page.click("#retention-edit")
        page.uncheck("#retention-keep")
        page.fill("#retention-days", "0")
        page.click("#retention-save")
        expect(text).to_have_text("log and metrics kept forever")
        assert rita.job(job_id)["retention"] | {"expires": None} == {
            "keep": False,
            "days": 0,
            "own_days": True,
            "expires": None,
            "pruned": None,
        }

    rita.wait(job_id, lambda j: j["log_archived"])  # the page counts what the database holds
    with admin_page(browser, stack) as page:
        page.goto(f"{stack.url}/")
        page.click("nav >> text=Storage")
        row = page.locator(f'#storage-jobs tr[data-job="{job_id}"]')
        expect(row.locator('[data-figure="goes"]')).to_have_text("never")
        expect(page.locator('#storage-users tr[data-user="rita"]')).to_be_visible()
