"""Security headers on every response, pages that work under the Content-Security-Policy, and
the TLS settings that TRAINYARD_HTTPS turns on."""

import importlib.util
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from jobs.services.submission import check_job_request, submit_job
from tests.unit.helpers import job_request

SETTINGS_FILE = Path(__file__).resolve().parents[2] / "console" / "settings.py"

EXPECTED = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cross-Origin-Opener-Policy": "same-origin",
}


def assert_secure_headers(response: Any) -> None:
    for header, value in EXPECTED.items():
        assert response.get(header) == value, f"{header} on {response}"
    policy = response["Content-Security-Policy"]
    for directive in (
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "connect-src 'self'",
        "object-src 'none'",
        "frame-ancestors 'none'",
    ):
        assert directive in policy.split("; ")
    assert "unsafe" not in policy


@pytest.mark.django_db
@pytest.mark.parametrize(
    "path",
    [
        "/accounts/login/",  # a page
        "/",  # a redirect to log in
        "/api/v1/jobs",  # an API answer (401)
        "/healthz",
        "/static/trainyard/trainyard.css",  # served by WhiteNoise
        "/no/such/page/",  # 404
        "/admin/login/",
    ],
)
def test_every_response_carries_the_security_headers(client: Client, path: str) -> None:
    assert_secure_headers(client.get(path))


INLINE = [
    # A script with code in it; json_script blocks (type="application/json") are data.
    (re.compile(r"<script(?![^>]*\bsrc=)(?![^>]*application/json)[^>]*>"), "inline <script>"),
    (re.compile(r"<style\b"), "<style> block"),
    (re.compile(r"\sstyle=", re.IGNORECASE), "style= attribute"),
    (re.compile(r"\son[a-z]+=", re.IGNORECASE), "on…= handler"),
    (re.compile(r"javascript:", re.IGNORECASE), "javascript: URL"),
]


@pytest.mark.django_db
@pytest.mark.usefixtures("catalog", "code_root", "nodes", "redis_url", "sent_tasks")
def test_the_pages_hold_nothing_the_policy_would_block(client: Client, alice: User) -> None:
    job = submit_job(alice, check_job_request(job_request()))
    client.force_login(alice)
    for path in ["/", "/jobs/new/", f"/jobs/{job.pk}/", "/nodes/", "/quotas/"]:
        response = client.get(path)
        assert response.status_code == 200, path
        assert_secure_headers(response)
        html = response.content.decode()
        for pattern, what in INLINE:
            assert not pattern.search(html), f"{what} in {path}: CSP would block it"
    client.logout()
    html = client.get("/accounts/login/").content.decode()
    assert not any(pattern.search(html) for pattern, _ in INLINE)


@pytest.mark.django_db
def test_a_page_may_not_be_framed(client: Client) -> None:
    response = client.get("/accounts/login/")
    assert response["X-Frame-Options"] == "DENY"
    assert "frame-ancestors 'none'" in response["Content-Security-Policy"]


# --- TLS settings ---------------------------------------------------------------------------


def fresh_settings(monkeypatch: pytest.MonkeyPatch, **env: str) -> ModuleType:
    """console/settings.py executed anew, under another module name, with `env` set."""
    monkeypatch.setenv("DJANGO_SECRET_KEY", "a-key-for-this-test-only")
    for name in ("TRAINYARD_HTTPS", "TRAINYARD_HSTS_SECONDS"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    spec = importlib.util.spec_from_file_location("settings_under_test", SETTINGS_FILE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tls_is_off_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    s = fresh_settings(monkeypatch)
    assert (s.SECURE_SSL_REDIRECT, s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE) == (
        False,
        False,
        False,
    )
    assert s.SECURE_HSTS_SECONDS == 0
    assert s.SECURE_PROXY_SSL_HEADER is None


def test_trainyard_https_turns_the_tls_settings_on(monkeypatch: pytest.MonkeyPatch) -> None:
    s = fresh_settings(monkeypatch, TRAINYARD_HTTPS="1")
    assert (s.SECURE_SSL_REDIRECT, s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE) == (
        True,
        True,
        True,
    )
    assert s.SECURE_HSTS_SECONDS == 365 * 24 * 3600
    assert s.SECURE_PROXY_SSL_HEADER == ("HTTP_X_FORWARDED_PROTO", "https")


def test_hsts_seconds_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    s = fresh_settings(monkeypatch, TRAINYARD_HTTPS="yes", TRAINYARD_HSTS_SECONDS="3600")
    assert s.SECURE_HSTS_SECONDS == 3600
    # Without TLS no HSTS, whatever the number: browsers would ignore it over plain HTTP.
    assert fresh_settings(monkeypatch, TRAINYARD_HSTS_SECONDS="3600").SECURE_HSTS_SECONDS == 0


def test_a_malformed_https_setting_fails_loudly(monkeypatch: pytest.MonkeyPatch) -> None:
    from console.env import ImproperlyConfiguredEnv

    with pytest.raises(ImproperlyConfiguredEnv, match="TRAINYARD_HTTPS"):
        fresh_settings(monkeypatch, TRAINYARD_HTTPS="sometimes")


@pytest.fixture
def https_on(settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The running settings as TRAINYARD_HTTPS=1 makes them."""
    s = fresh_settings(monkeypatch, TRAINYARD_HTTPS="1")
    for name in (
        "SECURE_SSL_REDIRECT",
        "SESSION_COOKIE_SECURE",
        "CSRF_COOKIE_SECURE",
        "SECURE_HSTS_SECONDS",
        "SECURE_PROXY_SSL_HEADER",
        "SECURE_REDIRECT_EXEMPT",
    ):
        setattr(settings, name, getattr(s, name))


@pytest.mark.django_db
@pytest.mark.usefixtures("https_on")
def test_with_tls_plain_http_is_redirected_and_https_gets_hsts(client: Client) -> None:
    response = client.get("/accounts/login/")
    assert (response.status_code, response["Location"]) == (
        301,
        "https://testserver/accounts/login/",
    )
    # What the proxy sends on after it took TLS:
    response = client.get("/accounts/login/", headers={"X-Forwarded-Proto": "https"})
    assert response.status_code == 200
    assert response["Strict-Transport-Security"] == "max-age=31536000"
    assert_secure_headers(response)
    assert "Secure" in str(response.cookies["csrftoken"])


@pytest.mark.django_db
@pytest.mark.usefixtures("https_on")
def test_with_tls_health_probes_over_plain_http_still_get_an_answer(client: Client) -> None:
    assert client.get("/healthz").status_code in (200, 503)
