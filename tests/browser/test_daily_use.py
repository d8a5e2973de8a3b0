"""Daily use from the browser: a failed job's page leads with a banner that names the
signal; Edit and run again with one argument changed, and the new job succeeds; the job list
filtered to a user's failed jobs finds one by name, and keeps the filter in the URL."""

import re
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import Browser, expect

from tests.browser.conftest import admin_page, keep_screenshot, user_page
from tests.browser.training_page import shown_while_empty
from tests.conftest import RunningStack, StackClient, pytorch_request

pytestmark = [pytest.mark.browser, pytest.mark.integration]

USER, PASSWORD = "dana", "dana-password-1"
QUOTA = {"cpu": 8, "gpus": 0, "memory_gb": 32, "running_jobs": 2}


@pytest.fixture(scope="module")
def dana(stack: RunningStack) -> StackClient:
    return stack.create_user(USER, PASSWORD, quota=QUOTA)


@pytest.fixture(scope="module")
def failed(dana: StackClient) -> Iterator[dict[str, Any]]:
    """One failed job, shared by the tests: killed by SIGTERM."""
    job = dana.submit(
        pytorch_request("die-by-signal", "die_by.py", 2, args=["--die-by", "SIGTERM"])
    )
    yield dana.wait_finished(job["id"])


def test_a_failed_jobs_page_leads_with_the_banner_and_the_signal_name(
    browser: Browser, stack: RunningStack, failed: dict[str, Any]
) -> None:
    assert failed["state"] == "failed"
    with user_page(browser, stack, USER, PASSWORD) as page:
        page.goto(f"{stack.url}/jobs/{failed['id']}/")
        banner = page.locator("#failure-banner")
        expect(banner).to_be_visible()
        expect(page.locator("#failure-how")).to_have_text("killed by signal SIGTERM")
        expect(page.locator("#failure-where")).to_contain_text(re.compile(r"\[(master|worker-1)\]"))
        expect(page.locator("#failure-lines")).to_contain_text("the data loader hung")
        expect(banner).not_to_contain_text("-15")
        # The Instances table names the signal too.
        expect(page.locator("#replicas tbody tr").first.locator("td").nth(3)).to_have_text(
            "SIGTERM"
        )
        expect(page.locator("#banner-run-again")).to_be_visible()
        # It failed before reporting any metric: no empty figure card, chart or bar.
        assert shown_while_empty(page) == {"cards": [], "empty_charts": [], "others": []}
        # The agents' samples of its use are not counted as training points.
        expect(page.locator("#training-status")).to_have_text(
            re.compile(r"^(no training metrics reported · [\d,]+ resource samples?|no points yet)$")
        )
        keep_screenshot(page, "job-failed-banner")


def test_edit_and_run_again_with_one_argument_changed_succeeds(
    browser: Browser, stack: RunningStack, dana: StackClient, failed: dict[str, Any]
) -> None:
    with user_page(browser, stack, USER, PASSWORD) as page:
        page.goto(f"{stack.url}/jobs/{failed['id']}/")
        page.click("#banner-edit-again")
        page.wait_for_url(f"{stack.url}/jobs/{failed['id']}/again/")
        expect(page.locator("#id_args")).to_have_value("--die-by SIGTERM")
        expect(page.locator("#id_name")).to_have_value("die-by-signal")
        expect(page.locator("#id_script")).to_have_value("die_by.py")
        keep_screenshot(page, "job-run-again-form")
        page.fill("#id_args", "--die-by none")
        page.click("#launch")
        page.wait_for_url(re.compile(r"/jobs/\d+/$"))
        again_id = int(page.url.rstrip("/").rsplit("/", 1)[1])
        assert again_id != failed["id"]
        expect(page.locator("#job-state")).to_have_text("succeeded")
        expect(page.locator("#failure-banner")).to_have_count(0)
    again = dana.job(again_id)
    assert again["program"]["args"] == ["--die-by", "none"]
    assert again["roles"] == failed["roles"]


def test_the_list_filtered_to_a_users_failed_jobs_finds_one_by_name(
    browser: Browser, stack: RunningStack, failed: dict[str, Any]
) -> None:
    with admin_page(browser, stack) as page:
        page.goto(f"{stack.url}/")
        page.select_option("#filter-state", "failed")
        page.fill("#filter-user", USER)
        page.fill("#filter-name", "by-signal")
        page.click("#filter-apply")
        page.wait_for_url(re.compile(r"state=failed.*user=dana.*name=by-signal"))
        rows = page.locator("table.jobs tbody tr")
        expect(rows).to_have_count(1)
        expect(rows.first).to_have_attribute("data-job", str(failed["id"]))
        expect(rows.first).to_contain_text("killed by signal SIGTERM")
        keep_screenshot(page, "job-list-filtered")
        # The filter is in the URL: reloading (or sharing it) shows the same list.
        page.reload()
        expect(page.locator("#filter-state")).to_have_value("failed")
        expect(rows).to_have_count(1)
        rows.first.get_by_role("link", name="die-by-signal").click()
        page.wait_for_url(f"{stack.url}/jobs/{failed['id']}/")
