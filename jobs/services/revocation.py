"""Ending the streams opened with credentials that no longer hold.

A websocket is authenticated once, when it opens; without this, a stream opened with a token
that was revoked since (or by a user deactivated since, or with a session whose password was
changed) would go on relaying the job's log for as long as the job runs.

Each stream remembers the credential that opened it (`Credential`: a token's id or a session's
key) and asks `why_invalid` again:
- at once, when it is told to: every change that can take a credential away (a token revoked,
  a user deactivated, a password changed) tells the user's streams through the channel layer,
  so a revocation in any process (a web worker, the admin, `manage.py shell`) reaches the web
  server that holds the stream;
- and every TRAINYARD_WS_RECHECK_SECONDS in any case, for a message that was lost (Redis
  restarting at that moment) or a change made past this module (a user deleted in the admin).

A stream that fails the check is closed with CLOSE_CREDENTIALS_REVOKED and a reason.
"""

import logging
from dataclasses import dataclass
from importlib import import_module

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
from django.contrib.auth.models import User
from django.db import transaction
from django.utils.crypto import constant_time_compare

from jobs.models import ApiToken

log = logging.getLogger(__name__)

# In the private range of websocket close codes (4000-4999), as HTTP's 401: the credentials
# that opened the stream do not hold any more. Documented in docs/security.md and the README.
CLOSE_CREDENTIALS_REVOKED = 4401

# The channel layer's message type: JobConsumer.credentials_changed handles it.
CREDENTIALS_CHANGED = "credentials.changed"


@dataclass(frozen=True)
class Credential:
    """What opened a stream: an API token (by id) or a browser session (by key)."""

    user_id: int
    token_id: int | None = None
    session_key: str | None = None


def user_group(user_id: int) -> str:
    """The channel-layer group of every stream a user has open, whatever opened it."""
    return f"credentials.user.{user_id}"


def why_invalid(credential: Credential) -> str | None:
    """None while the credential still opens streams; else why not, in words for the user."""
    user = User.objects.filter(pk=credential.user_id).first()
    if user is None:
        return "the user no longer exists"
    if not user.is_active:
        return "the user was deactivated"
    if credential.token_id is not None:
        if not ApiToken.objects.filter(pk=credential.token_id, user=user).exists():
            return "the API token was revoked"
        return None
    if credential.session_key is not None:
        return _why_session_invalid(credential.session_key, user)
    return "the stream was opened without credentials"


def _why_session_invalid(session_key: str, user: User) -> str | None:
    """As django.contrib.auth.get_user judges a session: it must still exist, name this user
    and carry the hash of their current password (or of one under a SECRET_KEY fallback)."""
    store = import_module(settings.SESSION_ENGINE).SessionStore(session_key)
    session = store.load()  # {} when the session was logged out, expired or cycled
    if not session or session.get(SESSION_KEY) != str(user.pk):
        return "the session ended (logged out)"
    if BACKEND_SESSION_KEY not in session:
        return "the session ended (logged out)"
    stored = session.get(HASH_SESSION_KEY) or ""
    hashes = [user.get_session_auth_hash()]
    fallback = getattr(user, "get_session_auth_fallback_hash", None)
    if fallback is not None:
        hashes.extend(fallback())
    if not any(constant_time_compare(stored, h) for h in hashes):
        return "the password was changed"
    return None


def tell_streams_on_commit(user_id: int) -> None:
    """Once this transaction commits, have every open stream of the user check its credential
    again. Sent at once, not through the job events' background sender: the process may be a
    short one (`manage.py shell`) that exits before a background thread would have sent it.
    Best effort: the periodic re-check catches a message that is lost. Once per user and
    transaction (a password change that also revokes tokens sends one message)."""
    pending = transaction.get_connection().run_on_commit
    if any(
        isinstance(hook, _TellStreams) and hook.user_id == user_id and not hook.sent
        for _, hook, _ in pending
    ):
        return
    transaction.on_commit(_TellStreams(user_id), robust=True)


class _TellStreams:
    def __init__(self, user_id: int) -> None:
        self.user_id = user_id
        self.sent = False

    def __call__(self) -> None:
        self.sent = True
        layer = get_channel_layer()
        if layer is None:
            return
        try:
            async_to_sync(layer.group_send)(user_group(self.user_id), {"type": CREDENTIALS_CHANGED})
        except Exception:
            log.warning(
                "could not tell the open streams of user %s that their credentials changed; "
                "they find out within %s s on their own",
                self.user_id, settings.TRAINYARD_WS_RECHECK_SECONDS, exc_info=True,
            )  # fmt: skip
