"""Every page names an icon, and a browser asking for /favicon.ico gets one, not a 404."""

import pytest
from django.contrib.auth.models import User
from django.test import Client


def test_it_redirects_favicon_ico_to_the_svg_icon(client: Client) -> None:
    r = client.get("/favicon.ico")
    assert r.status_code == 301 and r["Location"] == "/static/trainyard/favicon.svg"
    icon = client.get(r["Location"])
    assert icon.status_code == 200 and icon["Content-Type"].startswith("image/svg+xml")
    assert b"<svg" in b"".join(icon.streaming_content)  # type: ignore[attr-defined]


@pytest.mark.parametrize("path", ["/accounts/login/", "/"])
def test_every_page_links_the_icon(client: Client, alice: User, path: str) -> None:
    if path != "/accounts/login/":
        client.force_login(alice)
    page = client.get(path).content.decode()
    assert '<link rel="icon" type="image/svg+xml" href="/static/trainyard/favicon.svg">' in page
