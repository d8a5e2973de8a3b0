"""When a job started and ended and how long it ran, in the reader's own time zone, on its page
and in the job list; a running job's duration ticks; and no page uses the design documents'
words. The pages looked at are kept for the user guide (keep_screenshot)."""

import re
from collections.abc import Iterator
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from playwright.sync_api import Browser, Page, expect

from jobs.money import format_price
from jobs.services.views.durations import format_duration
from tests.browser.conftest import keep_screenshot, user_page, wait_in_page
from tests.conftest import RunningStack, StackClient, pytorch_request, signal_file
from trainyard_cli import render

pytestmark = [pytest.mark.browser, pytest.mark.integration]

# Far from UTC, so that a time left in UTC cannot pass for local.
ZONE = "Asia/Shanghai"
PASSWORD = "hana-password-1"


@pytest.fixture(scope="module")
def hana(stack: RunningStack) -> StackClient:
    """A user of her own: what her list shows depends on no other test's jobs."""
    return stack.create_user(
        "hana", PASSWORD, quota={"cpu": 8, "gpus": 0, "memory_gb": 32, "running_jobs": 4}
    )


@pytest.fixture
def hana_page(browser: Browser, stack: RunningStack, hana: StackClient) -> Iterator[Page]:
    with user_page(browser, stack, "hana", PASSWORD) as page:
        # The reader's clock is in Shanghai, whatever this machine's zone.
        session = page.context.new_cdp_session(page)
        session.send("Emulation.setTimezoneOverride", {"timezoneId": ZONE})
        yield page


def local(iso: str) -> str:
    return datetime.fromisoformat(iso).astimezone(ZoneInfo(ZONE)).strftime("%Y-%m-%d %H:%M:%S")


def seconds_between(job: dict[str, str]) -> float:
    started = datetime.fromisoformat(job["started"])
    return (datetime.fromisoformat(job["finished"]) - started).total_seconds()


def plain_words(page: Page) -> str:
    """What the reader sees, less the examples' own --seed option."""
    return page.locator("body").inner_text().replace("--seed", "--(option)")


def test_a_running_jobs_duration_ticks_and_settles_when_it_ends(
    hana_page: Page, stack: RunningStack, hana: StackClient, tmp_path: Path
) -> None:
    page = hana_page
    stop = signal_file("stop")
    job = hana.submit(
        pytorch_request("ticks", "ticker.py", 1, args=["--stop", str(stop), "--every", "1"])
    )
    try:
        page.goto(f"{stack.url}/jobs/{job['id']}/")
        expect(page.locator("#job-state")).to_have_text("running")
        duration = page.locator("#job-duration")
        expect(duration).to_contain_text("running for")
        expect(page.locator("#job-finished")).to_have_text("—")
        first = float(duration.get_attribute("data-seconds") or "nan")
        seconds = "Number(document.getElementById('job-duration').dataset.seconds)"
        wait_in_page(page, "the duration to tick", f"() => {seconds} >= {first + 2}")
    finally:
        stop.touch()
    ended = hana.wait_finished(job["id"])
    # Ended live, over the page's websocket: no reload.
    expect(page.locator("#job-state")).to_have_text("succeeded")
    expect(page.locator("#job-finished")).to_have_text(local(ended["finished"]))
    expect(duration).to_have_text(format_duration(seconds_between(ended)))
    expect(duration).not_to_have_class(re.compile("running"))


