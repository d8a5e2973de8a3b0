"""The job page's training section: a 2-trainer run watched live shows its figures as its first
points arrive and its progress at 100 % when its log shows the last epoch; against its
1-trainer baseline it shows speedup, efficiency and the verdict, and its loss chart is really
drawn (pixels on the canvas)."""

import re
import shutil
from collections import defaultdict
from datetime import datetime
from pathlib import Path
from typing import Any, cast

import pytest
from playwright.sync_api import Page, expect

from tests.browser.conftest import keep_screenshot, wait_in_page
from tests.browser.training_page import summaries_shown
from tests.conftest import RunningStack, pytorch_request, signal_file, wait_until

pytestmark = [pytest.mark.browser, pytest.mark.integration]

EPOCHS = 8
DIGITS_ARGS = ["--epochs", str(EPOCHS)]
SCREENSHOT_FOR_REVIEW = Path("/tmp/training_page.png")
SMOOTHED_SCREENSHOT = Path("/tmp/training_charts_smoothed_log_zoomed.png")
NO_FIGURE = "\u2013"  # the en dash a card shows for a figure it cannot give yet

# Pixels drawn on a chart's canvas: every non-transparent one, and those in the run's own
# series colour (#2855d8) or the baseline's (#a3aab8), give or take anti-aliasing. Axes and
# grid lines alone would pass the first count, so the series colours are counted too.
CANVAS_PIXELS = """(selector) => {
  const canvas = document.querySelector(selector);
  if (!canvas || canvas.width === 0 || canvas.height === 0) return null;
  const data = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
  const near = (i, r, g, b) =>
    Math.abs(data[i] - r) + Math.abs(data[i + 1] - g) + Math.abs(data[i + 2] - b) < 60;
  let opaque = 0, run = 0, baseline = 0;
  for (let i = 0; i < data.length; i += 4) {
    if (data[i + 3] === 0) continue;
    opaque++;
    if (data[i + 3] > 200 && near(i, 0x28, 0x55, 0xd8)) run++;
    if (data[i + 3] > 200 && near(i, 0xa3, 0xaa, 0xb8)) baseline++;
  }
  return {opaque, run, baseline};
}"""

LOSS_CANVAS = "#chart-loss canvas"


def loss_chart_drawn(page: Page) -> dict[str, int]:
    wait_in_page(
        page,
        "the loss chart drawn with the run's and the baseline's series",
        f"""() => {{
          const count = ({CANVAS_PIXELS})({LOSS_CANVAS!r});
          return count !== null && count.opaque > 500 && count.run > 100 && count.baseline > 100;
        }}""",
    )
    counts: dict[str, int] = page.evaluate(CANVAS_PIXELS, LOSS_CANVAS)
    return counts


@pytest.fixture(scope="module")
def one_and_two_workers(stack: RunningStack) -> dict[str, Any]:
    """digits-ddp on 1 and then on 2 instances (one after the other, so they never share the
    cores), the 2-instance run compared with the 1-instance one. The 2-instance run is only
    submitted here: the first test watches it run; `finished` waits for its end."""
    admin = stack.admin
    one = admin.submit(pytorch_request("charts, 1 worker", "digits-ddp", 1, args=DIGITS_ARGS))
    assert admin.wait_finished(one["id"])["state"] == "succeeded"
    two = admin.submit(pytorch_request("charts, 2 workers", "digits-ddp", 2, args=DIGITS_ARGS))
    response = admin.http.post(f"/api/v1/jobs/{two['id']}/baseline", json={"baseline": one["id"]})
    assert response.status_code == 200, response.text

    def finished() -> dict[str, Any]:
        """The run's summary once it has succeeded."""
        assert admin.wait_finished(two["id"])["state"] == "succeeded"
        summary: dict[str, Any] = admin.http.get(f"/api/v1/jobs/{two['id']}/metrics/summary").json()
        assert summary["baseline"]["speedup"] is not None, summary["baseline"]
        return summary

    return {"one": one["id"], "two": two["id"], "finished": finished}


