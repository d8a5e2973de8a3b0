"""The job page's log viewer, in a real browser against the real stack: text stays text, filters,
search, jump to the first error, pause and resume, reconnecting, lines Redis trimmed before they
were archived shown as a gap, a bounded window under a flood of lines, older lines on scrolling
up, and the download.

(The server's own 4408 close of a client that reads too slowly is tested with a real client
that stops reading, in tests/integration/test_slow_websocket.py.)"""

import json
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import redis
from playwright.sync_api import Browser, Locator, Page, expect

from jobs.logstream import RawEntry, parse_entry
from tests.browser.conftest import admin_page, wait_in_page
from tests.conftest import RunningStack, pytorch_request, signal_file, unlimited_image, wait_until
from workers.contract import log_stream_key

pytestmark = [pytest.mark.browser, pytest.mark.integration]

MAX_WINDOW = 5000  # elements (lines and notices) the viewer keeps in the DOM (job/log/state.js)
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
        wait_in_page(page, f"the log to show {len(want)} lines", SHOWS_CURSORS, want)

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


def test_search_finds_only_what_a_line_shows(
    page: Page, stack: RunningStack, showcase: dict[str, Any]
) -> None:
    """Rank 0 printed "far-needle" twice before the lines loaded at first: once shown, split by
    a colour code; then once overwritten by a carriage return, nearer the window. The server
    finds the shown one and the viewer marks it; the overwritten one is no match."""
    log = open_finished_job(page, stack, showcase["id"])
    search = page.locator("#log-search")
    status = page.locator("#search-status")
    focus = log.locator(".line.focus")
    # Rank 0's lines only: in the whole log, the other ranks' lines may come between its two
    # (each rank writes unbuffered, and a loaded machine may run the others in between), so
    # "just after it" holds in rank 0's order, not always within the lines loaded around it.
    page.click("#log-tabs >> text=[master]")
    expect(log.locator(".line:not([data-tag=master])")).to_have_count(0)

    search.fill("FAR-needle")
    expect(status).to_have_text("none loaded")
    page.click("#search-prev")
    expect(focus).to_have_text(re.compile(r"^\[master\] far-needle: loaded$"))
    expect(focus).to_be_in_viewport()
    marks = focus.locator("mark.match")
    assert "".join(marks.all_text_contents()) == "far-needle"
    expect(focus.locator("span.ansi-bold mark.match")).to_have_text("far-")
    # The overwritten line, just after it, shows only what overwrote it, unmarked.
    overwritten = log.locator(".line", has_text="still loading")
    expect(overwritten).to_have_text(re.compile(r"^\[master\] still loading$"))
    expect(overwritten.locator("mark")).to_have_count(0)
    expect(status).to_have_text("1 of 1 loaded")
    page.click("#search-prev")
    expect(status).to_have_text("no more above")
    page.click("#search-next")
    expect(status).to_have_text("no more below")


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
    stop = signal_file("stop")
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
    wait_in_page(page, "the held lines", LAST_CURSOR_ABOVE, shown[-1])

    # Cut the websocket: the page reconnects after its cursor.
    expect(page.locator("#log-status")).to_have_text("live")
    before = last_cursor(log)
    page.evaluate("window.__sockets.at(-1).close()")
    wait_in_page(page, "the page to reconnect", "window.__sockets.length === 2")
    urls = page.evaluate("window.__sockets.map(s => s.url)")
    assert urls[0].endswith(f"?tail={TAIL}")
    assert re.search(r"\?after=\d+$", urls[1])
    wait_in_page(page, "lines after the reconnect", LAST_CURSOR_ABOVE, before + 20)

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


# --- lines Redis trimmed before the keeper archived them ------------------------------------

# The log as the viewer lays it out, in document order: a line's cursor, or a notice's kind.
LAYOUT = """el => [...el.querySelectorAll(".line, .notice")].map(
    e => e.classList.contains("line") ? +e.dataset.cursor : e.className)"""

