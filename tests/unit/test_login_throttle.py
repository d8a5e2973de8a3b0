"""Login throttling: after too many wrong passwords for an account or from an address, logins
are refused for a while, with a message that says how long, even with the right password."""

import contextlib
import io
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth import aauthenticate, authenticate
from django.contrib.auth.models import User
from django.core.cache import cache
from django.core.management import CommandError, call_command
from django.test import Client
from redis import RedisError

from console.settings import cache_settings
from jobs import login_throttle
from jobs.login_throttle import begin_attempt, wait_in_words
from jobs.models import ApiToken
from stack.redis_server import free_port

pytestmark = pytest.mark.django_db

LOGIN = "/accounts/login/"
ACCOUNT_LOCKED = "Too many failed logins for this account. Try again in 15 minutes"
ADDRESS_LOCKED = "Too many failed logins from your address. Try again in 15 minutes"


@pytest.fixture(autouse=True)
def fresh_counts(settings: Any) -> Iterator[None]:
    """The defaults, and no counts left over from another test (the cache is per process)."""
    # Hundreds of logins: a fast hasher (the users are made after this fixture).
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    settings.TRAINYARD_LOGIN_FAILURES_PER_ACCOUNT = 5
    settings.TRAINYARD_LOGIN_FAILURES_PER_ADDRESS = 20
    settings.TRAINYARD_LOGIN_LOCKOUT_SECONDS = 15 * 60
    cache.clear()
    yield
    with contextlib.suppress(RedisError):  # a test that points the cache at no server
        cache.clear()


def log_in(
    client: Client, username: str, password: str, url: str = LOGIN, address: str = "127.0.0.1"
) -> Any:
    return client.post(url, {"username": username, "password": password}, REMOTE_ADDR=address)


def fail(client: Client, username: str, times: int, **kwargs: Any) -> Any:
    response = None
    for _ in range(times):
        response = log_in(client, username, "wrong-password", **kwargs)
    return response


def logged_in(client: Client) -> bool:
    return "_auth_user_id" in client.session


def test_it_says_a_wrong_password_did_not_match(client: Client, alice: User) -> None:
    response = fail(client, "alice", 4)
    assert response.status_code == 200
    assert "Your username and password didn&#x27;t match." in response.content.decode()


def test_it_locks_an_account_after_five_wrong_passwords_and_says_how_long(
    client: Client, alice: User
) -> None:
    response = fail(client, "alice", 5)
    assert response.status_code == 429
    assert response["Retry-After"] == "900"
    assert ACCOUNT_LOCKED in response.content.decode()


def test_even_the_right_password_is_refused_while_locked(client: Client, alice: User) -> None:
    fail(client, "alice", 5)
    response = log_in(client, "alice", "alice-password")
    assert response.status_code == 429
    assert ACCOUNT_LOCKED in response.content.decode()
    assert "until then even the right password is refused" in response.content.decode()
    assert not logged_in(client)


def test_the_lock_is_for_that_account_only(client: Client, alice: User, bob: User) -> None:
    fail(client, "alice", 5)
    response = log_in(client, "bob", "bob-password")
    assert (response.status_code, response["Location"]) == (302, "/")


