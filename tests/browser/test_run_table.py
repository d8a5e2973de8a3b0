"""The job list as a run table, in the browser (issue 49 items 1 and 2): three finished digits
runs at different learning rates and batch sizes; the user chooses two config columns and the
best eval_accuracy, sorts by it, finds the view kept when the list is opened again and
restores a named view in one click; tags a run and writes a note on its page (HTML in it stays
text), and finds it by the tag; files two runs under a project and sees the list group them."""

import re
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.browser.conftest import keep_screenshot, user_page
from tests.conftest import RunningStack, StackClient, pytorch_request, wait_until

pytestmark = [pytest.mark.browser, pytest.mark.integration]

USER, PASSWORD = "rita-run-table", "rita-password-1"
QUOTA = {"cpu": 8, "gpus": 0, "memory_gb": 32, "running_jobs": 3}
# (learning rate, batch size, project): a sweep of two runs filed under a project, and one not.
RUNS = [("0.02", "64", "digits-sweep"), ("0.1", "16", "digits-sweep"), ("0.05", "32", "")]
BEST = "metric:eval_accuracy:best"


@pytest.fixture(scope="module")
def rita(stack: RunningStack) -> StackClient:
    return stack.create_user(USER, PASSWORD, quota=QUOTA)


@pytest.fixture(scope="module")
def runs(rita: StackClient) -> list[dict[str, Any]]:
    """The three runs, finished, with their eval_accuracy summarised by the log keeper."""
    submitted = []
    for lr, batch, project in RUNS:
        request = pytorch_request(
            f"digits lr {lr}",
            "digits-ddp",
            1,
            args=["--epochs", "2", "--lr", lr, "--batch-size", batch],
        )
        submitted.append(rita.submit({**request, "project": project}))
    finished = [rita.wait_finished(job["id"]) for job in submitted]
    assert [job["state"] for job in finished] == ["succeeded"] * 3, finished
    return [summarised(rita, job["id"]) for job in finished]


def summarised(client: StackClient, job_id: int) -> dict[str, Any]:
    """The job once the log keeper has summarised its eval_accuracy."""

    def ready() -> dict[str, Any] | None:
        job = client.job(job_id)
        return job if job["metric_summary"].get("eval_accuracy") else None

    found: dict[str, Any] = wait_until(f"job {job_id}'s eval_accuracy summary", ready)
    return found


def rows(page: Page) -> list[str]:
    """The ids of the table's rows, top to bottom."""
    return page.locator("#run-table tbody tr[data-job]").evaluate_all(
        "rows => rows.map(r => r.dataset.job)"
    )


def test_the_table_sorts_by_best_accuracy_with_chosen_config_columns_and_keeps_the_view(
    browser: Browser, stack: RunningStack, runs: list[dict[str, Any]]
) -> None:
    by_best = sorted(runs, key=lambda j: -j["metric_summary"]["eval_accuracy"]["best"])
    with user_page(browser, stack, USER, PASSWORD) as page:
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.click("#column-chooser summary")
        for word in ("config:lr", "config:batch-size", BEST):
            page.check(f"#column-chooser input[value='{word}']")
        keep_screenshot(page, "run-table-column-chooser")
        page.click("#filter-apply")
        header = page.locator(f"#run-table th[data-column='{BEST}'] a")
        expect(header).to_have_text("eval_accuracy (best)")
        header.click()
        expect(page.locator(f"#run-table th[data-column='{BEST}']")).to_have_attribute(
            "aria-sort", "descending"
        )
        assert rows(page) == [str(j["id"]) for j in by_best]
        expect(page.locator("#filter-sort")).to_contain_text("eval_accuracy (best), high to low")
        first = page.locator("#run-table tbody tr[data-job]").first
        top = by_best[0]
        lr, batch = top["config"]["lr"], top["config"]["batch-size"]
        best = f"{top['metric_summary']['eval_accuracy']['best']:.4g}"
        # The columns come in the chooser's order: config keys A to Z, then metrics.
        expect(first.locator("td.column-cell")).to_have_text([str(batch), str(lr), best])
        keep_screenshot(page, "run-table-sorted-by-best-accuracy")

        # Opened again with nothing asked: the same columns, in the same order.
        page.goto(f"{stack.url}/")
        expect(page.locator("#run-table th.column")).to_have_count(3)
        assert rows(page) == [str(j["id"]) for j in by_best]

        # Kept under a name, then restored in one click from a bare list.
        page.fill("#view-name", "best accuracy")
        page.click("#view-save-button")
        expect(page.locator(".run-view-link")).to_have_text(["best accuracy"])
        page.goto(f"{stack.url}/?columns=")
        expect(page.locator("#run-table th.column")).to_have_count(0)
        page.click(".run-view-link")
        expect(page.locator("#run-table th.column")).to_have_count(3)
        assert rows(page) == [str(j["id"]) for j in by_best]
        assert errors == []