def test_it_shows_figures_as_they_arrive_and_100_percent_at_the_last_epoch(
    page: Page, stack: RunningStack, one_and_two_workers: dict[str, Any]
) -> None:
    """Watched from its submission: the figure cards appear as the first values arrive (no
    reload), and when the log shows the last epoch the bar reads 100 %, as the charts do."""
    two = one_and_two_workers["two"]
    page.goto(f"{stack.url}/jobs/{two}/")
    summaries_shown(page)
    page.evaluate("() => { window.sameDocument = true; }")  # gone if the page reloads

    expect(page.locator("#fig-global-sps")).to_be_visible()
    expect(page.locator("#fig-cost")).to_be_visible()
    last_epoch = page.locator("#log .line", has_text=f"epoch={EPOCHS}/{EPOCHS} loss=")
    expect(last_epoch).to_be_visible()
    expect(page.locator("#progress-text")).to_contain_text(f"100 % · epoch {EPOCHS} of {EPOCHS}")
    expect(page.locator("#training-progress .progress-track")).to_have_attribute(
        "aria-valuenow", "100"
    )
    expect(last_epoch).to_be_visible()  # both at once, on the same page
    expect(page.locator("#job-state")).to_have_text("succeeded")
    expect(page.locator("#progress-text")).to_have_text(
        f"100 % · epoch {EPOCHS} of {EPOCHS} · done"
    )
    assert page.evaluate("() => window.sameDocument === true"), "the page reloaded"
    one_and_two_workers["finished"]()


def test_it_charts_a_2_trainer_run_against_its_1_trainer_baseline(
    page: Page, stack: RunningStack, one_and_two_workers: dict[str, Any], tmp_path: Path
) -> None:
    one, two = one_and_two_workers["one"], one_and_two_workers["two"]
    summary = one_and_two_workers["finished"]()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(f"{stack.url}/jobs/{two}/")
    training = page.locator("#training")
    expect(training).to_be_visible()

    counts = loss_chart_drawn(page)
    assert counts["opaque"] > 500 and counts["run"] > 100 and counts["baseline"] > 100, counts

    # The figures against the 1-trainer baseline: numbers, not placeholders, with one × each.
    expect(page.locator("#fig-speedup .figure-value")).to_have_text(re.compile(r"^\d+\.\d\d$"))
    expect(page.locator("#fig-global-speedup .figure-label")).to_have_text("Global speedup")
    expect(page.locator("#fig-global-speedup .figure-value")).to_have_text(
        re.compile(r"^\d+\.\d\d×$")
    )
    expect(page.locator("#fig-efficiency .figure-label")).to_have_text("Scaling efficiency")
    expect(page.locator("#fig-efficiency .figure-value")).to_have_text(re.compile(r"^\d+ %$"))
    expect(page.locator("#fig-per-worker-sps .figure-label")).to_have_text("Per-trainer throughput")
    expect(page.locator("#fig-global-sps .figure-value")).to_have_text(re.compile(r"^[\d,]+$"))
    expect(page.locator("#fig-cost .figure-value")).to_have_text(re.compile(r"^(< )?\$\d+\.\d+$"))
    expect(page.locator("#fig-spd-ratio .figure-value")).to_have_text(re.compile(r"^\d+\.\d\d×$"))
    speedup = summary["baseline"]["speedup"]
    expect(page.locator("#fig-efficiency .figure-value")).to_have_text(
        f"{round(speedup['efficiency'] * 100)} %"
    )

    # The verdict the console gave (tested for its own sake in test_training_metrics), with its
    # reasons, and the baseline picked in the picker. A 1-trainer baseline draws other curves
    # by design: judged on its final accuracy, with a neutral note, never "curves differ".
    verdict = summary["baseline"]["verdict"]
    assert verdict["curves_judged"] is False
    said = "matches" if verdict["matches"] else "differs from"
    expect(page.locator("#verdict-badge")).to_have_text(f"final accuracy {said} baseline #{one}")
    expect(page.locator("#verdict-reasons li")).to_have_text(verdict["reasons"])
    assert verdict["reasons"][0].startswith("final eval accuracy")
    expect(page.locator("#verdict-note")).to_have_text(verdict["note"])
    expect(page.locator("#verdict-note")).to_contain_text("differ by design")
    expect(page.locator("#baseline-select")).to_have_value(str(one))
    expect(page.locator("#baseline-launch")).to_be_hidden()

    expect(page.locator("#progress-text")).to_contain_text("100 %")
    expect(page.locator("#gpu-status span")).to_have_text("no GPU")
    expect(page.locator("#chart-gpu .chart-empty")).to_have_text("no GPU")
    expect(page.locator("#chart-gpu")).to_be_hidden()  # nothing to draw: no room taken
    expect(page.locator("#chart-samples-per-sec canvas")).to_be_visible()
    # Global throughput by epoch, as the other training charts: at each epoch the sum of the
    # two processes' figures, drawn once both have reported it (never one rank's alone).
    expect(page.locator("#chart-loss")).to_have_attribute("data-axis", "epoch")
    expect(page.locator("#chart-samples-per-sec")).to_have_attribute("data-axis", "epoch")
    reported = stack.admin.http.get(f"/api/v1/jobs/{two}/metrics?name=samples_per_sec").json()
    by_epoch: dict[float, list[float]] = defaultdict(list)
    for p in reported["points"]:
        by_epoch[p["epoch"]].append(p["value"])
    assert sorted(by_epoch) == list(range(1, EPOCHS + 1))
    xs, total, *_ = drawn(page, "#chart-samples-per-sec")
    assert {x: y for x, y in zip(xs, total, strict=True) if y is not None} == pytest.approx(
        {epoch: sum(values) for epoch, values in by_epoch.items() if len(values) == 2}
    )
    # The agent samples every few seconds: a short run may end before its first CPU figure
    # (the first sample only primes the counters). The chart shows what the API has.
    cpu_points = stack.admin.http.get(f"/api/v1/jobs/{two}/metrics?name=cpu_percent").json()
    if cpu_points["points"]:
        expect(page.locator("#chart-cpu canvas")).to_be_visible()
    else:
        expect(page.locator("#chart-cpu")).to_be_hidden()
    expect(page.locator("#scaling th").first).to_have_text("Trainers")
    expect(page.locator(f"#scaling tr.current[data-job='{two}']")).to_be_visible()
    expect(page.locator(f"#scaling tr[data-job='{one}']")).to_be_visible()
    expect(page.locator("#scaling-hint")).to_have_text(summary["scaling"]["hint"])
    assert " trainer" in summary["scaling"]["hint"], summary["scaling"]
    expect(page.locator("#exports-hint")).to_have_text(
        f"tar xzf trainyard-job-{two}-tb.tar.gz; tar xzf trainyard-job-{one}-tb.tar.gz; "
        f"tensorboard --logdir run:job-{two},baseline:job-{one}"
    )

    page.screenshot(path=str(tmp_path / "training.png"), full_page=True)
    shutil.copyfile(tmp_path / "training.png", SCREENSHOT_FOR_REVIEW)
    assert errors == []


