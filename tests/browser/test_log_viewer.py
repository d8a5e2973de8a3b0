"""The job page's log viewer, in a real browser against the real stack: text stays text, filters,
search, jump to the first error, pause and resume, reconnecting, a bounded window under a flood
of lines, older lines on scrolling up, and the download."""

import json
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Locator, Page, WebSocketRoute, expect

from tests.conftest import RunningStack, pytorch_request

pytestmark = [pytest.mark.browser, pytest.mark.integration]

MAX_WINDOW = 5000  # elements (lines and notices) the viewer keeps in the DOM (job_detail.js)
TAIL = 2000  # lines the viewer loads at first, and when a filter changes
SPEW_LINES = 50_000

# Records every websocket the page opens, so that a test can cut one as a network would.
RECORD_SOCKETS = """
window.__sockets = [];
const Native = window.WebSocket;
window.WebSocket = class extends Native {
  constructor(...args) { super(...args); window.__sockets.push(this); }
};
"""

# The most .line elements the log ever held at the end of a task (so between two frames).
WATCH_WINDOW = """() => {
  const log = document.getElementById("log");
  const lines = log.getElementsByClassName("line");
  window.__maxLines = lines.length;
  new MutationObserver(() => {
    window.__maxLines = Math.max(window.__maxLines, lines.length);
  }).observe(log, { childList: true, subtree: true });
}"""


# True once the log shows exactly the lines with these cursors, in this order.
SHOWS_CURSORS = """want => {
  const got = [...document.querySelectorAll("#log .line")].map(l => +l.dataset.cursor);
  return got.length === want.length && got.every((c, i) => c === want[i]);
}"""


# True once the log's last line is after cursor c.
LAST_CURSOR_ABOVE = """c => {
  const lines = document.querySelectorAll("#log .line");
  return lines.length > 0 && +lines[lines.length - 1].dataset.cursor > c;
}"""


def open_job(page: Page, stack: RunningStack, job_id: int) -> Locator:
    page.goto(f"{stack.url}/jobs/{job_id}/")
    log = page.locator("#log")
    log.scroll_into_view_if_needed()
    return log


def open_finished_job(page: Page, stack: RunningStack, job_id: int) -> Locator:
    """The page of a finished job, once its last lines are all shown."""
    log = open_job(page, stack, job_id)
    expect(page.locator("#log-status")).to_have_text(re.compile(r"^log complete \(.+\)$"))
    expect(log.locator(".notice-end")).to_be_attached()  # rendered after every line before it
    log.scroll_into_view_if_needed()
    return log


def line_texts(log: Locator) -> list[str]:
    """Each line's text without its [tag]."""
    return log.evaluate(
        """el => [...el.querySelectorAll(".line")].map(
            l => l.textContent.slice(l.querySelector(".tag").textContent.length))"""
    )


def cursors(log: Locator) -> list[int]:
    return [
        int(c)
        for c in log.evaluate("""el => [...el.querySelectorAll(".line")]
        .map(l => l.dataset.cursor)""")
    ]


def first_cursor(log: Locator) -> int:
    return int(log.locator(".line").first.get_attribute("data-cursor") or 0)


def last_cursor(log: Locator) -> int:
    return int(log.locator(".line").last.get_attribute("data-cursor") or 0)


@pytest.fixture(scope="module")
def showcase(stack: RunningStack) -> Iterator[dict[str, Any]]:
    """A finished job of 3 instances on both nodes (3 x 2 cores, nodes of 4) whose log has
    markup, colour codes and, far from its end, a traceback on worker-1's stderr."""
    # The page loads the last 2,000 lines first; the traceback and rank 0's first line must be
    # before them whatever the ranks' pace. The traceback reaches the log through worker-1's
    # stderr reader, which a busy agent may run a while after its stdout reader: with 2,500
    # lines after it the margin (500 lines) was once too small on a loaded 2-core machine, so
    # 6,000 lines follow it.
    request = pytorch_request(
        "showcase", "log_showcase.py", 3, package="cpu-2", args=["--after", "6000"]
    )
    job = stack.admin.submit(request)
    job = stack.admin.wait_finished(job["id"])
    assert job["state"] == "succeeded", job
    assert len({r["node"] for r in job["replicas"]}) == 2, job["replicas"]
    yield job


