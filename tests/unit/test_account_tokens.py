"""The API tokens page: a user makes named tokens, sees each key once, sees when each was last
used, and revokes their own; `manage.py token` names its tokens too; the admin lists tokens
without their digests."""

import io
import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from jobs.models import ApiToken
from jobs.services import tokens
from jobs.tokens import _record_use, user_for_token

pytestmark = pytest.mark.usefixtures("catalog", "redis_url")

PAGE = "/account/tokens/"


def create(client: Client, name: str) -> str:
    """The key the page shows after creating a token named `name`."""
    r = client.post(PAGE, {"name": name})
    assert r.status_code == 200
    match = re.search(r'id="token-key"[^>]*value="([^"]+)"', r.content.decode())
    assert match, "the page shows no new key"
    return match.group(1)


def api_jobs(client: Client, key: str) -> int:
    return client.get("/api/v1/jobs", HTTP_AUTHORIZATION=f"Token {key}").status_code


def test_it_sends_anonymous_users_to_log_in(client: Client) -> None:
    r = client.get(PAGE)
    assert r.status_code == 302 and r["Location"].startswith("/accounts/login/")


def test_it_creates_a_token_and_shows_its_key_once(client: Client, alice: User) -> None:
    client.force_login(alice)
    key = create(client, "laptop")
    token = ApiToken.objects.get()
    assert (token.user, token.name, token.prefix) == (alice, "laptop", key[:8])
    assert token.digest == ApiToken.hash(key) and key not in token.digest
    again = client.get(PAGE).content.decode()
    assert key not in again  # stored hashed: never shown again
    assert f"{key[:8]}…" in again and "laptop" in again


def test_it_shows_how_to_use_the_new_key(client: Client, alice: User) -> None:
    client.force_login(alice)
    html = client.post(PAGE, {"name": "laptop"}).content.decode()
    assert "trainyard login http://testserver" in html
    assert 'data-copy="token-key"' in html


def test_it_needs_a_name(client: Client, alice: User) -> None:
    client.force_login(alice)
    r = client.post(PAGE, {"name": "  "})
    assert r.status_code == 200
    assert "This field is required." in r.content.decode()
    assert 'id="token-key"' not in r.content.decode()
    assert ApiToken.objects.count() == 0


def test_it_refuses_a_name_too_long(client: Client, alice: User) -> None:
    client.force_login(alice)
    r = client.post(PAGE, {"name": "x" * 101})
    assert "at most 100 characters" in r.content.decode()
    assert ApiToken.objects.count() == 0


def test_it_lists_only_the_users_own_tokens(client: Client, alice: User, bob: User) -> None:
    tokens.issue(alice, "laptop")
    bobs = tokens.issue(bob, "bobs-cluster")
    client.force_login(alice)
    html = client.get(PAGE).content.decode()
    assert "laptop" in html and "never" in html
    assert "bobs-cluster" not in html and bobs.token.prefix not in html


def test_a_key_works_and_records_when_it_was_used(client: Client, alice: User) -> None:
    client.force_login(alice)
    key = create(client, "laptop")
    assert ApiToken.objects.get().last_used is None
    before = timezone.now()
    assert api_jobs(Client(), key) == 200
    last_used = ApiToken.objects.get().last_used
    assert last_used is not None and last_used >= before
    html = client.get(PAGE).content.decode()
    assert re.search(r'class="last-used" title="[^"]+">[^<]+ ago<', html)


def test_it_writes_last_used_at_most_once_a_minute(alice: User) -> None:
    issued = tokens.issue(alice, "busy script")
    assert user_for_token(issued.key) == alice
    first = ApiToken.objects.get().last_used
    assert first is not None
    with CaptureQueriesContext(connection) as queries:
        for _ in range(5):
            assert user_for_token(issued.key) == alice
    assert not [q for q in queries.captured_queries if q["sql"].startswith("UPDATE")]
    assert ApiToken.objects.get().last_used == first
    # A minute later, the next use writes again.
    ApiToken.objects.update(last_used=first - timedelta(seconds=61))
    assert user_for_token(issued.key) == alice
    refreshed = ApiToken.objects.get().last_used
    assert refreshed is not None and refreshed > first


