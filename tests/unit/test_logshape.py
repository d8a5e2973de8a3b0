"""What a log line shows (jobs/logshape.py): the one rule the server's search and the page's log
viewer follow. The cases in tests/fixtures/logtext/ are also what the viewer's Node tests
(static/trainyard/job/log/*.test.js) check the page's side against."""

import json
from pathlib import Path
from typing import Any

import pytest

from jobs import logshape
from jobs.logstream import Batch, LineFilter
from jobs.page_rules import page_rules

FIXTURES = Path(__file__).parent.parent / "fixtures" / "logtext"
CASES: list[dict[str, Any]] = json.loads((FIXTURES / "cases.json").read_text())


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_a_line_shows_as_the_cases_say(case: dict[str, Any]) -> None:
    assert [list(s) for s in logshape.segments(case["text"])] == case["segments"]
    assert logshape.shown_text(case["text"]) == case["shown"]
    assert [list(h) for h in logshape.find(case["needle"], case["shown"])] == case["hits"]
    assert logshape.contains(case["needle"], case["shown"]) == bool(case["hits"])


def test_the_pages_casefold_table_is_the_servers() -> None:
    table = logshape.casefold_exceptions()
    assert json.loads((FIXTURES / "casefold.json").read_text()) == table
    assert page_rules()["log"] == {"casefold": table}
    assert table["ß"] == "ss" and "A" not in table


def test_only_the_text_after_the_last_carriage_return_shows() -> None:
    assert logshape.shown_text("10%\r\x1b[2K50%\r") == "50%"
    assert logshape.shown_text("\r\r") == ""
    assert logshape.segments("") == []


def test_html_stays_text() -> None:
    assert logshape.shown_text("<b>x</b>") == "<b>x</b>"
    assert logshape.is_plain("<b>x</b>")


def batch(*lines: str) -> Batch:
    return Batch(
        first=10, last=9 + len(lines), role="worker", index=1, stream="stdout", lines=list(lines)
    )


@pytest.mark.parametrize(
    "lines",
    [
        ["epoch 1", "", "\tindented", "<b>html</b> stays text", "ünïcode ✓"],
        ["epoch 1", "10%\r50%", "plain"],
        ["\x1b[31mred\x1b[0m"],
        ["ok", "a bell \x07"],
        ["ok", "c1 \x9b"],
        [],
    ],
)
def test_a_frame_says_how_exactly_the_lines_that_do_not_show_as_written_show(
    lines: list[str],
) -> None:
    assert logshape.all_plain(lines) == all(logshape.is_plain(t) for t in lines)
    shown = batch(*lines).wire().get("shown", {})
    assert shown == {
        str(k): logshape.segments(t) for k, t in enumerate(lines) if not logshape.is_plain(t)
    }


def test_the_search_matches_what_shows_and_says_where() -> None:
    b = batch("hidden-needle 10%\r\x1b[2Kdone", "a \x1b[1mvisible\x1b[0m-needle", "plain NEEDLE")
    search = LineFilter(text="needle")
    assert search.matching(b) == [1, 2]
    second = search.line(b, 1)
    assert second["text"] == b.lines[1]
    assert second["shown"] == [("a ", ""), ("visible", "ansi-bold"), ("-needle", "")]
    assert second["hits"] == [(10, 16)]
    third = search.line(b, 2)
    assert "shown" not in third and third["hits"] == [(6, 12)]
    assert "hits" not in LineFilter().line(b, 2)


def test_errors_are_found_in_what_shows() -> None:
    b = batch("ValueError: gone\rall well", "\x1b[31mERROR\x1b[0m disk")
    assert LineFilter(errors=True).matching(b) == [1]


def test_websocket_batches_carry_how_their_lines_show() -> None:
    wire = batch("plain", "\x1b[32mok\x1b[0m").wire()
    assert wire["lines"] == ["plain", "\x1b[32mok\x1b[0m"]
    assert wire["shown"] == {"1": [("ok", "ansi-green")]}
    assert "shown" not in batch("plain").wire()
