"""What a person sees when a health rule restarts their job: the rule that fired, the attempts,
and the log of both attempts, live on the job page."""

import re

import pytest
from playwright.sync_api import Browser, expect

from tests.browser.conftest import admin_page
from tests.conftest import RunningStack, pytorch_request

pytestmark = [pytest.mark.browser, pytest.mark.integration]


def test_a_hang_shows_the_rule_that_fired_and_each_attempt(
    browser: Browser, fault_stack: RunningStack
) -> None:
    job = fault_stack.admin.submit(
        {
            **pytorch_request("hangs on screen", "hang_once.py", 1),
            "restart": {"policy": "on-failure", "max_restarts": 1, "backoff_seconds": 1},
            "health_rules": [
                {"kind": "no-progress", "factor": 10, "min_seconds": 3, "action": "restart"}
            ],
        }
    )
    with admin_page(browser, fault_stack) as page:
        page.goto(f"{fault_stack.url}/jobs/{job['id']}/")
        expect(page.locator("#restart-summary")).to_contain_text("up to 1 time")
        expect(page.locator("#log .line").first).to_be_visible()
        # Live: the rule fires, the job restarts and succeeds, without a reload.
        expect(page.locator("#job-state")).to_have_text("succeeded", timeout=120_000)
        rule = page.locator("#health-events tbody tr")
        expect(rule).to_have_count(1)
        expect(rule).to_contain_text("[master]")
        expect(rule).to_contain_text("restart")
        expect(rule).to_contain_text("restarting the job (restart 1 of 1)")
        attempts = page.locator("#attempts tbody tr")
        expect(attempts).to_have_count(2)
        expect(attempts.nth(0)).to_contain_text("health rule: no new step on master")
        # Its times as every other time on the page (the runs table wrote "12:23:38 PM"), its
        # nodes each whole.
        started = attempts.nth(0).locator("td").nth(1)
        expect(started).to_have_text(re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d$"))
        node = attempts.nth(0).locator(".node-name").first
        expect(node).to_have_css("white-space", "nowrap")
        expect(page.locator("#log")).to_contain_text("finished on attempt 1")
        expect(page.locator("#log")).to_contain_text("attempt 2")
        page.screenshot(path=str(fault_stack.stack.var_dir / "restarts-page.png"), full_page=True)
