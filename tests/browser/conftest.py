"""Debian's Chromium driven by Playwright (no browser download; `make test` installs it)."""

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from tests.browser import page_watch
from tests.conftest import RunningStack, wait_until

CHROMIUM = Path("/usr/bin/chromium")
# Without these, Chromium keeps dialling Google's hosts on this closed network.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


# Hang guards, not measurements: how long a page may take to show what the test waits for.
HANG_GUARD_MS = 120_000
expect.set_options(timeout=HANG_GUARD_MS)


@pytest.fixture(scope="package")
def browser(request: pytest.FixtureRequest) -> Iterator[Browser]:
    """One Chromium for the browser tests, stopped when they are done: Playwright's sync API
    keeps an event loop running in the main thread while it lives, and Django refuses
    database calls from a thread with a running loop (the unit tests that follow). For the
    same reason the test database is made before it starts: a pytest process whose first
    database test is a browser test (test_page_rules) would otherwise make it under the loop."""
    request.getfixturevalue("django_db_setup")
    if not CHROMIUM.exists():
        pytest.fail("Chromium is missing at /usr/bin/chromium: run `make test`, which installs it")
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
        )
        yield browser
        browser.close()


# The session cookies of each login a test run has made, by (console, user, password). The
# first page of a user logs in through the form; later ones start with that session, as a
# person's second tab would, instead of paying for the password hash again (a second of the
# web server's CPU per login). Cookies only: what a page keeps in localStorage is its own.
_SESSIONS: dict[tuple[str, str, str], list[Any]] = {}


@contextmanager
def logged_in_page(browser: Browser, url: str, username: str, password: str) -> Iterator[Page]:
    """A fresh browser context logged in to the console at `url` as that user."""
    known = _SESSIONS.get((url, username, password))
    context = browser.new_context(
        viewport={"width": 1280, "height": 900},
        storage_state={"cookies": known, "origins": []} if known else None,
    )
    watch = page_watch.PageWatch(context)
    page_watch.current.append(watch)
    page = context.new_page()
    page.set_default_timeout(HANG_GUARD_MS)
    if known:
        page.goto(f"{url}/")
    if page.url != f"{url}/":  # no session yet, or the console has ended it
        page.goto(f"{url}/accounts/login/")
        page.fill("#id_username", username)
        page.fill("#id_password", password)
        page.click("button[type=submit]")
        page.wait_for_url(f"{url}/")
        _SESSIONS[(url, username, password)] = context.cookies()
    try:
        yield page
    except BaseException:
        watch.note_pages()  # before the context closes
        raise
    finally:
        context.close()


def user_page(
    browser: Browser, stack: RunningStack, username: str, password: str
) -> AbstractContextManager[Page]:
    """A fresh browser context logged in to `stack` as that user."""
    return logged_in_page(browser, stack.url, username, password)


def admin_page(browser: Browser, stack: RunningStack) -> AbstractContextManager[Page]:
    """A fresh browser context logged in to `stack` as its admin."""
    return user_page(browser, stack, "admin", stack.admin_password)


def wait_in_page(page: Page, what: str, predicate: str, arg: Any = None) -> None:
    """Poll the JavaScript `predicate` in the page until it is true. (Playwright's
    wait_for_function runs its predicate through eval, which the console's
    Content-Security-Policy forbids, as it should; evaluate is not affected.)"""
    wait_until(what, lambda: page.evaluate(predicate, arg))


@pytest.fixture(autouse=True)
def _forget_earlier_pages() -> None:
    page_watch.current.clear()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.failed and page_watch.current:
        for n, watch in enumerate(page_watch.current, 1):
            watch.note_pages()  # a fixture's page is still open here
            report.sections.append((f"browser context {n}", watch.report()))
    return report


@pytest.fixture
def page(browser: Browser, stack: RunningStack) -> Iterator[Page]:
    with admin_page(browser, stack) as page:
        yield page


# Every run keeps the pages it looked at here (var/ is not tracked); docs/images/ holds the
# copies the user guide shows, refreshed from these.
SCREENSHOTS = Path(__file__).resolve().parents[2] / "var" / "screenshots"


def keep_screenshot(page: Page, name: str) -> Path:
    """Save the whole page as var/screenshots/NAME.png and return the path."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path
