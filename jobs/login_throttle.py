"""Login throttling: too many wrong passwords for one account, or from one address, lock that
account or address out for a while, and say for how long.

Every password login goes through `authenticate()`, so the check sits in the authentication
backend: the console's login page, the admin's, and any other caller are covered alike. API
tokens (Authorization: Token) never call it and are not throttled. Counts live in Django's
cache, which is Redis when REDIS_URL is set, so every web process sees the same counts.

- A failure adds one to the account's count and to the address's count; each count starts a
  window of TRAINYARD_LOGIN_LOCKOUT_SECONDS at its first failure. (Each attempt is counted as
  it begins and a success takes its count back, so parallel attempts cannot overrun a limit.)
- A count that reaches its limit (TRAINYARD_LOGIN_FAILURES_PER_ACCOUNT, …_PER_ADDRESS; 0: no
  limit) locks for TRAINYARD_LOGIN_LOCKOUT_SECONDS from then. While locked, every attempt is
  refused before the password is checked, so even the right one does not get in, and refused
  attempts are not counted (the wait the page names is the wait there is).
- A successful login clears its account's count, not its address's: a guesser who owns one
  account must not be able to reset their address by logging in to it.

If the cache does not answer (Redis down), logins go on unthrottled rather than not at all.
"""

import hashlib
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.forms import AuthenticationForm
from django.contrib.auth.models import User
from django.core.cache import cache
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import HttpRequest
from django.http.response import HttpResponseBase
from redis import RedisError

log = logging.getLogger(__name__)

T = TypeVar("T")

# Set on the request by the backend, read by the login forms and the middleware below.
REQUEST_ATTRIBUTE = "trainyard_login_lockout"


@dataclass(frozen=True)
class Lockout:
    scope: str  # "account" or "address"
    seconds_left: int

    @property
    def message(self) -> str:
        whose = "for this account" if self.scope == "account" else "from your address"
        return (
            f"Too many failed logins {whose}. Try again in {wait_in_words(self.seconds_left)}; "
            "until then even the right password is refused."
        )


def wait_in_words(seconds: int) -> str:
    if seconds < 60:
        return f"{seconds} second{'s' if seconds != 1 else ''}"
    minutes = math.ceil(seconds / 60)
    return f"{minutes} minute{'s' if minutes != 1 else ''}"


@dataclass(frozen=True)
class _Count:
    scope: str
    key: str
    limit: int

    @property
    def failures_key(self) -> str:
        return f"login-throttle:failures:{self.key}"

    @property
    def lock_key(self) -> str:
        return f"login-throttle:lock:{self.key}"


def _counts(request: HttpRequest | None, username: str) -> list[_Count]:
    """The counts an attempt touches: its account's, and its address's when it came over HTTP.
    Keys are hashed: a username may hold anything, and the cache should not list them."""
    counts = []
    limit = settings.TRAINYARD_LOGIN_FAILURES_PER_ACCOUNT
    if limit > 0:
        counts.append(_Count("account", "account:" + _digest(username), limit))
    address = request.META.get("REMOTE_ADDR", "") if request is not None else ""
    limit = settings.TRAINYARD_LOGIN_FAILURES_PER_ADDRESS
    if address and limit > 0:
        counts.append(_Count("address", "address:" + _digest(address), limit))
    return counts


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def _unthrottled_if_cache_fails(what: str, default: T, action: Callable[[], T]) -> T:
    try:
        return action()
    except (RedisError, OSError) as exc:
        log.warning("login throttle: the cache did not answer (%s); %s", exc, what)
        return default


def begin_attempt(
    request: HttpRequest | None, username: str
) -> tuple[Lockout | None, list[_Count]]:
    """Count this attempt as a failure before its password is checked, so that attempts made at
    the same moment see each other (a burst gets no more tries than the limit); a success takes
    its count back.

    Returns the lock that refuses the attempt (the longest, if both are locked), or None and the
    counts for which this attempt is the last one allowed.
    """
    counts = _counts(request, username)
    window = settings.TRAINYARD_LOGIN_LOCKOUT_SECONDS

    def begin() -> tuple[Lockout | None, list[_Count]]:
        now = time.time()
        until = cache.get_many([c.lock_key for c in counts])
        locks = [
            Lockout(c.scope, math.ceil(until[c.lock_key] - now))
            for c in counts
            if until.get(c.lock_key, 0) > now
        ]
        if locks:  # refused, and not counted: the wait the page names is the wait there is
            return max(locks, key=lambda lock: lock.seconds_left), []
        last_allowed = []
        for c in counts:
            failures = _add_one(c.failures_key, window)
            if failures > c.limit:  # others at the same moment took the last tries
                cache.add(c.lock_key, now + window, timeout=window)
                locks.append(Lockout(c.scope, window))
            elif failures == c.limit:
                last_allowed.append(c)
        return max(locks, key=lambda lock: lock.seconds_left, default=None), last_allowed

    let_through: tuple[Lockout | None, list[_Count]] = (None, [])
    return _unthrottled_if_cache_fails("letting the attempt through", let_through, begin)