def test_markup_and_colour_codes_are_shown_as_text(
    page: Page, stack: RunningStack, showcase: dict[str, Any]
) -> None:
    log = open_finished_job(page, stack, showcase["id"])
    tagged = r"^\[(master|worker-\d)\] "

    html = log.locator(".line", has_text="html: ").first
    expect(html).to_have_text(
        re.compile(
            tagged + re.escape("html: <b>not bold</b> <img src=x onerror=window.pwned=1> ")
            + re.escape("<script>window.pwned=1</script>") + "$"
        )
    )  # fmt: skip
    assert log.locator("b, img, script, iframe").count() == 0
    assert page.evaluate("window.pwned") is None

    ansi = log.locator(".line", has_text="ansi: ").first
    expect(ansi).to_have_text(re.compile(tagged + "ansi: red alert and bold green plain$"))
    expect(ansi.locator("span.ansi-red")).to_have_text("red alert")
    expect(ansi.locator("span.ansi-green.ansi-bold")).to_have_text("bold green")
    expect(log.locator(".line", has_text="escapes: ").first).to_have_text(
        re.compile(tagged + "escapes: cleared cursor moves$")
    )
    # A carriage return overwrites, as in a terminal: only the last state shows.
    expect(log.locator(".line", has_text="progress").first).to_have_text(
        re.compile(tagged + "progress 100%$")
    )
    text = log.inner_text()
    for leftover in ("\x1b", "\r", "\x07", "[31m", "[0m", "]0;"):
        assert leftover not in text
    # Only the viewer's own spans: none came from the trainer's text.
    assert log.locator(".line span:not(.tag):not([class^=ansi-])").count() == 0


def test_filters_by_stream_node_and_role_and_counts_lines(
    page: Page, stack: RunningStack, showcase: dict[str, Any]
) -> None:
    job_id = showcase["id"]
    log = open_finished_job(page, stack, job_id)
    lines = stack.admin.logs(job_id)

    # Counts per instance (Instances table) and per node, as the whole log has them.
    by_tag = Counter(
        line["role"] if line["role"] == "master" else f"{line['role']}-{line['index']}"
        for line in lines
    )
    for tag, n in by_tag.items():
        expect(page.locator(f"#replicas tr[data-tag={tag}] td.lines")).to_have_text(f"{n:,}")
    by_node = Counter(line["node"] for line in lines)
    for node, n in by_node.items():
        expect(page.locator(f"#log-counts [data-node={node}]")).to_have_text(f"{node} {n:,}")

    def shows(which: list[dict[str, Any]]) -> None:
        """Wait until the log shows the last TAIL of these lines, exactly."""
        want = [line["cursor"] for line in which][-TAIL:]
        page.wait_for_function(SHOWS_CURSORS, arg=want)

    # stderr only: the traceback and one line per rank, nothing else.
    page.uncheck("#log-stdout")
    stderr = [line for line in lines if line["stream"] == "stderr"]
    shows(stderr)
    assert line_texts(log) == [line["text"] for line in stderr]
    expect(log.locator(".line[data-stream=stdout]")).to_have_count(0)
    page.check("#log-stdout")

    # One node: only its lines.
    node = next(r["node"] for r in showcase["replicas"] if r["tag"] == "worker-1")
    page.select_option("#log-node", node)
    shows([line for line in lines if line["node"] == node])
    expect(log.locator(f".line:not([data-node={node}])")).to_have_count(0)
    page.select_option("#log-node", "")

    # One role: no master lines, and the master's tab is not offered.
    page.select_option("#log-role", "worker")
    shows([line for line in lines if line["role"] == "worker"])
    expect(log.locator(".line[data-tag=master]")).to_have_count(0)
    expect(page.locator("#log-tabs .tab[data-tag=master]")).to_be_hidden()
    # ...combined with an instance tab.
    page.click("#log-tabs >> text=[worker-2]")
    shows([line for line in lines if (line["role"], line["index"]) == ("worker", 2)])
    expect(log.locator(".line:not([data-tag=worker-2])")).to_have_count(0)