def drawn(page: Page, chart: str) -> list[list[float | None]]:
    """The values a chart draws: [xs, ...ys] (None where a series has no point)."""
    data: list[list[float | None]] = page.evaluate(
        "(sel) => document.querySelector(sel).chartData", chart
    )
    return data


def debiased_ema(ys: list[float | None], weight: float) -> list[float | None]:
    """TensorBoard's smoothing, written out again here to check the page's."""
    last, n = 0.0, 0
    out: list[float | None] = []
    for y in ys:
        if y is None:
            out.append(None)
            continue
        last = last * weight + (1 - weight) * y
        n += 1
        out.append(last / (1 - weight**n))
    return out


def drag_across(page: Page, chart: str, start: float, end: float) -> None:
    """Press on a chart's plot at `start` of its width and let go at `end`, as a user zooms."""
    box = page.locator(f"{chart} .u-over").bounding_box()
    assert box is not None
    y = box["y"] + box["height"] / 2
    page.mouse.move(box["x"] + box["width"] * start, y)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * (start + end) / 2, y)
    page.mouse.move(box["x"] + box["width"] * end, y)
    page.mouse.up()


def test_the_chart_bar_smooths_logs_and_zooms_every_chart_and_a_reload_keeps_it(
    page: Page, stack: RunningStack, one_and_two_workers: dict[str, Any]
) -> None:
    two = one_and_two_workers["two"]
    one_and_two_workers["finished"]()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(f"{stack.url}/jobs/{two}/")
    loss_chart_drawn(page)
    loss = page.locator("#chart-loss")
    raw = drawn(page, "#chart-loss")  # [epochs, the baseline's loss, this run's]

    # Smoothing: every curve drawn is the debiased moving average of its points.
    page.locator("#chart-smoothing").fill("0.8")
    wait_in_page(
        page,
        "the loss chart smoothed",
        "(raw) => document.querySelector('#chart-loss').chartData[2]"
        ".some((y, i) => y != null && y !== raw[2][i])",
        raw,
    )
    smoothed = drawn(page, "#chart-loss")
    assert smoothed[0] == raw[0]
    for series in (1, 2):
        assert smoothed[series] == pytest.approx(debiased_ema(raw[series], 0.8))

    # Log scale and x axis: every chart on the page follows. The agents' samples have a time
    # only: they stay on wall time when the others go by step.
    page.check("#chart-log")
    shown = ["#chart-loss", "#chart-lr", "#chart-eval-accuracy", "#chart-samples-per-sec"]
    for chart in shown:
        expect(page.locator(chart)).to_have_attribute("data-scale", "log")
    page.select_option("#chart-x", "step")
    for chart in shown:
        expect(page.locator(chart)).to_have_attribute("data-axis", "step")
    memory = page.locator("#chart-memory")
    expect(memory).to_have_attribute("data-axis", "wall")
    page.select_option("#chart-x", "relative")
    expect(memory).to_have_attribute("data-axis", "relative")
    expect(loss).to_have_attribute("data-axis", "relative")
    keep_screenshot(page, "charts-by-time-since-start")

    # Zoom: a drag across the loss chart zooms every chart on its axis; double-click, all out.
    page.select_option("#chart-x", "epoch")
    expect(loss).to_have_attribute("data-axis", "epoch")
    drag_across(page, "#chart-loss", 0.3, 0.7)
    expect(page.locator("#chart-zoom-out")).to_be_visible()
    for chart in shown:
        expect(page.locator(chart)).to_have_attribute("data-zoomed", "true")
    expect(memory).to_have_attribute("data-zoomed", "false")  # on wall time: not zoomed
    page.screenshot(path=str(SMOOTHED_SCREENSHOT), full_page=True)
    page.locator("#chart-eval-accuracy .u-over").dblclick()
    for chart in shown:
        expect(page.locator(chart)).to_have_attribute("data-zoomed", "false")
    expect(page.locator("#chart-zoom-out")).to_be_hidden()

    # A reload keeps the bar's choices.
    page.reload()
    loss_chart_drawn(page)
    expect(page.locator("#chart-smoothing")).to_have_value("0.8")
    expect(page.locator("#chart-log")).to_be_checked()
    expect(page.locator("#chart-x")).to_have_value("epoch")
    expect(loss).to_have_attribute("data-scale", "log")
    assert errors == []


