"""What the job page's training section shows, read in the page (shared by the browser tests)."""

from typing import Any

from playwright.sync_api import Page

from tests.browser.conftest import wait_in_page

# What the training section draws with nothing in it: figure cards, charts without a point, the
# progress bar and the scaling table. An element hidden by any ancestor has no offsetParent.
EMPTY_THINGS_SHOWN = """() => {
  const shown = (el) => el !== null && el.offsetParent !== null;
  const ids = (selector, empty) => [...document.querySelectorAll(selector)]
    .filter((el) => shown(el) && empty(el))
    .map((el) => el.id);
  return {
    cards: ids("#training-figures .figure", () => true),
    empty_charts: ids("#charts figure.chart", (el) => !(Number(el.dataset.points) > 0)),
    others: ["training-progress", "scaling-section"]
      .filter((id) => shown(document.getElementById(id))),
  };
}"""


def summaries_shown(page: Page, at_least: int = 1) -> None:
    """Wait until the page has shown the server's training summary `at_least` times."""
    wait_in_page(
        page,
        f"{at_least} training summaries shown",
        "(n) => Number(document.getElementById('training').dataset.summaries || 0) >= n",
        at_least,
    )


def shown_while_empty(page: Page) -> dict[str, Any]:
    """The cards, empty charts and empty parts the training section shows, once it has loaded."""
    summaries_shown(page)
    wait_in_page(
        page,
        "the charts drawn from the points loaded",
        "() => /training points?|resource samples?|no points yet/"
        ".test(document.getElementById('training-status').textContent)",
    )
    shown: dict[str, Any] = page.evaluate(EMPTY_THINGS_SHOWN)
    return shown