def test_search_highlights_and_finds_lines_outside_the_window(
    page: Page, stack: RunningStack, showcase: dict[str, Any]
) -> None:
    log = open_finished_job(page, stack, showcase["id"])
    search = page.locator("#log-search")

    search.fill("BOLD green")  # case does not matter
    expect(log.locator("mark.match").first).to_have_text("bold green")
    expect(page.locator("#search-status")).to_have_text(re.compile(r"^\d+ loaded$"))
    search.press("Enter")
    focus = log.locator(".line.focus")
    expect(focus).to_contain_text("bold green")
    expect(focus).to_be_in_viewport()
    expect(page.locator("#search-status")).to_have_text(re.compile(r"^\d+ of \d+ loaded$"))

    # Rank 0's first line is long before the lines loaded at first: the server finds it.
    assert log.locator(".line", has_text="needle-early").count() == 0
    search.fill("needle-early")
    expect(page.locator("#search-status")).to_contain_text("none loaded")
    page.click("#search-prev")
    expect(focus).to_contain_text("needle-early: the first line of rank 0")
    expect(focus.locator("mark.match")).to_have_text("needle-early")
    expect(focus).to_be_in_viewport()


def test_jump_to_first_error_scrolls_to_the_traceback(
    page: Page, stack: RunningStack, showcase: dict[str, Any]
) -> None:
    log = open_finished_job(page, stack, showcase["id"])
    assert log.locator(".line", has_text="Traceback").count() == 0  # not among the last lines

    page.click("#jump-error")
    focus = log.locator(".line.focus")
    expect(focus).to_have_text("[worker-1] Traceback (most recent call last):")
    expect(focus).to_have_attribute("data-stream", "stderr")
    expect(focus).to_be_in_viewport()
    # Back to the end of the log.
    page.click("#new-lines")
    expect(log.locator(".notice-end")).to_be_in_viewport()


def test_pause_holds_lines_back_and_reconnecting_loses_none(
    page: Page, stack: RunningStack, tmp_path: Path
) -> None:
    stop = tmp_path / "stop"
    job = stack.admin.submit(pytorch_request("ticker", "ticker.py", 1, args=["--stop", str(stop)]))
    page.add_init_script(RECORD_SOCKETS)
    log = open_job(page, stack, job["id"])
    expect(log.locator(".line", has_text="tick 10").first).to_be_visible()

    page.click("#log-pause")
    expect(page.locator("#log-pause")).to_have_text("Resume")
    shown = cursors(log)
    new_lines = page.locator("#new-lines")
    expect(new_lines).to_have_text(re.compile(r"^↓ ([2-9]\d|\d{3,}) new lines$"))
    assert cursors(log) == shown  # held back, not rendered
    new_lines.click()
    expect(new_lines).to_be_hidden()
    page.wait_for_function(LAST_CURSOR_ABOVE, arg=shown[-1])

    # Cut the websocket: the page reconnects after its cursor.
    expect(page.locator("#log-status")).to_have_text("live")
    before = last_cursor(log)
    page.evaluate("window.__sockets.at(-1).close()")
    page.wait_for_function("window.__sockets.length === 2")
    urls = page.evaluate("window.__sockets.map(s => s.url)")
    assert urls[0].endswith(f"?tail={TAIL}")
    assert re.search(r"\?after=\d+$", urls[1])
    page.wait_for_function(LAST_CURSOR_ABOVE, arg=before + 20)

    stop.touch()
    expect(page.locator("#log-status")).to_contain_text("log complete")
    expect(log.locator(".line").last).to_have_text("[master] stopped")
    # Every tick once, in order: no gap, no duplicate across the pause and the reconnect.
    texts = line_texts(log)
    assert texts[-1] == "stopped"
    ticks = [int(t.split()[1]) for t in texts[:-1]]
    assert ticks == list(range(ticks[0], ticks[0] + len(ticks)))
    got = cursors(log)
    assert got == sorted(set(got))
    assert len(ticks) > 30