def _add_one(key: str, window: int) -> int:
    cache.add(key, 0, timeout=window)  # the window starts with the first failure
    try:
        return cache.incr(key)
    except ValueError:  # the window ended between the two calls
        cache.set(key, 1, timeout=window)
        return 1


def attempt_failed(last_allowed: list[_Count]) -> Lockout | None:
    """The password was wrong: lock what this attempt was the last try of."""
    window = settings.TRAINYARD_LOGIN_LOCKOUT_SECONDS

    def lock() -> Lockout | None:
        started = None
        for c in last_allowed:
            cache.set(c.lock_key, time.time() + window, timeout=window)
            cache.delete(c.failures_key)  # counting starts afresh when the lock ends
            log.warning("login throttle: %s locked for %d s", c.scope, window)
            started = Lockout(c.scope, window)
        return started

    return _unthrottled_if_cache_fails("not locking", None, lock)


def attempt_succeeded(request: HttpRequest | None, username: str) -> None:
    """Take back the count made when the attempt began."""

    def take_back() -> None:
        for c in _counts(request, username):
            if c.scope == "account":
                cache.delete(c.failures_key)  # the account's owner is back: start afresh
            else:
                try:
                    cache.decr(c.failures_key)
                except ValueError:  # the window ended meanwhile
                    pass

    _unthrottled_if_cache_fails("not taking the count back", None, take_back)


def lift(username: str | None = None, address: str | None = None) -> list[str]:
    """Lift the lock and forget the failures of an account and/or a client address (an admin
    who has checked who is knocking: `manage.py unlock_login`). Returns what was lifted."""
    lifted = []
    for scope, value in (("account", username), ("address", address)):
        if value is None:
            continue
        count = _Count(scope, f"{scope}:" + _digest(value), 0)
        was_locked = cache.get(count.lock_key) is not None
        cache.delete_many([count.lock_key, count.failures_key])
        lifted.append(
            f"{scope} {value!r}" + (" (was locked)" if was_locked else " (was not locked)")
        )
    return lifted


def _tell(request: HttpRequest | None, lockout: Lockout | None) -> None:
    """Leave the lockout on the request for the login form's message and the 429."""
    if request is not None and lockout is not None:
        setattr(request, REQUEST_ATTRIBUTE, lockout)


def lockout_of(request: HttpRequest | None) -> Lockout | None:
    lockout = getattr(request, REQUEST_ATTRIBUTE, None)
    return lockout if isinstance(lockout, Lockout) else None


class ThrottledModelBackend(ModelBackend):
    """Django's ModelBackend behind the throttle: a locked account or address is refused
    (PermissionDenied stops `authenticate()` from asking any other backend)."""

    def authenticate(
        self,
        request: HttpRequest | None,
        username: str | None = None,
        password: str | None = None,
        **kwargs: Any,
    ) -> User | None:
        if username is None:
            username = kwargs.get(get_user_model().USERNAME_FIELD)
        if username is None or password is None:
            return None
        lockout, last_allowed = begin_attempt(request, username)
        if lockout is not None:
            _tell(request, lockout)
            raise PermissionDenied(lockout.message)
        user = self.check_password(request, username, password, **kwargs)
        if user is None:
            _tell(request, attempt_failed(last_allowed))
        else:
            attempt_succeeded(request, username)
        return user

    def check_password(
        self, request: HttpRequest | None, username: str, password: str, **kwargs: Any
    ) -> User | None:
        """The user whose password this is, or None: the console's own (a subclass may ask a
        directory first); the throttle around it is the same."""
        return super().authenticate(request, username=username, password=password, **kwargs)

    async def aauthenticate(
        self,
        request: HttpRequest | None,
        username: str | None = None,
        password: str | None = None,
        **kwargs: Any,
    ) -> User | None:
        # ModelBackend's own async version would skip the throttle.
        return await sync_to_async(self.authenticate)(request, username, password, **kwargs)


def _invalid_login_error(
    form: AuthenticationForm, default: Callable[[], ValidationError]
) -> ValidationError:
    lockout = lockout_of(form.request)
    if lockout is not None:
        return ValidationError(lockout.message, code="throttled")
    return default()


class LoginForm(AuthenticationForm):
    """The console's login form: says how long to wait when the throttle refuses."""

    error_messages = {
        **AuthenticationForm.error_messages,
        "invalid_login": "Your username and password didn't match.",
    }

    def get_invalid_login_error(self) -> ValidationError:
        return _invalid_login_error(self, super().get_invalid_login_error)


class AdminLoginForm(AdminAuthenticationForm):
    """The admin's login form, likewise."""

    def get_invalid_login_error(self) -> ValidationError:
        return _invalid_login_error(self, super().get_invalid_login_error)


class LoginThrottleMiddleware:
    """A login page that shows a lockout answers 429 Too Many Requests with Retry-After, so
    that scripts posting to it see the lock too."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        response = self.get_response(request)
        lockout = lockout_of(request)
        if lockout is not None and response.status_code == 200:
            response.status_code = 429
            response["Retry-After"] = str(lockout.seconds_left)
        return response