def test_the_job_page_and_list_show_start_end_and_duration(
    hana_page: Page, stack: RunningStack, hana: StackClient
) -> None:
    page = hana_page
    submitted = hana.submit(
        pytorch_request("digits, times", "digits-ddp", 2, args=["--epochs", "3"])
    )
    job = hana.wait_finished(submitted["id"])
    assert job["state"] == "succeeded", job
    took = seconds_between(job)

    page.goto(f"{stack.url}/jobs/{job['id']}/")
    expect(page.locator("#job-state")).to_have_text("succeeded")
    expect(page.locator("#job-started")).to_have_text(local(job["started"]))
    expect(page.locator("#job-finished")).to_have_text(local(job["finished"]))
    expect(page.locator("#job-started")).to_have_attribute("title", re.compile(ZONE))
    duration = page.locator("#job-duration")
    expect(duration).to_have_text(format_duration(took))
    assert abs(float(duration.get_attribute("data-seconds") or "nan") - took) < 0.001
    expect(page.locator("#training-status")).to_contain_text("points")
    expect(page.locator("#fig-cost .figure-value")).to_have_text(re.compile(r"^(< )?\$\d"))
    # A chart's time reads as every other time on the page (uPlot's own would be ":47.000"):
    # samples/sec by wall time, as the bar over the charts can set it (it is by epoch first).
    page.select_option("#chart-x", "wall")
    expect(page.locator("#chart-samples-per-sec")).to_have_attribute("data-axis", "wall")
    page.locator("#chart-samples-per-sec .u-over").hover()
    when = page.locator("#chart-samples-per-sec .u-legend .u-series").first.locator(".u-value")
    expect(when).to_have_text(re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d$"))
    # "node-1" stays one word however narrow the Instances table's column.
    expect(page.locator("#replicas td.node-name").first).to_have_css("white-space", "nowrap")
    assert "seed" not in plain_words(page).lower()
    keep_screenshot(page, "job-finished")

    page.goto(f"{stack.url}/")
    expect(page.locator("table.jobs thead")).to_contain_text("Duration")
    row = page.locator(f"tr[data-job='{job['id']}']")
    expect(row.locator(".duration")).to_have_text(format_duration(took))
    expect(row.locator("time")).to_have_text(re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d$"))
    expect(row.locator("td.instances")).to_have_text(job["instances"]["text"])  # as `ls` says
    assert "seed" not in plain_words(page).lower()
    keep_screenshot(page, "job-list")

    page.goto(f"{stack.url}/jobs/new/")
    expect(page.locator("[data-program='digits-ddp']")).to_be_visible()
    expect(page.locator("[data-program='digits-ddp']")).to_contain_text("--epochs N")
    # The catalog's cpu-1 at $0.05 an hour, two instances (the first package in the menu is
    # the smallest, which other tests on this shared stack may add).
    page.select_option("#id_package", "cpu-1")
    page.fill("#id_instances", "2")
    expect(page.locator("#price")).to_have_text("$0.10")
    assert "seed" not in plain_words(page).lower()
    keep_screenshot(page, "new-job")


def test_the_pages_formatter_writes_what_the_servers_and_the_clis_write(
    hana_page: Page, stack: RunningStack
) -> None:
    """static/trainyard/format.js, jobs/ and trainyard_cli/render.py are three copies of one
    voice (the browser, the server and a laptop without Django each need their own): the same
    figures come out the same from each."""
    page = hana_page
    page.goto(f"{stack.url}/")
    seconds = [0, 9.9, 65, 3599, 7500]
    prices = ["0.0500", "0.0125", "3.0000", "1234.5000"]
    written = page.evaluate(
        """async ([seconds, prices]) => {
            const f = await import("/static/trainyard/format.js");
            return {
              durations: seconds.map(f.formatDuration),
              prices: prices.map((p) => f.formatPrice(Number(p))),
              time: f.formatLocalTime(new Date(Date.UTC(2025, 2, 7, 6, 5, 9))),
              clock: f.formatClockTime(new Date(Date.UTC(2025, 2, 7, 6, 5, 9))),
              ticks: f.formatTimeTicks([1741327509, 1741327509.2, 1741327509.4]),
              wide: f.formatTimeTicks([1741327500, 1741327510]),
            };
        }""",
        [seconds, prices],
    )
    assert written["durations"] == [format_duration(s) for s in seconds]
    assert written["durations"] == [render.duration(s) for s in seconds]
    assert written["prices"] == [format_price(Decimal(p)) for p in prices]
    assert written["prices"] == [render.money(p, "$") for p in prices]
    assert written["time"] == local("2025-03-07T06:05:09+00:00") == "2025-03-07 14:05:09"
    assert written["clock"] == "14:05:09"
    # A chart's axis over less than a second tells its ticks apart; over more, whole seconds.
    assert written["ticks"] == ["14:05:09.0", "14:05:09.2", "14:05:09.4"]
    assert written["wide"] == ["14:05:00", "14:05:10"]