def test_a_gap_frame_shows_a_notice_and_a_too_slow_close_resumes_after_the_cursor(
    page: Page, stack: RunningStack, tmp_path: Path
) -> None:
    """The real server's frames pass through a relay in the browser that can turn a frame into
    a gap (as when lines were trimmed before they were archived) and close the page's socket
    with 4408, as the server does to a client that fell behind."""
    relays: list[WebSocketRoute] = []
    armed = {"gap": False}
    dropped: list[int] = []

    def relay(ws: WebSocketRoute) -> None:
        server = ws.connect_to_server()
        relays.append(ws)
        last = {"next": None}

        def from_server(message: str | bytes) -> None:
            frame = json.loads(message)
            if armed["gap"] and frame["type"] == "log" and last["next"] is not None:
                armed["gap"] = False
                dropped.extend(
                    b["first"] + k for b in frame["batches"] for k in range(len(b["lines"]))
                )
                frame = {
                    "type": "gap",
                    "after": last["next"],
                    "next": frame["next"],
                    "reason": "trimmed before it was archived (simulated)",
                }
            last["next"] = frame.get("next", last["next"])
            ws.send(json.dumps(frame))

        server.on_message(from_server)

    stop = tmp_path / "stop"
    job = stack.admin.submit(pytorch_request("relayed", "ticker.py", 1, args=["--stop", str(stop)]))
    page.route_web_socket(re.compile(r"/ws/jobs/\d+/"), relay)
    log = open_job(page, stack, job["id"])
    expect(log.locator(".line", has_text="tick 5").first).to_be_attached()

    armed["gap"] = True
    notice = log.locator(".notice-gap")
    expect(notice).to_have_text(
        re.compile(r"^⚠ \d+ lines? missing here: trimmed before it was archived \(simulated\)$")
    )
    expect(page.locator(".log-banner")).to_have_text(notice.inner_text())
    assert dropped

    page.wait_for_function(LAST_CURSOR_ABOVE, arg=max(dropped) + 5)
    seen = last_cursor(log)
    relays[0].close(code=4408, reason="too slow")
    page.wait_for_function(LAST_CURSOR_ABOVE, arg=seen + 10)
    assert len(relays) == 2
    resumed = re.search(r"\?after=(\d+)$", relays[1].url)
    assert resumed and int(resumed.group(1)) >= seen

    stop.touch()
    expect(page.locator("#log-status")).to_have_text(re.compile(r"^log complete \(.+\)$"))
    expect(log.locator(".notice-end")).to_have_text(re.compile(r"^— end of log: .+ —$"))
    # Every line once, in order, but those the gap said were gone.
    shown = cursors(log)
    everything = [line["cursor"] for line in stack.admin.logs(job["id"])]
    assert shown == [c for c in everything if c >= shown[0] and c not in dropped]
    assert set(dropped) < set(everything)


def test_a_flood_of_lines_keeps_the_window_bounded_and_loads_older_lines(
    page: Page, stack: RunningStack, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    job = stack.admin.submit(
        pytorch_request("spew", "spew.py", 1, args=["--lines", str(SPEW_LINES), "--go", str(go)])
    )
    log = open_job(page, stack, job["id"])
    expect(log.locator(".line").first).to_have_text("[master] waiting for go")
    page.evaluate(WATCH_WINDOW)
    go.touch()

    expect(page.locator("#log-status")).to_contain_text("log complete")
    expect(log.locator(".line").last).to_have_text("[master] spew done")
    # The window is full: the newest lines and the end-of-log notice, nothing more.
    expect(log.locator(".line, .notice")).to_have_count(MAX_WINDOW)
    assert page.evaluate("window.__maxLines") <= MAX_WINDOW
    expect(page.locator("#replicas tr[data-tag=master] td.lines")).to_have_text(
        f"{SPEW_LINES + 2:,}"
    )

    # Scrolling to the top fetches older lines, and what was on top stays where it was.
    top = first_cursor(log)
    log.evaluate("el => { el.scrollTop = 0; }")
    page.wait_for_function("c => +document.querySelector('#log .line').dataset.cursor < c", arg=top)
    expect(page.locator("#log-pause")).to_have_text("Resume")  # scrolling up paused the view
    expect(log.locator(f".line[data-cursor='{top}']")).to_be_in_viewport()
    assert log.locator(".line").count() <= MAX_WINDOW
    got = cursors(log)
    assert got == list(range(got[0], got[0] + len(got)))  # one run of lines, none missing

    # The download has the whole log as text.
    href = page.locator("#log-download").get_attribute("href")
    assert href == f"/api/v1/jobs/{job['id']}/logs.txt"
    response = page.request.get(f"{stack.url}{href}")
    assert response.ok
    assert "attachment" in response.headers["content-disposition"]
    # Every line as "[tag] text" (the server may close with a "--- log complete ..." trailer).
    text = [line for line in response.text().splitlines() if not line.startswith("--- ")]
    assert len(text) == SPEW_LINES + 2
    assert text[0] == "[master] waiting for go"
    assert text[1] == "[master] spew 00000 loss=0.000 lr=1e-3 samples/s=12345"
    assert text[-2].startswith(f"[master] spew {SPEW_LINES - 1:05d} ")
    assert text[-1] == "[master] spew done"
