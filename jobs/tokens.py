"""`Authorization: Token KEY`: which user a key belongs to, and when it was last used."""

from datetime import timedelta

from django.contrib.auth.models import User
from django.db.models import Q
from django.utils import timezone

from jobs.models import ApiToken

# A script that polls every second would otherwise write the token's row on every request;
# "last used" only needs to tell a token in use from a forgotten one.
LAST_USED_RESOLUTION = timedelta(minutes=1)


def user_for_token(key: str) -> User | None:
    token = token_for_key(key)
    return token.user if token is not None else None


def token_for_key(key: str) -> ApiToken | None:
    """The token of this key, its user loaded, if it opens anything: it exists and its user is
    active. A stream remembers the token's id, to end when the token is revoked."""
    if not key:
        return None
    token = ApiToken.objects.select_related("user").filter(digest=ApiToken.hash(key)).first()
    if token is None or not token.user.is_active:
        return None
    _record_use(token)
    return token


def _record_use(token: ApiToken) -> None:
    """Set last_used, unless it was set less than a minute ago. The condition is in the UPDATE
    itself, so concurrent requests with one token write it once between them."""
    now = timezone.now()
    if token.last_used is not None and token.last_used > now - LAST_USED_RESOLUTION:
        return  # the row as read is recent enough: no query at all
    ApiToken.objects.filter(
        Q(last_used__isnull=True) | Q(last_used__lte=now - LAST_USED_RESOLUTION), pk=token.pk
    ).update(last_used=now)
