"""A user's own API tokens: issue one by name, list them, revoke one.

Keys are stored hashed (jobs.models.ApiToken), so a key exists only in what `issue` returns:
whoever shows it must show it then, once. Authentication is jobs.tokens. A revoked token also
ends the streams it opened (jobs.services.revocation).
"""

from dataclasses import dataclass

from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import QuerySet

from jobs import text
from jobs.models import ApiToken
from jobs.services import revocation

NAME_MAX_LENGTH = ApiToken._meta.get_field("name").max_length or 100


class BadTokenName(ValueError):
    pass


@dataclass(frozen=True)
class Issued:
    token: ApiToken
    key: str


def issue(user: User, name: str) -> Issued:
    name = name.strip()
    if len(name) > NAME_MAX_LENGTH:
        raise BadTokenName(f"A token's name has at most {NAME_MAX_LENGTH} characters.")
    if problem := text.name_problem(name):
        raise BadTokenName(problem)
    key = ApiToken.issue(user, name=name)
    return Issued(ApiToken.objects.get(digest=ApiToken.hash(key)), key)


def tokens_of(user: User) -> QuerySet[ApiToken]:
    """The user's tokens, newest first."""
    return ApiToken.objects.filter(user=user).order_by("-created", "-id")


@transaction.atomic
def revoke(user: User, token_id: int) -> ApiToken | None:
    """Delete one of the user's own tokens, and end the streams it opened; None when they have
    no token of that id (someone else's included: nobody learns which ids exist)."""
    token = ApiToken.objects.filter(user=user, pk=token_id).first()
    if token is None:
        return None
    token.delete()
    revocation.tell_streams_on_commit(user.pk)
    return token


@transaction.atomic
def revoke_all(user: User) -> int:
    """Delete every token of the user (their password changed, say), and end the streams
    those tokens opened; how many there were."""
    deleted, _ = ApiToken.objects.filter(user=user).delete()
    if deleted:
        revocation.tell_streams_on_commit(user.pk)
    return deleted
