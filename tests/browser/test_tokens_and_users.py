"""A user makes an API token in the browser, uses it, and revokes it; an admin adds a user with
a quota of their own on the Users page, and that user logs in and launches a job."""

import re

import httpx
import pytest
from playwright.sync_api import Browser, expect

from tests.browser.conftest import admin_page, keep_screenshot, user_page
from tests.conftest import RunningStack

pytestmark = [pytest.mark.browser, pytest.mark.integration]


def jobs_status(stack: RunningStack, key: str) -> int:
    headers = {"Authorization": f"Token {key}"}
    return httpx.get(f"{stack.url}/api/v1/jobs", headers=headers, timeout=30).status_code


def test_a_user_makes_a_token_uses_it_and_revokes_it(browser: Browser, stack: RunningStack) -> None:
    stack.create_user("tomas", "tomas-password-1")
    with user_page(browser, stack, "tomas", "tomas-password-1") as page:
        page.context.grant_permissions(["clipboard-read", "clipboard-write"])
        page.get_by_role("link", name="API tokens", exact=True).click()
        expect(page.locator("h1")).to_have_text("API tokens")
        page.fill("#id_name", "laptop")
        page.click("#create-token")
        key = page.locator("#token-key").input_value()
        assert len(key) > 30
        row = page.locator("#tokens tr[data-name=laptop]")
        expect(row.locator(".token-prefix")).to_have_text(f"{key[:8]}…")
        expect(row.locator(".last-used")).to_have_text("never")
        expect(page.locator("#new-key pre.command").first).to_have_text(
            f"trainyard login {stack.url}"
        )
        page.click("#new-key button[data-copy]")
        expect(page.locator("#new-key button[data-copy]")).to_have_text("Copied")
        assert page.evaluate("navigator.clipboard.readText()") == key
        keep_screenshot(page, "tokens")

        assert jobs_status(stack, key) == 200
        page.goto(f"{stack.url}/account/tokens/")  # a GET: the key is not shown again
        expect(page.locator("#token-key")).to_have_count(0)
        assert key not in page.content()
        expect(row.locator(".last-used")).to_have_text(re.compile(r" ago$"))

        row.locator("button.revoke").click()
        expect(page.locator(".flash")).to_contain_text("Revoked token laptop")
        expect(row).to_have_count(0)
        assert jobs_status(stack, key) == 401


def test_an_admin_adds_a_user_who_then_launches_a_job(
    browser: Browser, stack: RunningStack
) -> None:
    with admin_page(browser, stack) as page:
        page.get_by_role("link", name="Users", exact=True).click()
        expect(page.locator("h1")).to_have_text("Users")
        page.fill("#id_username", "nadia")
        page.fill("#id_password", "nadia-password-1")
        page.fill("#id_email", "nadia@example.com")
        page.fill("#id_new_group", "speech")
        page.check("#id_own_quota")
        page.fill("#id_cpu", "2")
        page.fill("#id_gpus", "0")
        page.fill("#id_memory_gb", "8")
        page.fill("#id_running_jobs", "1")
        page.click("#add-user-button")
        expect(page.locator(".flash")).to_have_text("Added nadia.")
        row = page.locator("#users tr[data-user=nadia]")
        expect(row.locator(".quota-kind")).to_have_text("own")
        expect(row.locator(".groups")).to_have_text("speech")
        expect(row.locator("td[data-resource=cpu]")).to_have_text("0 / 2")
        expect(page.locator("#groups tr[data-group=speech]")).to_have_count(1)
        keep_screenshot(page, "users")

    with user_page(browser, stack, "nadia", "nadia-password-1") as page:
        page.click("text=New job")
        page.fill("#id_name", "nadia's first job")
        # Named, not left to the default (the first PyTorch image by name): tests beside
        # this one add images to the shared stack.
        page.select_option("#id_image", "pytorch:2.13-cpu")
        page.select_option("#id_script", "__path__")
        page.fill("#id_script_path", "markup.py")
        page.select_option("#id_package", "cpu-1")
        page.fill("#id_instances", "1")
        # Her own quota, not the default, is what the form counts against.
        expect(page.locator("#totals tr[data-resource=cpu] .left")).to_have_text("2")
        page.click("#launch")
        page.wait_for_url(re.compile(r"/jobs/\d+/$"))
        expect(page.locator("#job-state")).to_have_text(
            re.compile(r"^(pending|queued|running|succeeded)$")
        )
        job_id = int(page.url.rstrip("/").rsplit("/", 1)[1])

    job = stack.admin.job(job_id)
    assert job["owner"] == "nadia" and job["name"] == "nadia's first job"