# Lines of the three phases of phases.py: the first is archived, the second is trimmed from
# Redis while the keeper is stopped, the third comes after. (The agent's CPU and memory samples
# take cursors too, between lines, whenever they come: cursors are read, not assumed.)
PHASES = (100, 300, 50)


def gap_reason(after: int, upto: int) -> str:
    return (
        f"lines {after + 1} to {upto} are no longer kept: Redis trimmed them before they were "
        "archived"
    )


def archived_chunks(stack: RunningStack, job_id: int) -> list[tuple[int, int, str]]:
    """(first cursor, last cursor, kind) of each LogChunk row the log keeper wrote for the job."""
    out = stack.stack.manage(
        "shell",
        "-c",
        "import json; from jobs.models import LogChunk; print(json.dumps(list("
        f"LogChunk.objects.filter(job_id={job_id}).order_by('first_cursor')"
        ".values_list('first_cursor', 'last_cursor', 'kind'))))",
    )
    return [(first, last, kind) for first, last, kind in json.loads(out.splitlines()[-1])]


def what_the_page_shows(browser: Browser, stack: RunningStack, job_id: int) -> dict[str, Any]:
    """The finished job's page, once its log is complete on it."""
    with admin_page(browser, stack) as page:
        log = open_finished_job(page, stack, job_id)
        return {
            "layout": log.evaluate(LAYOUT),
            "texts": line_texts(log),
            "gap notices": log.locator(".notice-gap").all_inner_texts(),
            "banners": page.locator(".log-banner").all_inner_texts(),
        }