def test_it_changes_the_baseline_from_the_picker(
    page: Page, stack: RunningStack, one_and_two_workers: dict[str, Any]
) -> None:
    one, two = one_and_two_workers["one"], one_and_two_workers["two"]
    one_and_two_workers["finished"]()
    page.goto(f"{stack.url}/jobs/{two}/")
    loss_chart_drawn(page)

    # Session auth: the picker posts with the CSRF token from the cookie.
    page.select_option("#baseline-select", "")
    expect(page.locator("#verdict-badge")).to_have_text(
        "no baseline: pick one to compare the curves"
    )
    expect(page.locator("#fig-speedup .figure-value")).to_have_text(NO_FIGURE)
    assert stack.admin.job(two)["baseline"] is None

    page.select_option("#baseline-select", str(one))
    expect(page.locator("#fig-speedup .figure-value")).to_have_text(re.compile(r"^\d+\.\d\d$"))
    loss_chart_drawn(page)
    assert stack.admin.job(two)["baseline"] == one
    expect(page.locator("#baseline-error")).to_have_text("")


def test_it_launches_a_1_trainer_baseline_for_a_program_without_one(
    page: Page, stack: RunningStack
) -> None:
    admin = stack.admin
    request = pytorch_request("printed on 2", "numbered.py", 2, args=["--lines", "30"])
    # A script that only prints, charted through a regex definition: a custom metric.
    request["metrics"] = [{"name": "line_no", "regex": r"^\w+-\d+ (?P<value>(?P<step>\d+))$"}]
    job = admin.submit(request)
    admin.wait_finished(job["id"])
    page.goto(f"{stack.url}/jobs/{job['id']}/")

    expect(page.locator("#chart-custom canvas")).to_be_visible()
    expect(page.locator("#chart-custom .u-legend")).to_contain_text("line_no [worker-1]")
    expect(page.locator("#chart-loss .chart-empty")).to_have_text("no points yet")
    expect(page.locator("#chart-loss canvas")).to_have_count(0)
    expect(page.locator("#fig-speedup .figure-value")).to_have_text(NO_FIGURE)

    button = page.locator("#baseline-launch")
    expect(button).to_be_visible()
    button.click()
    link = page.locator("#baseline-launched a")
    expect(link).to_have_text(re.compile(r"^#\d+ printed on 2 · 1-trainer baseline$"))
    href = link.get_attribute("href") or ""
    baseline = int(href.strip("/").rsplit("/", 1)[-1])
    assert admin.job(job["id"])["baseline"] == baseline
    expect(page.locator("#baseline-select")).to_have_value(str(baseline))
    expect(button).to_be_hidden()
    expect(page.locator("#verdict-badge")).to_contain_text(f"baseline #{baseline}")
    assert admin.wait_finished(baseline)["state"] == "succeeded"


