"""Cancelling, from its page, a job that waits for room: it never starts anywhere, and the job
that holds the room goes on to succeed."""

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Dialog, expect

from tests.browser.conftest import user_page
from tests.browser.training_page import shown_while_empty
from tests.conftest import TERMINAL, RunningStack, StackClient, pytorch_request, signal_file

pytestmark = [pytest.mark.browser, pytest.mark.integration]

USER, PASSWORD = "cass", "cass-password-1"
# Her own quota, so that what she may still run depends on no other test's jobs.
QUOTA = {"cpu": 16, "gpus": 0, "memory_gb": 64, "running_jobs": 4}


@pytest.fixture
def cass(stack: RunningStack) -> Iterator[StackClient]:
    client = stack.create_user(USER, PASSWORD, quota=QUOTA)
    yield client
    # Nothing of hers outlives the test, whatever it left running or waiting.
    for job in client.http.get("/api/v1/jobs").json()["jobs"]:
        if job["state"] not in TERMINAL:
            client.http.post(f"/api/v1/jobs/{job['id']}/cancel")
        client.wait_finished(job["id"])


def never_started(job: dict[str, Any]) -> bool:
    return job["started"] is None and all(
        r["node"] is None and r["exit_code"] is None for r in job["replicas"]
    )


def test_a_queued_job_cancelled_from_its_page_never_starts(
    browser: Browser, stack: RunningStack, cass: StackClient, tmp_path: Path
) -> None:
    release = signal_file()
    try:
        # 2 x 2 cores held open on nodes of 4 and 4: 4 cores are left at most, and the second
        # job needs 3 x 2 at once (all of its instances or none), so it waits.
        holder = cass.submit(
            pytorch_request(
                "holder", "hold.py", 2, package="cpu-2", args=["--release", str(release)]
            )
        )
        cass.wait(holder["id"], lambda j: j["state"] == "running")
        waiting = cass.submit(
            pytorch_request(
                "waits", "hold.py", 3, package="cpu-2", args=["--release", str(release)]
            )
        )
        job = cass.wait(waiting["id"], lambda j: j["reason"].startswith("waiting:"))
        assert job["state"] == "queued"
        assert never_started(job)

        with user_page(browser, stack, USER, PASSWORD) as page:
            dialogs: list[str] = []

            def record(dialog: Dialog) -> None:
                dialogs.append(dialog.message)
                dialog.dismiss()

            page.on("dialog", record)
            page.goto(f"{stack.url}/jobs/{waiting['id']}/")
            expect(page.locator("#job-state")).to_have_text("queued")
            # (What it waits for names the other jobs' ends, which may change meanwhile.)
            expect(page.locator("#job-reason")).to_have_text(re.compile(r"^waiting: "))
            # Nothing to show yet: no empty figure card, chart or bar takes room.
            assert shown_while_empty(page) == {"cards": [], "empty_charts": [], "others": []}
            page.click("#cancel")
            # The page asks, not a dialog; nothing is sent until the answer.
            expect(page.locator("#cancel-confirm")).to_be_visible()
            expect(page.locator("#cancel-form")).to_contain_text(
                f"Stop every instance of job #{waiting['id']}?"
            )
            assert cass.job(waiting["id"])["state"] == "queued"
            page.click("#cancel-confirm")
            # The form posts and comes back to the page, which says so.
            page.wait_for_url(f"{stack.url}/jobs/{waiting['id']}/")
            expect(page.locator("#job-state")).to_have_text("cancelled")
            expect(page.locator("#job-reason")).to_have_text(f"cancelled by {USER}")
            expect(page.locator("#cancel")).to_have_count(0)
            expect(page.locator("#queue-position")).to_be_hidden()
            expect(page.locator("#log-status")).to_contain_text("log complete")
            expect(page.locator("#log .line")).to_have_count(0)
            assert dialogs == []

        job = cass.wait_finished(waiting["id"])
        assert job["state"] == "cancelled"
        assert job["reason"] == f"cancelled by {USER}"
        assert never_started(job)
        assert {r["state"] for r in job["replicas"]} == {"stopped"}
        assert len(job["replicas"]) == 3
        assert cass.logs(waiting["id"]) == []

        release.touch()
        done = cass.wait_finished(holder["id"])
        assert done["state"] == "succeeded", done["reason"]
        # The room it freed went to no cancelled job.
        assert never_started(cass.job(waiting["id"]))
        assert cass.job(waiting["id"])["state"] == "cancelled"
    finally:
        release.touch()
