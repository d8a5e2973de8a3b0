"""Signing in through the organisation's directory in a real browser: the login page takes the
directory password of a person the console has never seen, and their profile page shows how
they sign in, their groups and their Unix identity (a real slapd: tests/unit/test_directory);
a job of theirs says it runs as them, with the folders it named."""

from typing import Any

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Browser, expect

from jobs.services.submission import check_job_request, submit_job
from tests.browser.conftest import keep_screenshot, logged_in_page
from tests.browser.test_page_rules import database_beside_playwright  # noqa: F401 (autouse)
from tests.unit.helpers import job_request
from tests.unit.test_directory import PEOPLE, directory, signs_in_through  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.usefixtures("signs_in_through", "redis_url", "catalog", "nodes", "code_root")
def test_a_person_signs_in_through_the_directory_and_sees_their_unix_identity(
    browser: Browser, live_server: Any
) -> None:
    with logged_in_page(browser, live_server.url, "ada", "ada-directory-pw") as page:
        page.click("nav >> text=Profile")
        expect(page.locator("h1")).to_have_text("Ada Tester")
        expect(page.locator("#signs-in")).to_contain_text(
            f"through the organisation's directory, as uid=ada,{PEOPLE}"
        )
        expect(page.locator("#groups")).to_have_text("trainyard-users vision")
        expect(page.locator("#unix-identity")).to_have_text(
            "ada · uid 20001 · gid 20001 · groups 30000, 30001 (from the directory)"
        )
        expect(page.locator("#runs-as")).to_contain_text("Your jobs run as ada (uid 20001")
        keep_screenshot(page, "profile-directory-identity")
        # A job of hers says whom it runs as, and the folders it named.
        ada = User.objects.get(username="ada")
        request = job_request(1, data=["/shared/datasets/vision"], results="/shared/results/ada")
        job = submit_job(ada, check_job_request(request))
        page.goto(f"{live_server.url}/jobs/{job.pk}/")
        expect(page.locator("#runs-as")).to_have_text(
            "Runs as uid 20001, gid 20001, groups 20001,30000,30001: the owner's Unix identity"
        )
        expect(page.locator("#data-folders")).to_have_text(
            "Data /shared/datasets/vision, read-only"
        )
        expect(page.locator("#results-folder")).to_have_text("Results /shared/results/ada")
        keep_screenshot(page, "job-runs-as-its-owner")