def test_tags_and_a_note_are_added_on_the_job_page_and_filtered_on(
    browser: Browser, stack: RunningStack, runs: list[dict[str, Any]]
) -> None:
    tagged = runs[2]
    with user_page(browser, stack, USER, PASSWORD) as page:
        page.goto(f"{stack.url}/jobs/{tagged['id']}/")
        page.fill("#tag-input", "baseline lr-0.05")
        page.click("#tag-add")
        expect(page.locator("#run-tags .tag-chip")).to_have_count(2)
        page.click("#note-edit")
        page.fill("#note-input", "Default rate. <b>not bold</b>\nSecond line.")
        page.click("#note-save")
        note = page.locator("#note-text")
        expect(note).to_contain_text("Default rate. <b>not bold</b>")
        expect(note.locator("b")).to_have_count(0)  # the note is text, never HTML
        expect(note.locator("br")).to_have_count(1)
        # A tag that is no tag is refused, saying why, and nothing changes.
        page.fill("#tag-input", "+bad")
        page.click("#tag-add")
        expect(page.locator(".flash.error")).to_contain_text("A tag is letters")
        expect(page.locator("#run-tags .tag-chip")).to_have_count(2)
        keep_screenshot(page, "run-table-job-page-tags-and-note")

        page.click("#run-tags .tag-chip[data-tag='baseline'] a")
        page.wait_for_url(re.compile(r"\?tag=baseline$"))
        assert rows(page) == [str(tagged["id"])]
        expect(page.locator("#filter-tag")).to_have_value("baseline")
        keep_screenshot(page, "run-table-filtered-by-tag")

        # Taken off again from the page: the filter then finds nothing.
        page.goto(f"{stack.url}/jobs/{tagged['id']}/")
        page.click("#run-tags .tag-chip[data-tag='baseline'] .tag-remove")
        expect(page.locator("#run-tags .tag-chip")).to_have_count(1)
        page.goto(f"{stack.url}/?tag=baseline")
        expect(page.locator("#no-match")).to_be_visible()


def test_a_project_groups_its_runs(
    browser: Browser, stack: RunningStack, runs: list[dict[str, Any]]
) -> None:
    sweep = {str(j["id"]) for j in runs if j["project"] == "digits-sweep"}
    assert len(sweep) == 2
    with user_page(browser, stack, USER, PASSWORD) as page:
        page.goto(f"{stack.url}/?columns=project,config:lr&sort=project")
        groups = page.locator("#run-table tr.group-row")
        expect(groups).to_have_text(["Project digits-sweep", "No project"])
        ids = rows(page)
        assert set(ids[:2]) == sweep and ids[2] not in sweep
        chip = page.locator("#projects .project-chip", has_text="digits-sweep")
        expect(chip).to_contain_text("2")
        keep_screenshot(page, "run-table-grouped-by-project")
        chip.click()
        expect(page.locator("#filter-project")).to_have_value("digits-sweep")
        assert set(rows(page)) == sweep