def test_resource_lines_break_between_attempts(page: Page, stack: RunningStack) -> None:
    """A job restarted after a failure: its memory line stops where the first attempt ended
    and starts again with the second, rather than draw across the time nothing ran."""
    admin = stack.admin
    fail, finish = signal_file("fail"), signal_file("finish")
    request = pytorch_request(
        "restarts once",
        "fail_once_held.py",
        1,
        args=["--fail-after", str(fail), "--finish-after", str(finish)],
    )
    request["restart"] = {"policy": "on-failure", "max_restarts": 1, "backoff_seconds": 1}
    job = admin.submit(request)

    def memory_since(moment: float) -> list[dict[str, Any]]:
        points = admin.http.get(f"/api/v1/jobs/{job['id']}/metrics?name=memory_mb").json()
        return [p for p in points["points"] if p["ts"] > moment]

    try:
        wait_until("2 memory samples of the first attempt", lambda: len(memory_since(0)) >= 2)
        fail.touch()
        # The second attempt's own start, not the job's state: the job's row and its attempts
        # are two reads, and a read between them can pair "running" (the first attempt's)
        # with a second attempt that has not started yet.
        again = admin.wait(
            job["id"], lambda j: len(j["attempts"]) == 2 and bool(j["attempts"][1]["started"])
        )
        restarted = datetime.fromisoformat(again["attempts"][1]["started"]).timestamp()
        wait_until(
            "2 memory samples of the second attempt", lambda: len(memory_since(restarted)) >= 2
        )
    finally:
        fail.touch()
        finish.touch()
    ended = admin.wait_finished(job["id"])
    assert ended["state"] == "succeeded", ended
    first_end = datetime.fromisoformat(ended["attempts"][0]["finished"]).timestamp()

    page.goto(f"{stack.url}/jobs/{job['id']}/")
    memory = page.locator("#chart-memory")
    expect(memory).to_have_attribute("data-axis", "wall")
    wait_in_page(
        page,
        "the memory chart drawn",
        "() => Number(document.querySelector('#chart-memory').dataset.points) > 1",
    )
    data = drawn(page, "#chart-memory")
    xs, master = cast(list[float], data[0]), data[1]  # x values are never missing
    breaks = [x for x, y in zip(xs, master, strict=True) if y is None]
    # JSON has no undefined: the series' holes (none here: one instance) and breaks both read
    # None, so the break is told by its place, the first attempt's end.
    assert breaks == [pytest.approx(first_end)], (xs, master)
    before = [y for x, y in zip(xs, master, strict=True) if x < first_end and y is not None]
    after = [y for x, y in zip(xs, master, strict=True) if x > first_end and y is not None]
    assert before and after
    keep_screenshot(page, "memory-line-across-a-restart")


def test_it_draws_points_as_they_arrive(page: Page, stack: RunningStack, tmp_path: Path) -> None:
    """While a job runs, its points come over the page's websocket and the charts redraw: the
    agent's memory samples (every 2 s) and a regex-defined metric (a tick every 0.25 s). The
    test holds the job open until it has seen both charts grow, however slow the machine."""
    admin = stack.admin
    stop = signal_file("stop")
    request = pytorch_request(
        "ticks slowly", "ticker.py", 1, args=["--stop", str(stop), "--every", "0.25"]
    )
    request["metrics"] = [{"name": "tick", "regex": r"^tick (?P<value>(?P<step>\d+))$"}]
    job = admin.submit(request)
    try:
        page.add_init_script(
            "window.metricEvents = 0;"
            "document.addEventListener('trainyard:metric', () => window.metricEvents++);"
        )
        page.goto(f"{stack.url}/jobs/{job['id']}/")
        expect(page.locator("#job-state")).to_have_text("running")
        for chart in ("#chart-memory", "#chart-custom"):
            drawn = f"Number(document.querySelector('{chart}').dataset.points || 0)"
            wait_in_page(page, f"first points on {chart}", f"() => {drawn} > 0")
            first = page.evaluate(f"() => {drawn}")
            # More points while the job still runs: drawn from live points, not a reload.
            wait_in_page(page, f"more points on {chart}", f"() => {drawn} > {first}")
            counts = page.evaluate(CANVAS_PIXELS, f"{chart} canvas")
            assert counts["opaque"] > 500 and counts["run"] > 50, (chart, counts)
        expect(page.locator("#job-state")).to_have_text("running")
        expect(page.locator("#training-status")).to_contain_text("live")
        assert page.evaluate("window.metricEvents") > 0
    finally:
        stop.touch()
    expect(page.locator("#job-state")).to_have_text("succeeded")
    expect(page.locator("#training-status")).not_to_contain_text("live")
    assert admin.wait_finished(job["id"])["state"] == "succeeded"
