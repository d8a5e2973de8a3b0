"""The page scripts apply the server's rules, not copies of their own: change a rule in the
server process and the page follows (jobs/page_rules.py → static/trainyard/rules.js).

The console runs in this test's own process (pytest-django's live server, no stack), so that
the test can change the rules where the server reads them. A script that went back to a copy
of its own keeps the old behaviour after the change, and the test fails."""

from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Browser, Page, expect

from jobs import consumers
from jobs.models import Job
from jobs.services import totals
from jobs.services.lifecycle import dispatch
from jobs.services.submission import check_job_request, submit_job
from tests.browser.conftest import logged_in_page
from tests.conftest import pytorch_request, set_quota
from workers import contract

pytestmark = [pytest.mark.browser, pytest.mark.usefixtures("catalog", "code_root")]


@pytest.fixture(autouse=True, scope="module")
def database_beside_playwright() -> Iterator[None]:
    """Playwright's sync API keeps an event loop running in this thread, which Django takes
    for async code; the database calls here (and the flush after each test) are plain
    synchronous ones. Module-scoped, so it outlasts that flush."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        yield


@pytest.fixture
def alices_page(browser: Browser, live_server: Any, alice: User) -> Iterator[Page]:
    set_quota(alice, cpu=32, gpus=4, memory_gb=256)
    with logged_in_page(browser, live_server.url, "alice", "alice-password") as page:
        yield page


@pytest.fixture
def new_job_page(alices_page: Page, live_server: Any) -> Page:
    alices_page.goto(f"{live_server.url}/jobs/new/")
    return alices_page


def three_instances(page: Page) -> None:
    page.select_option("select[name=package]", "cpu-1")
    page.fill("input[name=instances]", "3")


def test_the_new_job_form_follows_the_servers_tag_and_quota_rules(
    new_job_page: Page, live_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    page = new_job_page
    three_instances(page)
    expect(page.locator("#roles-preview")).to_have_text("Instances: [master] [worker-1] [worker-2]")
    expect(page.locator("#formula")).to_have_text(
        "CPU_total = master 1×1 + worker 1×2 = 3; GPU_total = master 0×1 + worker 0×2 = 0; "
        "Memory_total = master 2×1 + worker 2×2 = 6 GB"
    )
    expect(page.locator("#totals tbody tr")).to_have_count(4)  # three resources and jobs

    # The server changes its rules: instances are named role/index, master included, and
    # the formula names its sums otherwise (the page shows the preview's formula as it comes).
    monkeypatch.setattr(contract, "SOLO_ROLES", ("scheduler",))
    monkeypatch.setattr(contract, "TAG_FORMAT", "{role}/{index}")
    monkeypatch.setattr(
        totals, "FORMULA_NAMES", {"cpu": "CPU_sum", "gpus": "GPU_sum", "memory_gb": "Memory_sum"}
    )
    page.reload()
    three_instances(page)
    expect(page.locator("#roles-preview")).to_have_text(
        "Instances: [master/0] [worker/1] [worker/2]"
    )
    expect(page.locator("#formula")).to_have_text(
        "CPU_sum = master 1×1 + worker 1×2 = 3; GPU_sum = master 0×1 + worker 0×2 = 0; "
        "Memory_sum = master 2×1 + worker 2×2 = 6 GB"
    )


@pytest.fixture
def waiting_job(alice: User, redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Job:
    """A job that waits: no node registered and no Celery message sent, so it stays as it is."""
    monkeypatch.setattr(dispatch.app, "send_task", lambda *args, **kwargs: None)
    job = submit_job(alice, check_job_request(pytorch_request("waits", "digits-ddp", 2)))
    assert job.state not in Job.TERMINAL_STATES
    return job


def test_the_job_page_follows_the_servers_terminal_states(
    alices_page: Page, live_server: Any, waiting_job: Job, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = waiting_job
    page = alices_page
    page.goto(f"{live_server.url}/jobs/{job.pk}/")
    # The script has run (it fills the Instances table) and kept Cancel: the job can still end.
    expect(page.locator("#replicas tbody tr[data-tag=worker-1]")).to_have_count(1)
    expect(page.locator("#cancel-form")).to_have_count(1)
    expect(page.locator("#log")).to_have_attribute(
        "data-empty", "The log starts when the job runs."
    )

    # The server now counts the job's state as final, and as no longer waiting for room: the
    # page drops Cancel, as it does for a job that has ended (the template, by
    # Job.ACTIVE_STATES, still renders it), and no longer says that the log starts later.
    monkeypatch.setattr(Job, "TERMINAL_STATES", (*Job.TERMINAL_STATES, Job.State(job.state)))
    monkeypatch.setattr(Job, "WAITING_STATES", ())
    page.reload()
    expect(page.locator("#replicas tbody tr[data-tag=worker-1]")).to_have_count(1)
    expect(page.locator("#cancel-form")).to_have_count(0)
    expect(page.locator("#log")).to_have_attribute("data-empty", "No lines yet.")


def test_the_job_page_reads_the_websocket_close_codes_from_the_server(
    alices_page: Page, live_server: Any, waiting_job: Job, monkeypatch: pytest.MonkeyPatch
) -> None:
    # This live server speaks no websocket, so every attempt closes abnormally (1006) and the
    # page, knowing no such code, keeps reconnecting. Once the server says 1006 is its code
    # for a job that does not exist, the page says so: it reads the codes, it keeps none.
    page = alices_page
    page.goto(f"{live_server.url}/jobs/{waiting_job.pk}/")
    expect(page.locator("#log-status")).to_contain_text("reconnecting")
    monkeypatch.setattr(consumers, "CLOSE_NOT_FOUND", 1006)
    page.reload()
    expect(page.locator("#log-status")).to_contain_text("no such job")
