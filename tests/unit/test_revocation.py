"""Revocation that bites: a job stream opened with a token, or a browser session, closes with
4401 and the reason as soon as what opened it stops holding (the token revoked, the user
deactivated, the password changed), through the real ASGI stack and Redis channel layer; and
the password pages revoke the user's API tokens unless they keep them."""

import asyncio
import json
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings as django_settings
from django.contrib.auth.models import User
from django.test import Client

from console.asgi import application
from jobs.models import ApiToken, Job
from jobs.services import revocation, tokens, users
from jobs.services.submission import check_job_request, submit_job
from tests.unit.helpers import job_request

pytestmark = [
    pytest.mark.usefixtures("catalog", "code_root", "nodes", "redis_url", "sent_tasks"),
    pytest.mark.django_db(transaction=True),
]

PASSWORD = "an-old-long-password-1"
NEW_PASSWORD = "a-new-long-password-2"


@pytest.fixture
def job(alice: User) -> Job:
    alice.set_password(PASSWORD)
    alice.save()
    return submit_job(alice, check_job_request(job_request(instances=1)))


@pytest.fixture
def no_recheck(settings: Any) -> None:
    """The periodic re-check far away: what closes the stream is the revocation's message."""
    settings.TRAINYARD_WS_RECHECK_SECONDS = 3600


def stream(job_id: int, token: str | None = None, cookie: str | None = None) -> Any:
    headers = []
    if token:
        headers.append((b"authorization", f"Token {token}".encode()))
    if cookie:
        headers.append((b"cookie", cookie.encode()))
    return WebsocketCommunicator(application, f"/ws/jobs/{job_id}/?after=0", headers)


async def opened(comm: WebsocketCommunicator) -> WebsocketCommunicator:
    connected, code = await comm.connect()
    assert connected, code
    assert (await comm.receive_json_from(timeout=5))["type"] == "state"
    return comm


async def close_of(comm: WebsocketCommunicator) -> dict[str, Any]:
    """The close the server sent, after whatever frames came before it; then the client goes,
    so that the consumer ends while the test's loop still runs (its follower may be in a
    database read, which must not be left for the database's teardown)."""
    while True:
        message = await comm.receive_output(timeout=10)
        if message["type"] == "websocket.close":
            await comm.disconnect(timeout=10)
            return message


