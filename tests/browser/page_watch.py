"""What a browser context did, for the report of a browser test that failed.

A page whose scripts never ran looks, in an assertion's message, like a page whose scripts
rendered nothing: the two differ in whether a script's request never finished, failed, or
ran and threw. Every context `logged_in_page` opens is watched; a failing test's report gets
a section with the requests still open when it failed, the ones that failed, and what the
page's scripts threw or logged as errors.
"""

import time
from dataclasses import dataclass, field

from playwright.sync_api import BrowserContext, ConsoleMessage, Error, Page, Request


@dataclass
class PageWatch:
    context: BrowserContext
    started: float = field(default_factory=time.monotonic)
    open_requests: dict[Request, float] = field(default_factory=dict)
    failed_requests: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    console_errors: list[str] = field(default_factory=list)
    pages_at_the_end: list[str] = field(default_factory=list)
    # When the test failed inside the context: what came after (closing it aborts whatever
    # was still open) is not what the test saw.
    failed_at: float | None = None

    def at(self) -> str:
        return f"{time.monotonic() - self.started:7.2f} s"

    def __post_init__(self) -> None:
        context = self.context
        context.on("request", self._requested)
        context.on("requestfinished", self._finished)
        context.on("requestfailed", self._failed)
        context.on("page", self._watch_page)

    def _watch_page(self, page: Page) -> None:
        page.on("pageerror", self._page_error)
        page.on("console", self._console)

    def _requested(self, request: Request) -> None:
        if self.failed_at is None:
            self.open_requests[request] = time.monotonic()

    def _finished(self, request: Request) -> None:
        if self.failed_at is None:
            self.open_requests.pop(request, None)

    def _failed(self, request: Request) -> None:
        if self.failed_at is not None:
            return
        self.open_requests.pop(request, None)
        failure = f"{request.method} {request.url}: {request.failure}"
        self.failed_requests.append(f"{self.at()} {failure}")

    def _page_error(self, error: Error) -> None:
        if self.failed_at is not None:
            return
        self.page_errors.append(f"{self.at()} {error.name}: {error.message}\n{error.stack or ''}")

    def _console(self, message: ConsoleMessage) -> None:
        if message.type == "error" and self.failed_at is None:
            self.console_errors.append(f"{self.at()} {message.text} ({message.location})")

    def note_pages(self) -> None:
        """Where each page was, and the errors it showed, when the test failed (called before
        the context closes: the report is written after), and the watch stops there."""
        if self.failed_at is not None:
            return
        self.failed_at = time.monotonic()
        for page in self.context.pages:
            try:
                # Empty ones are the page's places for an alert, none shown.
                shown = [t for t in page.locator(SHOWN_ERRORS).all_inner_texts() if t.strip()]
                self.pages_at_the_end.append(f"{page.url} showing {shown or 'no error'}")
            except Error as exc:
                self.pages_at_the_end.append(f"{page.url} (not readable: {exc.message})")

    def report(self) -> str:
        now = self.failed_at or time.monotonic()
        lines = [f"page at the end: {line}" for line in self.pages_at_the_end]
        lines += [
            f"open for {now - since:.1f} s: {request.method} {request.url} "
            f"({request.resource_type})"
            for request, since in self.open_requests.items()
            # A page's websocket upgrade and its long polls are open by design.
            if request.resource_type not in {"websocket", "eventsource"}
        ]
        lines += [f"failed: {line}" for line in self.failed_requests]
        lines += [f"page error: {line}" for line in self.page_errors]
        lines += [f"console error: {line}" for line in self.console_errors]
        return "\n".join(lines) or "every request finished; no script error"


# What forms and pages show when something was refused.
SHOWN_ERRORS = ".errorlist, .errornote, .error, [role=alert]"

# The contexts of the test running now (one pytest process runs one test at a time).
current: list[PageWatch] = []
