"""Signing in through the organisation's directory in a real browser: the login page takes the
directory password of a person the console has never seen, and their profile page shows how
they sign in, their groups and their Unix identity (a real slapd: tests/unit/test_directory)."""

from typing import Any

import pytest
from playwright.sync_api import Browser, expect

from tests.browser.conftest import keep_screenshot, logged_in_page
from tests.browser.test_page_rules import database_beside_playwright  # noqa: F401 (autouse)
from tests.unit.test_directory import PEOPLE, directory, signs_in_through  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.usefixtures("signs_in_through", "redis_url")
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
        expect(page.locator("#runs-as")).to_contain_text("run as ada")
        keep_screenshot(page, "profile-directory-identity")