def test_the_lock_ends_after_the_lockout(
    settings: Any, client: Client, alice: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.TRAINYARD_LOGIN_LOCKOUT_SECONDS = 60
    assert fail(client, "alice", 5).status_code == 429
    # A minute later, by the throttle's clock (the lock's end is the time it compares).
    later = time.time() + 61
    monkeypatch.setattr(login_throttle, "time", SimpleNamespace(time=lambda: later))
    response = log_in(client, "alice", "alice-password")
    assert (response.status_code, response["Location"]) == (302, "/")
    assert logged_in(client)


def test_a_success_clears_the_accounts_count(client: Client, alice: User) -> None:
    fail(client, "alice", 4)
    assert log_in(client, "alice", "alice-password").status_code == 302
    client.logout()
    assert fail(client, "alice", 4).status_code == 200


def test_it_locks_an_address_after_twenty_wrong_passwords_whatever_the_accounts(
    client: Client, alice: User
) -> None:
    for i in range(20):
        response = log_in(client, f"guess-{i}", "wrong-password", address="10.0.0.1")
    assert response.status_code == 429
    assert ADDRESS_LOCKED in response.content.decode()
    response = log_in(client, "alice", "alice-password", address="10.0.0.1")
    assert response.status_code == 429
    assert ADDRESS_LOCKED in response.content.decode()
    # From elsewhere, alice logs in: her account has no failures.
    response = log_in(client, "alice", "alice-password", address="10.0.0.2")
    assert (response.status_code, response["Location"]) == (302, "/")


def test_a_success_does_not_clear_the_addresss_count(client: Client, alice: User) -> None:
    """Else a guesser with an account of their own could reset their address between tries."""
    for i in range(19):
        log_in(client, f"guess-{i}", "wrong-password")
    assert log_in(client, "alice", "alice-password").status_code == 302
    client.logout()
    assert log_in(client, "guess-19", "wrong-password").status_code == 429


def test_an_admin_lifts_an_account_lockout_with_unlock_login(
    settings: Any, client: Client, alice: User
) -> None:
    settings.REDIS_URL = "redis://the-console's-redis"  # the cache of these tests stays local
    fail(client, "alice", 5)
    out = io.StringIO()
    call_command("unlock_login", "alice", stdout=out)
    assert out.getvalue() == "unlocked account 'alice' (was locked)\n"
    response = log_in(client, "alice", "alice-password")
    assert (response.status_code, response["Location"]) == (302, "/")
    client.logout()
    # Its failures went with the lock: four more wrong passwords do not lock it again.
    assert fail(client, "alice", 4).status_code == 200


def test_unlock_login_lifts_an_address_and_says_when_nothing_was_locked(
    settings: Any, client: Client, alice: User
) -> None:
    settings.REDIS_URL = "redis://the-console's-redis"
    for i in range(20):
        log_in(client, f"guess-{i}", "wrong-password", address="10.0.0.1")
    out = io.StringIO()
    call_command("unlock_login", "bob", address="10.0.0.1", stdout=out)
    assert out.getvalue() == (
        "unlocked account 'bob' (was not locked)\nunlocked address '10.0.0.1' (was locked)\n"
    )
    response = log_in(client, "alice", "alice-password", address="10.0.0.1")
    assert (response.status_code, response["Location"]) == (302, "/")


def test_unlock_login_needs_an_account_or_an_address() -> None:
    with pytest.raises(CommandError, match=r"Name an account, an --address, or both\."):
        call_command("unlock_login")


def test_unlock_login_refuses_without_the_consoles_redis(settings: Any, client: Client) -> None:
    """Without REDIS_URL the command would unlock its own in-process cache: nothing at all."""
    settings.REDIS_URL = ""
    fail(client, "alice", 5)
    with pytest.raises(CommandError, match="The lockouts live in the console's Redis"):
        call_command("unlock_login", "alice")
    assert log_in(client, "alice", "alice-password").status_code == 429


def test_limits_and_lockout_come_from_the_settings(
    settings: Any, client: Client, alice: User
) -> None:
    settings.TRAINYARD_LOGIN_FAILURES_PER_ACCOUNT = 2
    settings.TRAINYARD_LOGIN_LOCKOUT_SECONDS = 90
    response = fail(client, "alice", 2)
    assert response.status_code == 429
    assert response["Retry-After"] == "90"
    assert "Try again in 2 minutes" in response.content.decode()


def test_a_limit_of_zero_turns_that_count_off(settings: Any, client: Client, alice: User) -> None:
    settings.TRAINYARD_LOGIN_FAILURES_PER_ACCOUNT = 0
    assert fail(client, "alice", 10).status_code == 200
    assert log_in(client, "alice", "alice-password").status_code == 302


def test_the_admin_login_is_throttled_too(client: Client, charlie_admin: User) -> None:
    response = fail(client, "charlie", 5, url="/admin/login/")
    assert response.status_code == 429
    assert ACCOUNT_LOCKED in response.content.decode()
    response = log_in(client, "charlie", "charlie-password", url="/admin/login/")
    assert response.status_code == 429
    assert not logged_in(client)


def test_failures_on_either_login_page_add_up(client: Client, charlie_admin: User) -> None:
    fail(client, "charlie", 3, url="/admin/login/")
    assert fail(client, "charlie", 2).status_code == 429


def test_api_tokens_are_not_throttled(client: Client, alice: User) -> None:
    key = ApiToken.issue(alice)
    fail(client, "alice", 5)
    fail(client, "someone", 20)
    response = client.get("/api/v1/jobs", headers={"Authorization": f"Token {key}"})
    assert response.status_code == 200


def test_scripted_logins_without_a_request_count_for_the_account(
    client: Client, alice: User
) -> None:
    """`authenticate()` without a request (Django's test client's login(), a shell) has no
    address, but the account still counts and locks."""
    for _ in range(5):
        assert not client.login(username="alice", password="wrong-password")
    assert not client.login(username="alice", password="alice-password")
    assert log_in(client, "alice", "alice-password").status_code == 429


def test_attempts_at_the_same_moment_get_no_more_tries_than_the_limit(alice: User) -> None:
    """Each attempt counts as it begins, not once its password hash is done, so a burst of
    parallel guesses cannot slip past the limit."""
    in_flight = [begin_attempt(None, "alice") for _ in range(5)]
    assert [lock for lock, _ in in_flight] == [None] * 5
    assert [len(last) for _, last in in_flight] == [0, 0, 0, 0, 1]  # the 5th is the last try
    lock, _ = begin_attempt(None, "alice")
    assert lock is not None and (lock.scope, lock.seconds_left) == ("account", 900)
    assert authenticate(None, username="alice", password="alice-password") is None


def test_async_logins_are_throttled_too(alice: User) -> None:
    assert async_to_sync(aauthenticate)(None, username="alice", password="alice-password")
    for _ in range(5):
        assert authenticate(None, username="alice", password="wrong-password") is None
    assert async_to_sync(aauthenticate)(None, username="alice", password="alice-password") is None


def test_logins_go_on_when_the_cache_does_not_answer(
    settings: Any, client: Client, alice: User
) -> None:
    settings.CACHES = cache_settings(f"redis://127.0.0.1:{free_port()}/0")  # nothing listens
    assert fail(client, "alice", 6).status_code == 200
    assert log_in(client, "alice", "alice-password").status_code == 302


def test_it_counts_in_redis_when_there_is_one(
    settings: Any, client: Client, alice: User, redis_url: str
) -> None:
    settings.CACHES = cache_settings(redis_url)
    assert log_in(client, "alice", "alice-password").status_code == 302  # takes its count back
    client.logout()
    response = fail(client, "alice", 5)
    assert response.status_code == 429
    assert response["Retry-After"] == "900"
    assert log_in(client, "alice", "alice-password").status_code == 429
    assert fail(Client(), "bob", 1).status_code == 200


def test_wait_in_words() -> None:
    assert [wait_in_words(s) for s in (1, 59, 60, 61, 900)] == [
        "1 second",
        "59 seconds",
        "1 minute",
        "2 minutes",
        "15 minutes",
    ]
