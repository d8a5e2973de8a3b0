"""Single sign-on in a real browser: the console's login page sends a person to the
organisation's OpenID Connect provider (a real one, stack/oidc_provider.py), they sign in
there, come back signed in, and their profile shows where they signed in and the Unix identity
the provider gave them."""

from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import Browser, expect

from stack import oidc_provider
from tests.browser.conftest import keep_screenshot
from tests.browser.test_page_rules import database_beside_playwright  # noqa: F401 (autouse)
from tests.unit.test_single_sign_on import PEOPLE, console_settings

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def provider(
    live_server: Any, settings: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[oidc_provider.Provider]:
    callback = f"{live_server.url}/oidc/callback/"
    with oidc_provider.private_provider(tmp_path_factory.mktemp("oidc"), PEOPLE, callback) as p:
        for name, value in console_settings(p).items():
            setattr(settings, name, value)
        settings.TRAINYARD_OIDC_CLIENT_ID = p.client_id
        settings.AUTHENTICATION_BACKENDS = [
            "jobs.login_throttle.ThrottledModelBackend",
            "jobs.single_sign_on.SingleSignOnBackend",
        ]
        yield p


@pytest.mark.usefixtures("redis_url")
def test_a_person_signs_in_through_the_organisations_provider(
    browser: Browser, live_server: Any, provider: oidc_provider.Provider
) -> None:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    try:
        page.goto(f"{live_server.url}/accounts/login/")
        button = page.locator("#single-sign-on a")
        expect(button).to_have_text("Sign in with Example SSO")
        keep_screenshot(page, "login-single-sign-on")
        button.click()
        page.wait_for_url(f"{provider.url.rsplit('/o', 1)[0]}/login/**")
        expect(page.locator("h1")).to_have_text("Example organisation")
        page.fill("input[name=username]", "ada")
        page.fill("input[name=password]", "ada-sso-pw")
        page.click("button[type=submit]")
        page.wait_for_url(f"{live_server.url}/")
        page.click("nav >> text=Profile")
        expect(page.locator("h1")).to_have_text("Ada Tester")
        expect(page.locator("#signs-in")).to_contain_text(
            "through the organisation's single sign-on"
        )
        expect(page.locator("#groups")).to_have_text("trainyard-users vision")
        expect(page.locator("#unix-identity")).to_have_text(
            "ada · uid 20001 · gid 20001 · groups 30000, 30001 (from the single sign-on)"
        )
        keep_screenshot(page, "profile-single-sign-on")
    finally:
        context.close()