def test_a_stale_read_does_not_write_over_a_recent_use(alice: User) -> None:
    """Two requests read the row before either writes: the UPDATE's own condition keeps the
    second from writing."""
    issued = tokens.issue(alice, "racing")
    recent = timezone.now() - timedelta(seconds=10)
    stale = ApiToken.objects.get()  # read while last_used was still empty
    ApiToken.objects.update(last_used=recent)  # the other request's write
    _record_use(stale)
    assert ApiToken.objects.get().last_used == recent
    assert issued.token.pk == stale.pk


def test_it_revokes_a_token_and_the_key_stops_working(client: Client, alice: User) -> None:
    client.force_login(alice)
    key = create(client, "laptop")
    assert api_jobs(Client(), key) == 200
    token = ApiToken.objects.get()
    r = client.post(f"/account/tokens/{token.pk}/revoke/")
    assert r.status_code == 302 and r["Location"] == PAGE
    assert ApiToken.objects.count() == 0
    assert api_jobs(Client(), key) == 401
    assert "Revoked token laptop" in client.get(PAGE).content.decode()


def test_it_does_not_revoke_someone_elses_token(client: Client, alice: User, bob: User) -> None:
    bobs = tokens.issue(bob, "bobs-laptop")
    client.force_login(alice)
    r = client.post(f"/account/tokens/{bobs.token.pk}/revoke/")
    assert r.status_code == 404
    assert ApiToken.objects.filter(pk=bobs.token.pk).exists()
    assert api_jobs(Client(), bobs.key) == 200


def test_revoking_needs_a_post_with_the_csrf_token(alice: User) -> None:
    issued = tokens.issue(alice, "laptop")
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    url = f"/account/tokens/{issued.token.pk}/revoke/"
    assert client.get(url).status_code == 405
    assert client.post(url).status_code == 403
    assert ApiToken.objects.filter(pk=issued.token.pk).exists()


def test_the_page_has_no_inline_script(client: Client, alice: User) -> None:
    client.force_login(alice)
    html = client.post(PAGE, {"name": "laptop"}).content.decode()
    scripts = re.findall(r"<script[^>]*>", html)
    assert scripts and all("src=" in s or "application/json" in s for s in scripts)
    assert " onclick=" not in html and "<style" not in html


def test_the_header_links_to_the_tokens_page(client: Client, alice: User) -> None:
    client.force_login(alice)
    assert f'href="{PAGE}"' in client.get("/").content.decode()


def test_the_token_command_prints_a_named_key(alice: User) -> None:
    out = io.StringIO()
    call_command("token", "alice", stdout=out)
    key = out.getvalue().strip()
    assert user_for_token(key) == alice
    assert ApiToken.objects.get().name == "manage.py"
    out = io.StringIO()
    call_command("token", "alice", "--name", "ci", stdout=out)
    assert ApiToken.objects.get(digest=ApiToken.hash(out.getvalue().strip())).name == "ci"


def test_the_admin_lists_tokens_without_their_digests(
    client: Client, alice: User, charlie_admin: User
) -> None:
    issued = tokens.issue(alice, "laptop")
    client.force_login(charlie_admin)
    listing = client.get("/admin/jobs/apitoken/").content.decode()
    assert "laptop" in listing and f"{issued.token.prefix}…" in listing
    change = client.get(f"/admin/jobs/apitoken/{issued.token.pk}/change/")
    assert change.status_code == 200
    html = change.content.decode()
    assert issued.token.digest not in listing + html and 'name="digest"' not in html
    assert client.get("/admin/jobs/apitoken/add/").status_code == 403
    assert "Trainyard administration" in client.get("/admin/").content.decode()