async def stays_open(comm: WebsocketCommunicator, seconds: float) -> bool:
    """Whether the stream stays open for `seconds`: nothing comes but heartbeats (a quiet log
    sends one every few seconds, and on a loaded machine the first may fall in the window)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    while loop.time() < end:
        if await comm.receive_nothing(timeout=min(0.1, end - loop.time())):
            continue
        message = await comm.receive_output(timeout=1)
        if message["type"] != "websocket.send":
            return False
        if json.loads(message["text"])["type"] != "heartbeat":
            return False
    return True


def issue(user: User, name: str = "laptop") -> tuple[int, str]:
    issued = tokens.issue(user, name)
    return issued.token.pk, issued.key


def session_cookie(user: User) -> str:
    client = Client()
    client.force_login(user)
    name = django_settings.SESSION_COOKIE_NAME
    return f"{name}={client.cookies[name].value}"


@pytest.mark.usefixtures("no_recheck")
async def test_it_closes_a_token_stream_with_4401_when_the_token_is_revoked(
    job: Job, alice: User
) -> None:
    token_id, key = await database_sync_to_async(issue)(alice)
    comm = await opened(stream(job.pk, key))
    await database_sync_to_async(tokens.revoke)(alice, token_id)
    closed = await close_of(comm)
    assert closed["code"] == revocation.CLOSE_CREDENTIALS_REVOKED == 4401
    assert closed["reason"] == "credentials revoked: the API token was revoked"


@pytest.mark.usefixtures("no_recheck")
async def test_it_keeps_a_stream_whose_own_token_still_holds(job: Job, alice: User) -> None:
    token_id, key = await database_sync_to_async(issue)(alice)
    other_id, _ = await database_sync_to_async(issue)(alice, "ci")
    comm = await opened(stream(job.pk, key))
    await database_sync_to_async(tokens.revoke)(alice, other_id)  # tells every stream of alice
    assert await stays_open(comm, 1)  # checked, and still open
    await database_sync_to_async(tokens.revoke)(alice, token_id)
    assert (await close_of(comm))["code"] == 4401


@pytest.mark.usefixtures("no_recheck")
async def test_it_closes_a_session_stream_of_a_user_who_is_deactivated(
    job: Job, alice: User
) -> None:
    by_session = await opened(
        stream(job.pk, cookie=await database_sync_to_async(session_cookie)(alice))
    )
    await database_sync_to_async(users.update_user)(
        alice, groups=[], new_group="", is_staff=False, is_active=False, quota=None
    )
    closed = await close_of(by_session)
    assert (closed["code"], closed["reason"]) == (
        4401,
        "credentials revoked: the user was deactivated",
    )


@pytest.mark.usefixtures("no_recheck")
async def test_a_password_change_closes_a_session_stream(job: Job, alice: User) -> None:
    by_session = await opened(
        stream(job.pk, cookie=await database_sync_to_async(session_cookie)(alice))
    )
    await database_sync_to_async(users.change_password)(alice, NEW_PASSWORD, keep_tokens=True)
    closed = await close_of(by_session)
    assert closed["reason"] == "credentials revoked: the password was changed"


@pytest.mark.usefixtures("no_recheck")
async def test_a_password_change_closes_a_token_stream(job: Job, alice: User) -> None:
    _, key = await database_sync_to_async(issue)(alice)
    by_token = await opened(stream(job.pk, key))
    await database_sync_to_async(users.change_password)(alice, NEW_PASSWORD)
    closed = await close_of(by_token)
    assert closed["reason"] == "credentials revoked: the API token was revoked"


async def test_a_password_change_that_keeps_tokens_keeps_their_streams(
    job: Job, alice: User, settings: Any
) -> None:
    settings.TRAINYARD_WS_RECHECK_SECONDS = 1
    _, key = await database_sync_to_async(issue)(alice)
    by_token = await opened(stream(job.pk, key))
    await database_sync_to_async(users.change_password)(alice, NEW_PASSWORD, keep_tokens=True)
    assert await stays_open(by_token, 2.5)  # the message and two re-checks later
    await by_token.disconnect(timeout=10)


async def test_the_periodic_recheck_closes_a_stream_whose_message_was_lost(
    job: Job, alice: User, settings: Any
) -> None:
    settings.TRAINYARD_WS_RECHECK_SECONDS = 0.2
    _, key = await database_sync_to_async(issue)(alice)
    comm = await opened(stream(job.pk, key))
    # Past the service: nobody tells the stream.
    await database_sync_to_async(ApiToken.objects.filter(user=alice).delete)()
    closed = await close_of(comm)
    assert (closed["code"], closed["reason"]) == (
        4401,
        "credentials revoked: the API token was revoked",
    )


# --- the password pages -------------------------------------------------------------------------


def api_status(key: str) -> int:
    return Client().get("/api/v1/jobs", HTTP_AUTHORIZATION=f"Token {key}").status_code


def test_it_revokes_the_api_tokens_on_a_password_change(
    client: Client, job: Job, alice: User
) -> None:
    _, key = issue(alice)
    client.force_login(alice)
    r = client.post(
        "/account/password/",
        {"old_password": PASSWORD, "new_password1": NEW_PASSWORD, "new_password2": NEW_PASSWORD},
    )
    assert r.status_code == 302
    alice.refresh_from_db()
    assert alice.check_password(NEW_PASSWORD)
    assert not ApiToken.objects.filter(user=alice).exists()
    assert api_status(key) == 401
    assert client.get("/account/tokens/").status_code == 200  # this browser stays logged in


def test_it_keeps_the_api_tokens_when_asked(client: Client, job: Job, alice: User) -> None:
    _, key = issue(alice)
    client.force_login(alice)
    r = client.post(
        "/account/password/",
        {"old_password": PASSWORD, "new_password1": NEW_PASSWORD, "new_password2": NEW_PASSWORD,
         "keep_tokens": "on"},
    )  # fmt: skip
    assert r.status_code == 302
    assert api_status(key) == 200


def test_it_changes_nothing_on_a_wrong_old_password(client: Client, job: Job, alice: User) -> None:
    _, key = issue(alice)
    client.force_login(alice)
    r = client.post(
        "/account/password/",
        {"old_password": "wrong", "new_password1": NEW_PASSWORD, "new_password2": NEW_PASSWORD},
    )
    assert r.status_code == 200
    assert "old password was entered incorrectly" in r.content.decode()
    alice.refresh_from_db()
    assert alice.check_password(PASSWORD)
    assert api_status(key) == 200


def test_the_admins_password_change_revokes_the_users_tokens(
    client: Client, job: Job, alice: User, charlie_admin: User
) -> None:
    _, key = issue(alice)
    client.force_login(charlie_admin)
    page = client.get(f"/admin/auth/user/{alice.pk}/password/").content.decode()
    assert 'name="keep_tokens"' in page
    r = client.post(
        f"/admin/auth/user/{alice.pk}/password/",
        {"password1": NEW_PASSWORD, "password2": NEW_PASSWORD, "usable_password": "true",
         "set-password": "1"},
    )  # fmt: skip
    assert r.status_code == 302, r.content.decode()[:2000]
    alice.refresh_from_db()
    assert alice.check_password(NEW_PASSWORD)
    assert api_status(key) == 401


def test_the_admins_own_password_change_is_the_account_page(
    client: Client, charlie_admin: User
) -> None:
    client.force_login(charlie_admin)
    r = client.get("/admin/password_change/")
    assert r.status_code == 302 and r["Location"] == "/account/password/"
