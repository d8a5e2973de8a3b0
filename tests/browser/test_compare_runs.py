"""Comparing runs from the browser: three finished digits runs that differ only in their
learning rate, picked from a job page's "Compare with…" and the job list, show three curves
on one chart and the differing argument row highlighted while an equal row is not."""

import re
from typing import Any

import pytest
from playwright.sync_api import Browser, expect

from tests.browser.conftest import keep_screenshot, user_page, wait_in_page
from tests.conftest import RunningStack, StackClient, pytorch_request

pytestmark = [pytest.mark.browser, pytest.mark.integration]

USER, PASSWORD = "erin", "erin-password-1"
QUOTA = {"cpu": 8, "gpus": 0, "memory_gb": 32, "running_jobs": 3}
RATES = ["0.02", "0.05", "0.1"]


@pytest.fixture(scope="module")
def erin(stack: RunningStack) -> StackClient:
    return stack.create_user(USER, PASSWORD, quota=QUOTA)


@pytest.fixture(scope="module")
def three_runs(erin: StackClient) -> list[dict[str, Any]]:
    """digits-ddp, one instance, two epochs, at three learning rates."""
    submitted = [
        erin.submit(
            pytorch_request(f"digits lr {lr}", "digits-ddp", 1, args=["--epochs", "2", "--lr", lr])
        )
        for lr in RATES
    ]
    finished = [erin.wait_finished(job["id"]) for job in submitted]
    assert [job["state"] for job in finished] == ["succeeded"] * 3, finished
    return finished


def test_three_runs_picked_from_the_list_show_three_curves_and_their_difference(
    browser: Browser, stack: RunningStack, three_runs: list[dict[str, Any]]
) -> None:
    first, second, third = (job["id"] for job in three_runs)
    with user_page(browser, stack, USER, PASSWORD) as page:
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        # From the first job's page: the list opens with that job ticked.
        page.goto(f"{stack.url}/jobs/{first}/")
        page.click("#compare-with")
        page.wait_for_url(f"{stack.url}/?compare={first}")
        expect(page.locator(f"input.compare-pick[value='{first}']")).to_be_checked()
        button = page.locator("#compare-button")
        expect(button).to_be_disabled()  # one pick is not a comparison
        page.check(f"input.compare-pick[value='{second}']")
        expect(button).to_be_enabled()
        page.check(f"input.compare-pick[value='{third}']")
        expect(button).to_have_text("Compare 3")
        button.click()
        page.wait_for_url(re.compile(rf"/compare/\?jobs={first}(,|%2C){second}(,|%2C){third}$"))

        # One loss chart, three curves: one series and one legend entry per job.
        loss = page.locator("#compare-chart-loss")
        expect(loss).to_have_attribute("data-series", "3")
        wait_in_page(
            page,
            "the comparison loaded",
            "() => document.getElementById('compare').dataset.loaded === 'true'",
        )
        expect(loss.locator(".u-legend .u-series:not(:first-child) .u-label")).to_have_text(
            [f"#{job['id']} {job['name']}" for job in three_runs]
        )
        expect(loss.locator("canvas")).to_be_visible()

        # The learning rate is the one argument that differs; the image is the same.
        args = page.locator("#compare-config tr[data-key='program.args']")
        expect(args).to_have_class("differs")
        expect(args.locator("td")).to_have_text([f"--epochs 2 --lr {lr}" for lr in RATES])
        expect(page.locator("#compare-config tr[data-key='image']")).to_have_class("same")
        expect(page.locator("#compare-figures")).to_contain_text("Loss, final")
        keep_screenshot(page, "compare-runs")

        page.check("#only-differences")
        expect(page.locator("#compare-config tr[data-key='image']")).to_be_hidden()
        expect(args).to_be_visible()
        assert errors == []
