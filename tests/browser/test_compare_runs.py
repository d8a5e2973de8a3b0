"""Comparing runs from the browser: three finished digits runs that differ only in their
learning rate, picked from a job page's "Compare with…" and the job list, show three curves
on one chart and the differing argument row highlighted while an equal row is not; eight runs
draw eight curves in eight colours, smoothed and on a log scale when asked."""

import re
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.browser.conftest import keep_screenshot, user_page, wait_in_page
from tests.conftest import RunningStack, StackClient, pytorch_request

pytestmark = [pytest.mark.browser, pytest.mark.integration]

USER, PASSWORD = "erin", "erin-password-1"
QUOTA = {"cpu": 8, "gpus": 0, "memory_gb": 32, "running_jobs": 3}
RATES = ["0.02", "0.05", "0.1"]
# Eight runs submitted at once: a quota they all fit in (they still wait for room on the nodes).
EIGHT_USER = "ottilie-eight-runs"
EIGHT_QUOTA = {"cpu": 8, "gpus": 0, "memory_gb": 128, "running_jobs": 8}
EIGHT_RATES = ["0.01", "0.02", "0.03", "0.05", "0.07", "0.1", "0.15", "0.2"]
LOSS_SERIES = "#compare-chart-loss .u-legend .u-series:not(:first-child)"


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


@pytest.fixture(scope="module")
def ottilie(stack: RunningStack) -> StackClient:
    return stack.create_user(EIGHT_USER, PASSWORD, quota=EIGHT_QUOTA)


@pytest.fixture(scope="module")
def eight_runs(ottilie: StackClient) -> list[dict[str, Any]]:
    """loss_curve.py at eight rates: eight falling losses, each a little noisy."""
    submitted = [
        ottilie.submit(
            pytorch_request(
                f"curve {rate}", "loss_curve.py", 1, args=["--rate", rate, "--seed", str(seed)]
            )
        )
        for seed, rate in enumerate(EIGHT_RATES)
    ]
    finished = [ottilie.wait_finished(job["id"]) for job in submitted]
    assert [job["state"] for job in finished] == ["succeeded"] * 8, finished
    return finished


def test_eight_runs_compared_in_eight_colours_smoothed_and_on_a_log_scale(
    browser: Browser, stack: RunningStack, ottilie: StackClient, eight_runs: list[dict[str, Any]]
) -> None:
    ids = ",".join(str(job["id"]) for job in eight_runs)
    with user_page(browser, stack, EIGHT_USER, PASSWORD) as page:
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(f"{stack.url}/compare/?jobs={ids}")
        wait_in_page(
            page,
            "the comparison loaded",
            "() => document.getElementById('compare').dataset.loaded === 'true'",
        )
        loss = page.locator("#compare-chart-loss")
        expect(loss).to_have_attribute("data-series", "8")
        expect(loss.locator(".u-legend .u-series:not(:first-child) .u-label")).to_have_text(
            [f"#{job['id']} {job['name']}" for job in eight_runs]
        )
        # Eight colours, none repeated: on the curves' legend markers and the jobs' swatches.
        markers = page.locator(f"{LOSS_SERIES} .u-marker").evaluate_all(
            "(els) => els.map((el) => getComputedStyle(el).borderColor)"
        )
        swatches = page.locator("#compare-legend .swatch").evaluate_all(
            "(els) => els.map((el) => getComputedStyle(el).backgroundColor)"
        )
        assert len(set(markers)) == 8 and len(set(swatches)) == 8, (markers, swatches)
        assert markers == swatches  # a job's swatch is its curve's colour

        # By epoch (the runs report ten steps to an epoch), raw: the last value drawn of each
        # run is its own last loss.
        expect(loss).to_have_attribute("data-axis", "epoch")
        raw = drawn(page, "#compare-chart-loss")
        last_losses = [last_loss(ottilie, job["id"]) for job in eight_runs]
        assert [last_defined(ys) for ys in raw[1:]] == pytest.approx(last_losses)

        # Smoothing: each curve is its moving average now; a falling loss's lags above it.
        page.locator("#chart-smoothing").fill("0.9")
        expect(page.locator("#chart-smoothing-value")).to_have_text("0.90")
        wait_in_page(
            page,
            "the loss curves smoothed",
            "(raw) => { const d = document.querySelector('#compare-chart-loss').chartData;"
            " return d[1].some((y, i) => y != null && y !== raw[1][i]); }",
            raw,
        )
        smoothed = drawn(page, "#compare-chart-loss")
        for run, (raw_ys, smooth_ys) in enumerate(zip(raw[1:], smoothed[1:], strict=True)):
            assert last_defined(smooth_ys) > last_defined(raw_ys), EIGHT_RATES[run]

        page.check("#chart-log")
        expect(loss).to_have_attribute("data-scale", "log")
        page.select_option("#chart-x", "step")
        expect(loss).to_have_attribute("data-axis", "step")
        shot = keep_screenshot(page, "compare-eight-runs")

        # Kept for the next visit.
        page.reload()
        expect(loss).to_have_attribute("data-scale", "log")
        expect(loss).to_have_attribute("data-axis", "step")
        expect(page.locator("#chart-smoothing")).to_have_value("0.9")
        expect(page.locator("#chart-log")).to_be_checked()
        # Time since start: each job from its own start, as on its page.
        page.select_option("#chart-x", "relative")
        expect(loss).to_have_attribute("data-axis", "relative")
        xs = drawn(page, "#compare-chart-loss")[0]
        assert all(x is not None and x >= 0 for x in xs), xs
        assert shot.exists() and errors == []


def drawn(page: Page, chart: str) -> list[list[float | None]]:
    """The values a chart draws: [xs, ...ys] (None where a series has no point)."""
    data: list[list[float | None]] = page.evaluate(
        "(sel) => document.querySelector(sel).chartData", chart
    )
    return data


def last_defined(ys: list[float | None]) -> float:
    return next(y for y in reversed(ys) if y is not None)


def last_loss(client: StackClient, job_id: int) -> float:
    points = client.http.get(f"/api/v1/jobs/{job_id}/metrics?name=loss").json()["points"]
    last: float = max(points, key=lambda p: p["step"])["value"]
    return last
