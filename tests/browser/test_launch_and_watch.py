"""A person's path: fill the New job form, press Launch, watch lines arrive live."""

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.browser.conftest import user_page
from tests.conftest import RunningStack

pytestmark = [pytest.mark.browser, pytest.mark.integration]


@pytest.fixture
def lena_page(browser: Browser, stack: RunningStack) -> Iterator[Page]:
    """A user of her own with a 32-core quota and no job yet: what the form says she has left
    depends on no other test's jobs."""
    stack.create_user(
        "lena", "lena-password-1", quota={"cpu": 32, "gpus": 0, "memory_gb": 128, "running_jobs": 4}
    )
    with user_page(browser, stack, "lena", "lena-password-1") as page:
        yield page


def test_launch_from_the_form_and_see_worker_lines_live(
    lena_page: Page, stack: RunningStack, tmp_path_factory: pytest.TempPathFactory
) -> None:
    page = lena_page
    page.click("text=New job")
    page.fill("#id_name", "digits from the browser")
    # Named, not left to the default (the first PyTorch image by name): tests beside
    # this one add images to the shared stack.
    page.select_option("#id_image", "pytorch:2.13-cpu")
    page.select_option("#id_script", "digits-ddp")
    page.fill("#id_args", "--epochs 8")
    page.select_option("#id_package", "cpu-1")
    page.fill("#id_instances", "3")
    # The totals follow the quota formula as the form is filled.
    totals = page.locator("#totals")
    expect(totals.locator("tr[data-resource=cpu] .need")).to_have_text("3")
    expect(totals.locator("tr[data-resource=cpu] .left")).to_have_text("32")
    expect(page.locator("#formula")).to_contain_text("CPU_total = master 1×1 + worker 1×2 = 3")

    pressed = time.monotonic()
    page.click("#launch")
    page.wait_for_url(re.compile(r"/jobs/\d+/$"))
    log = page.locator("#log")
    expect(log.locator(".line[data-tag=master]").first).to_be_visible()
    first_master = time.monotonic() - pressed
    expect(log.locator(".line[data-tag=worker-1]").first).to_be_visible()
    expect(log.locator(".line[data-tag=worker-1] .tag").first).to_have_text("[worker-1] ")
    print(f"\nLaunch pressed -> first [master] line in the browser: {first_master:.2f} s")

    # Filter to one instance: only its lines stay visible.
    page.click("#log-tabs >> text=[worker-2]")
    expect(log.locator(".line[data-tag=master]").first).to_be_hidden()
    expect(log.locator(".line[data-tag=worker-2]").first).to_be_visible()
    page.click("#log-tabs >> text=All")

    expect(page.locator("#job-state")).to_have_text("succeeded")
    expect(page.locator("#log-status")).to_contain_text("log complete")
    count = log.locator(".line").count()
    shots = tmp_path_factory.mktemp("screenshots")
    page.screenshot(path=str(Path(shots) / "job.png"), full_page=True)

    page.reload()  # lines stay after a reload: replayed from the start
    expect(page.locator("#log-status")).to_contain_text("log complete")
    # The status may say so a moment before the replayed lines are drawn: wait for them all.
    expect(log.locator(".line")).to_have_count(count)
    expect(page.locator("#replicas tbody tr")).to_have_count(3)


def test_html_from_a_trainer_is_shown_as_text(page: Page, stack: RunningStack) -> None:
    page.goto(f"{stack.url}/jobs/new/")
    page.fill("#id_name", "markup")
    page.select_option("#id_image", "pytorch:2.13-cpu")
    page.select_option("#id_script", "__path__")
    page.fill("#id_script_path", "markup.py")
    page.fill("#id_instances", "1")
    page.click("#launch")
    log = page.locator("#log")
    expect(page.locator("#log-status")).to_contain_text("log complete")
    expect(log.locator(".line").first).to_contain_text("<b>not bold</b>")
    assert log.locator("b, script").count() == 0
    assert page.evaluate("window.pwned") is None


def test_over_quota_form_says_which_resource_and_creates_nothing(
    page: Page, stack: RunningStack
) -> None:
    before = len(stack.admin.http.get("/api/v1/jobs").json()["jobs"])
    page.goto(f"{stack.url}/jobs/new/")
    page.fill("#id_name", "too big")
    page.select_option("#id_image", "pytorch:2.13-cpu")
    page.select_option("#id_package", "cpu-2")
    page.fill("#id_instances", "17")  # 34 cores: over the quota of 32
    expect(page.locator("tr[data-resource=cpu]")).to_have_class(re.compile("over"))
    page.click("#launch")
    expect(page.locator("#form-errors")).to_contain_text(
        "Over quota on CPU cores: this job needs 34"
    )
    assert len(stack.admin.http.get("/api/v1/jobs").json()["jobs"]) == before
