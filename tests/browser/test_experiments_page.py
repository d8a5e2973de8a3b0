"""An experiment from the browser, on the real stack: the New job form's Search… turns a
digits-ddp job into a small search (4 trials, 2 at a time, 2 epochs, stopped early below the
median once one trial has completed); its page shows the trials, their curves and parameters
while it runs, can be paused and resumed, and after it ends names the best trial, whose "Run
again with these parameters" submits that job once more. Screenshots:
var/screenshots/experiment-*.png."""

import re

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.browser.conftest import keep_screenshot, user_page, wait_in_page
from tests.conftest import RunningStack, wait_until

pytestmark = [pytest.mark.browser, pytest.mark.integration]

USER, PASSWORD = "quinn-search", "quinn-password-1"
# Two one-core trials at a time, and the Run again after.
QUOTA = {"cpu": 4, "gpus": 0, "memory_gb": 32, "running_jobs": 3}
TRIALS = 4
ENDED = ["completed", "pruned", "failed"]
# A hang guard, not a measurement: four trials, two at a time, on a loaded two-core machine.
SEARCH_HANG_GUARD = 900


def search_row(page: Page, row: int, key: str, kind: str, low: str, high: str) -> None:
    if row > 0:
        page.click("#search-add-row")
    page.locator("input[name=search-space-key]").nth(row).fill(key)
    page.locator("select[name=search-space-type]").nth(row).select_option(kind)
    page.locator("input[name=search-space-low]").nth(row).fill(low)
    page.locator("input[name=search-space-high]").nth(row).fill(high)
    page.locator("select[name=search-space-scale]").nth(row).select_option("log")


def start_search(page: Page, url: str) -> None:
    """The New job form's job (digits-ddp, one instance, 2 epochs) as a 4-trial search."""
    page.goto(f"{url}/jobs/new/")
    page.fill("#id_name", "digits")
    # Named, not left to the default (the first PyTorch image by name): tests beside
    # this one add images to the shared stack.
    page.select_option("#id_image", "pytorch:2.13-cpu")
    page.select_option("#id_script", "digits-ddp")
    page.fill("#id_args", "--epochs 2 --lr 0.05")
    page.fill("#id_instances", "1")
    page.click("#search-open")
    # The job's own arguments are offered as what to search.
    expect(page.locator("#search-keys option")).to_have_count(2)
    search_row(page, 0, "--lr", "float", "0.01", "1")
    search_row(page, 1, "--batch-size", "int", "16", "64")
    page.fill("#id_search-name", "digits lr and batch")
    page.fill("#id_search-metric", "eval_accuracy")
    page.select_option("#id_search-searcher", "random")
    page.select_option("#id_search-pruner", "median")
    # Only the median pruner's own setting is offered: judge once one trial has completed.
    expect(page.locator("#field-search-min_resource")).to_be_hidden()
    page.fill("#id_search-startup_trials", "1")
    page.fill("#id_search-trials", str(TRIALS))
    page.fill("#id_search-parallel", "2")
    page.fill("#id_search-seed", "7")
    keep_screenshot(page, "experiment-search-form")
    page.click("#search-start")
    page.wait_for_url(re.compile(rf"{re.escape(url)}/experiments/\d+/$"))


def test_a_search_from_the_form_runs_ends_and_its_best_trial_runs_again(
    browser: Browser, stack: RunningStack
) -> None:
    stack.create_user(USER, PASSWORD, quota=QUOTA)
    with user_page(browser, stack, USER, PASSWORD) as page:
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        start_search(page, stack.url)
        expect(page.locator("h1")).to_contain_text("digits lr and batch")
        expect(page.locator("#experiment-space")).to_contain_text("--lr 0.01 to 1.0 (log)")

        # While it runs: the first trials' curves draw, one line per trial across the axes.
        wait_in_page(
            page,
            "a trial's first epoch drawn",
            "() => Number(document.getElementById('objective-chart').dataset.points) > 0",
        )
        expect(page.locator("#experiment-state")).to_have_text("running")
        expect(page.locator("#budget tr[data-budget=trials] td").first).not_to_have_text("0")
        expect(page.locator("#trials tbody tr[data-trial]").first).to_be_visible()
        expect(page.locator("#trials tbody tr.trial-running").first).to_be_visible()
        expect(page.locator("#parcoords-plot svg g.pc-trial").first).to_be_attached()
        keep_screenshot(page, "experiment-running")

        # Pause and Resume: POST forms, each answered on the page.
        page.click("#experiment-pause")
        expect(page.locator("#experiment-state")).to_have_text("paused")
        expect(page.locator("#experiment-pause")).to_be_hidden()
        page.click("#experiment-resume")
        expect(page.locator("#experiment-state")).to_have_text("running")

        # After it ends: every trial ended, the best named with its parameters.
        wait_until(
            "the experiment ended and the page read its last points",
            lambda: page.evaluate(
                "() => document.getElementById('experiment').dataset.settled === 'true'"
            ),
            guard=SEARCH_HANG_GUARD,
        )
        # As it reads when opened afresh, from what the server has (not the last refresh).
        page.reload()
        wait_in_page(
            page,
            "the ended experiment drawn",
            "() => document.getElementById('experiment').dataset.settled === 'true'",
        )
        expect(page.locator("#experiment-state")).to_have_text("finished")
        rows = page.locator("#trials tbody tr[data-trial]")
        expect(rows).to_have_count(TRIALS)
        for i in range(TRIALS):
            assert rows.nth(i).locator(".state").inner_text() in ENDED
        expect(page.locator("#experiment-pause")).to_be_hidden()
        expect(page.locator("#experiment-stop")).to_be_hidden()
        expect(page.locator("#best-params")).to_contain_text("--lr ")
        expect(page.locator("#parcoords-plot svg g.pc-trial")).to_have_count(TRIALS)
        assert int(page.locator("#objective-chart").get_attribute("data-series") or 0) >= 2
        compare = page.locator("#best-compare")
        expect(compare).to_have_attribute("href", re.compile(r"^/compare/\?jobs=\d+(,\d+)+$"))
        keep_screenshot(page, "experiment-ended")

        # The list says the same in a line.
        page.click("nav a[href='/experiments/']")
        listed = page.locator("#experiments tbody tr")
        expect(listed).to_have_count(1)
        expect(listed.locator(".state")).to_have_text("finished")
        expect(listed).to_contain_text(f"{TRIALS} of {TRIALS}")
        listed.locator("a").first.click()
        page.wait_for_url(re.compile(r"/experiments/\d+/$"))

        # Run again submits the best trial's job once more; that job's page names its trial.
        best_job = re.search(r"job #(\d+)", page.locator("#best-trial").inner_text())
        assert best_job is not None
        best_args = page.locator("#trials tr.best td.param").all_inner_texts()
        page.click("#best-run-again")
        page.wait_for_url(re.compile(r"/jobs/\d+/$"))
        again = int(page.url.rstrip("/").rsplit("/", 1)[1])
        assert again != int(best_job.group(1))
        program = page.locator(".summary div").filter(has_text="Program")
        expect(program).to_contain_text("--epochs 2")
        expect(program).to_contain_text(f"--batch-size {best_args[1]}")
        expect(page.locator("#job-trial")).to_have_count(0)  # a job of its own, no trial
        keep_screenshot(page, "experiment-run-again")

        page.goto(f"{stack.url}/jobs/{best_job.group(1)}/")
        expect(page.locator("#job-trial")).to_contain_text("of experiment digits lr and batch")
        assert errors == []