@pytest.fixture(scope="module")
def trimmed(
    browser: Browser, fault_stack: RunningStack, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """A finished job whose second phase Redis trimmed while the log keeper was stopped (by
    PID), as it trims a stream past its cap; what its page showed before the keeper came back
    (read from Redis); and the cursors that mark the hole. Returned once the keeper has
    archived the rest of the log."""
    stack = fault_stack
    admin = stack.admin
    gate = signal_file("gate-")
    counts = ",".join(map(str, PHASES))
    job_id = admin.submit(
        pytorch_request("trimmed", "phases.py", 1, args=["--counts", counts, "--gate", str(gate)])
    )["id"]

    def archived_up_to() -> int:
        chunks = archived_chunks(stack, job_id)
        return chunks[-1][1] if chunks else 0

    def whole_phase(phase: int) -> list[dict[str, Any]] | None:
        """The phase's lines, once all of them are in the log."""
        got = [x for x in admin.logs(job_id) if x["text"].startswith(f"phase {phase} ")]
        return got if len(got) == PHASES[phase] else None

    first_phase = wait_until("the first phase", lambda: whole_phase(0))
    wait_until(
        "the keeper to archive the first phase",
        lambda: archived_up_to() >= first_phase[-1]["cursor"],
    )
    hole: dict[str, Any] = {}
    failures: list[BaseException] = []

    def while_the_keeper_is_down() -> None:
        # Failures wait until after the restart: the keeper must come back whatever happens.
        try:
            hole["archived up to"] = archived_up_to()
            Path(f"{gate}1").touch()
            hole["lost"] = wait_until("the second phase in Redis", lambda: whole_phase(1))
            # What the agents' XADD ... MAXLEN ~ does to a stream past its cap
            # (workers.logsink), here to every entry: the first phase is archived, the second
            # is now nowhere.
            client = redis.Redis.from_url(stack.stack.redis_url, decode_responses=True)
            try:
                assert client.xtrim(log_stream_key(job_id), maxlen=0, approximate=False) > 0
                Path(f"{gate}2").touch()
                finished = admin.wait_finished(job_id)
                assert finished["state"] == "succeeded", finished["reason"]
                # Redis keeps the lines from here on.
                entries = cast(list[RawEntry], client.xrange(log_stream_key(job_id), count=1))
                hole["kept from"] = parse_entry(*entries[0]).first
            finally:
                client.close()
            hole["seen"] = what_the_page_shows(browser, stack, job_id)
        except BaseException as exc:  # re-raised once the keeper is back
            failures.append(exc)

    stack.stack.restart("log-keeper", while_the_keeper_is_down)
    if failures:
        raise failures[0]
    wait_until("the keeper to archive the log", lambda: admin.job(job_id)["log_archived"])
    return {"id": job_id, **hole}


def shows_the_gap(trimmed: dict[str, Any], kept: list[dict[str, Any]]) -> dict[str, Any]:
    """What the page shows: the lines kept, one gap notice between the first phase and the
    third, the same text as a banner, the end."""
    after, upto = trimmed["archived up to"], trimmed["kept from"] - 1
    notice = f"⚠ {upto - after:,} lines missing here: {gap_reason(after, upto)}"
    before = [x["cursor"] for x in kept if x["cursor"] <= after]
    later = [x["cursor"] for x in kept if x["cursor"] > upto]
    assert len(before) + len(later) == len(kept)
    return {
        "layout": [*before, "notice notice-gap", *later, "notice notice-end"],
        "texts": [x["text"] for x in kept],
        "gap notices": [notice],
        "banners": [notice],
    }


def test_lines_trimmed_before_they_were_archived_show_as_a_gap(
    fault_stack: RunningStack, trimmed: dict[str, Any]
) -> None:
    kept = fault_stack.admin.logs(trimmed["id"])
    assert [x["text"] for x in kept] == [
        f"phase {p} line {k}" for p in (0, 2) for k in range(PHASES[p])
    ]
    assert trimmed["seen"] == shows_the_gap(trimmed, kept)


def test_the_keeper_records_the_hole_and_the_lost_lines_are_kept_nowhere(
    fault_stack: RunningStack, trimmed: dict[str, Any]
) -> None:
    admin = fault_stack.admin
    job_id = trimmed["id"]
    after, upto = trimmed["archived up to"], trimmed["kept from"] - 1
    lost = [x["cursor"] for x in trimmed["lost"]]
    assert after < lost[0] and lost[-1] <= upto
    chunks = archived_chunks(fault_stack, job_id)
    # One row says the range is gone; no other row has any of it.
    assert [c for c in chunks if c[2] == "gap"] == [(after + 1, upto, "gap")]
    assert [c for c in chunks if c[0] <= upto and c[1] > after] == [(after + 1, upto, "gap")]
    assert chunks[-1][2] == "end"
    everything = admin.logs(job_id)
    assert not {x["cursor"] for x in everything} & set(lost)
    assert [x["text"] for x in everything] == [
        f"phase {p} line {k}" for p in (0, 2) for k in range(PHASES[p])
    ]
    text = admin.http.get(f"/api/v1/jobs/{job_id}/logs.txt").text.splitlines()
    assert text[PHASES[0] - 1 : PHASES[0] + 2] == [
        f"[master] phase 0 line {PHASES[0] - 1}",
        f"--- {gap_reason(after, upto)} ---",
        "[master] phase 2 line 0",
    ]


def test_a_page_opened_after_the_hole_was_archived_shows_the_gap_too(
    browser: Browser, fault_stack: RunningStack, trimmed: dict[str, Any]
) -> None:
    kept = fault_stack.admin.logs(trimmed["id"])
    seen = what_the_page_shows(browser, fault_stack, trimmed["id"])
    assert seen == shows_the_gap(trimmed, kept)


def test_a_flood_of_lines_keeps_the_window_bounded_and_loads_older_lines(
    page: Page, stack: RunningStack, tmp_path: Path
) -> None:
    go = signal_file("go")
    request = pytorch_request(
        "spew", "spew.py", 1, args=["--lines", str(SPEW_LINES), "--go", str(go)]
    )
    request["image"] = unlimited_image(stack)  # every line must arrive: no log limit
    job = stack.admin.submit(request)
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
    wait_in_page(
        page, "older lines", "c => +document.querySelector('#log .line').dataset.cursor < c", top
    )
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
