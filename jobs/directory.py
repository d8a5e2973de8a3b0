"""Sign-in through the organisation's LDAP directory (django-auth-ldap; settings from
console/directory_settings.py), and what the directory says about a person, kept here:

- `ThrottledDirectoryBackend`: the directory first, then the console's own accounts (the
  admin of a small set-up), behind the same login throttle (jobs/login_throttle.py). A person
  the directory knows never signs in with a password of the console's: once the directory
  says no, nothing here says yes.
- `remember`, at each sign-in: their entry (DirectoryAccount), their groups (mirrored by
  django-auth-ldap: quotas and fair share are set on them), staff from the staff group, and
  their Unix identity: posixAccount's uid, uidNumber and gidNumber, and the gidNumbers of the
  posixGroups that list them (UnixAccount, from_directory).
- `check_accounts`, on a timer in the console worker (TRAINYARD_LDAP_CHECK_SECONDS): each
  directory person asked again. One the directory no longer lets in (gone, outside the
  required group, in the deny group, locked by the password policy, or past shadowExpire) is
  deactivated as an admin would: their sessions and tokens stop working at once and their
  open streams are closed (jobs/services/revocation.py). A pass the directory does not answer
  changes nobody: an outage is not a dismissal.
"""

import datetime
import logging
import threading
from typing import Any

import ldap
from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.http import HttpRequest
from django.utils import timezone
from django_auth_ldap.backend import LDAPBackend, ldap_error
from ldap.filter import escape_filter_chars

from jobs.login_throttle import ThrottledModelBackend
from jobs.models import DirectoryAccount, UnixAccount
from jobs.services import users
from jobs.services.periodic import PeriodicPass

log = logging.getLogger(__name__)

# Set while a check runs in this thread: an LDAP error during it makes the pass inconclusive.
_errors = threading.local()


class ThrottledDirectoryBackend(ThrottledModelBackend):
    def check_password(
        self, request: HttpRequest | None, username: str, password: str, **kwargs: Any
    ) -> User | None:
        user = LDAPBackend().authenticate(request, username=username, password=password)
        if user is not None:
            remember(user, getattr(user, "ldap_user"))  # noqa: B009 (set by django-auth-ldap)
            return user
        if DirectoryAccount.objects.filter(user__username=username).exists():
            return None  # the directory's person: no console password lets them in
        return super().check_password(request, username, password, **kwargs)


def _first(attrs: Any, name: str) -> str:
    values = attrs.get(name) or [""]
    value = values[0]
    return value.decode() if isinstance(value, bytes) else str(value)


def _number(text: str) -> int | None:
    return int(text) if text.strip().isdigit() else None


def group_ids(ldap_user: Any, name: str) -> list[int]:
    """The gidNumbers of the posixGroups under the group base that list `name` (memberUid)."""
    found = ldap_user.connection.search_s(
        settings.TRAINYARD_LDAP_GROUP_BASE,
        ldap.SCOPE_SUBTREE,
        f"(&(objectClass=posixGroup)(memberUid={escape_filter_chars(name)}))",
        ["gidNumber"],
    )
    ids = {_number(_first(attrs, "gidNumber")) for dn, attrs in found if dn}
    return sorted(i for i in ids if i is not None)


@transaction.atomic
def remember(user: User, ldap_user: Any) -> None:
    """What the directory said at this sign-in (or check): the entry, and the Unix identity
    where the entry is a posixAccount. A person the directory had refused, let in again, is
    active again; one an admin deactivated stays so (the login form then says so)."""
    account, _ = DirectoryAccount.objects.update_or_create(
        user=user, defaults={"dn": ldap_user.dn, "checked": timezone.now()}
    )
    if account.refused and not user.is_active:
        user.is_active = True
        user.save(update_fields=["is_active"])
    if account.refused:
        account.refused = ""
        account.save(update_fields=["refused"])
    attrs = ldap_user.attrs
    uid, gid = _number(_first(attrs, "uidNumber")), _number(_first(attrs, "gidNumber"))
    name = _first(attrs, "uid") or user.get_username()
    if uid is None or gid is None:
        return  # no posixAccount: no Unix identity from the directory
    UnixAccount.objects.update_or_create(
        user=user,
        defaults={
            "username": name,
            "uid": uid,
            "gid": gid,
            "groups": group_ids(ldap_user, name),
            "from_directory": True,
        },
    )


def refusal(user: Any) -> str:
    """Why the directory no longer lets this person (a user just populated from it) in; ""
    if it does."""
    ldap_user = user.ldap_user
    groups = {dn.lower() for dn in ldap_user.group_dns}
    required = settings.AUTH_LDAP_REQUIRE_GROUP
    if required and str(required).lower() not in groups:
        return f"no longer in the directory group {required}"
    denied = settings.AUTH_LDAP_DENY_GROUP
    if denied and str(denied).lower() in groups:
        return f"in the directory group {denied}"
    if _first(ldap_user.attrs, "pwdAccountLockedTime"):
        return "their directory account is locked"
    expires = _number(_first(ldap_user.attrs, "shadowExpire"))
    if expires is not None and datetime.date(1970, 1, 1) + datetime.timedelta(expires) <= (
        timezone.now().date()
    ):
        return "their directory account has expired"
    return ""


def _note_error(context: str, exception: Exception, **_: Any) -> None:
    if getattr(_errors, "checking", False):
        _errors.found = f"{context}: {exception}"


ldap_error.connect(_note_error, dispatch_uid="trainyard-directory-check")


@transaction.atomic
def refuse(account: DirectoryAccount, why: str) -> None:
    """Deactivate a person the directory no longer lets in, as an admin's deactivation does."""
    users.deactivate(account.user)
    account.refused = why[:300]
    account.save(update_fields=["refused"])
    log.info("signed %s out: %s", account.user.get_username(), why)


def check_accounts() -> int:
    """Ask the directory about every active person it signed in; how many it no longer lets
    in. Nobody changes in a pass the directory did not answer."""
    backend = LDAPBackend()
    accounts = DirectoryAccount.objects.select_related("user").filter(
        user__is_active=True, via="ldap"
    )
    verdicts: list[tuple[DirectoryAccount, str]] = []
    _errors.checking, _errors.found = True, ""
    try:
        for account in accounts:
            user = backend.populate_user(account.user.get_username())
            if _errors.found:
                log.warning("the directory did not answer (%s): nobody changed", _errors.found)
                return 0
            why = "no longer in the directory" if user is None else refusal(user)
            if not why:
                remember(user, user.ldap_user)
            verdicts.append((account, why))
    finally:
        _errors.checking = False
    refused = [(a, why) for a, why in verdicts if why]
    for account, why in refused:
        refuse(account, why)
    return len(refused)


class DirectoryCheck(PeriodicPass[int]):
    what = "directory check"

    def one_pass(self) -> int:
        return check_accounts()
