"""Sign-in through the organisation's OpenID Connect provider (mozilla-django-oidc; settings from
console/sso_settings.py): the authorization code flow with PKCE, the ID token's signature
checked against the provider's keys, and what the provider says of the person kept here, as
jobs/directory.py keeps what an LDAP directory says:

- the person is found by the provider's subject (`sub`), never by name or e-mail alone: a
  console user is theirs only if the provider signed them in before (DirectoryAccount, via
  "oidc"). A local account that has the name the provider gives is not taken over: the sign-in
  is refused, saying so, until an admin renames one of the two;
- at each sign-in: name and e-mail, their groups (the provider's `groups` claim, all of them
  or the ones TRAINYARD_OIDC_GROUPS names: quotas and fair share are set on them), staff from
  the staff group, and their Unix identity where the provider gives the numbers (the claims
  TRAINYARD_OIDC_UID_CLAIM, _GID_CLAIM and _GIDS_CLAIM name): UnixAccount, from_directory;
- a person outside TRAINYARD_OIDC_REQUIRE_GROUP is refused, and the login page says why.
Such a person has no password of the console's.
"""

import logging
from typing import Any

from django.conf import settings
from django.contrib.auth import views as auth_views
from django.contrib.auth.models import Group, User
from django.db import transaction
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from django.utils import timezone

from jobs.login_throttle import LoginForm
from jobs.models import DirectoryAccount, UnixAccount

log = logging.getLogger(__name__)

VIA = "oidc"
REFUSAL_KEY = "trainyard_sso_refused"  # in the session: why the last sign-in was refused


def configured() -> bool:
    return bool(settings.TRAINYARD_OIDC_CLIENT_ID)


def _claim(name: str) -> str:
    return str(settings.TRAINYARD_OIDC_CLAIMS[name])


def subject_of(claims: dict[str, Any]) -> str:
    """Whom the provider says this is, for good: its subject, beside its token endpoint."""
    return f"{claims.get('sub', '')} at {settings.OIDC_OP_TOKEN_ENDPOINT}"[:500]


def _number(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int) or (isinstance(value, str) and value.isdigit()):
        return int(value)
    return None


def groups_of(claims: dict[str, Any]) -> list[str]:
    found = claims.get(_claim("GROUPS"), [])
    return [str(g) for g in found] if isinstance(found, list) else []


def refusal(claims: dict[str, Any]) -> str:
    """Why these claims do not let the person in; "" where they do."""
    if not claims.get("sub"):
        return "the provider gave no subject (sub) for you"
    username = claims.get(_claim("USERNAME"))
    if not isinstance(username, str) or not username.strip():
        return f"the provider gave no user name ({_claim('USERNAME')}) for you"
    required = settings.TRAINYARD_OIDC_REQUIRE_GROUP
    if required and required not in groups_of(claims):
        return f"you are not in the group {required}, which this console requires"
    return ""


class SingleSignOnBackend:
    """mozilla-django-oidc's backend, with the console's rules for whom a sign-in is."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        # Imported here: a console without single sign-on needs no mozilla-django-oidc.
        from mozilla_django_oidc.auth import OIDCAuthenticationBackend

        class Backend(OIDCAuthenticationBackend):
            def verify_claims(self, claims: dict[str, Any]) -> bool:
                why = refusal(claims)
                if why:
                    _tell(self.request, why)
                return not why

            def filter_users_by_claims(self, claims: dict[str, Any]) -> QuerySet[User]:
                return User.objects.filter(
                    directory_account__via=VIA, directory_account__dn=subject_of(claims)
                )

            def create_user(self, claims: dict[str, Any]) -> User | None:
                username = str(claims[_claim("USERNAME")]).strip()
                if User.objects.filter(username=username).exists():
                    _tell(
                        self.request,
                        f"an account named {username} exists here already, not made by this "
                        "sign-in: an admin renames one of the two",
                    )
                    return None
                with transaction.atomic():
                    user = User.objects.create_user(username)  # no usable password
                    remember(user, claims)
                return user

            def update_user(self, user: User, claims: dict[str, Any]) -> User:
                remember(user, claims)
                return user

        return Backend(*args, **kwargs)


def _tell(request: HttpRequest | None, why: str) -> None:
    log.info("single sign-on refused: %s", why)
    if request is not None and hasattr(request, "session"):
        request.session[REFUSAL_KEY] = why


@transaction.atomic
def remember(user: User, claims: dict[str, Any]) -> None:
    """What the provider said at this sign-in: who they are, their groups and staff rights,
    and their Unix identity where it gives the numbers."""
    user.first_name = str(claims.get("given_name") or claims.get("name") or "")[:150]
    user.last_name = str(claims.get("family_name") or "")[:150]
    user.email = str(claims.get("email") or user.email)[:254]
    groups = groups_of(claims)
    staff_group = settings.TRAINYARD_OIDC_STAFF_GROUP
    if staff_group:
        user.is_staff = staff_group in groups
    user.save()
    managed = settings.TRAINYARD_OIDC_GROUPS
    wanted = [g for g in groups if not managed or g in managed]
    kept = [] if not managed else list(user.groups.exclude(name__in=managed))
    user.groups.set(kept + [Group.objects.get_or_create(name=name)[0] for name in wanted])
    DirectoryAccount.objects.update_or_create(
        user=user,
        defaults={"dn": subject_of(claims), "via": VIA, "checked": timezone.now(), "refused": ""},
    )
    uid, gid = _number(claims.get(_claim("UID"))), _number(claims.get(_claim("GID")))
    if uid is None or gid is None:
        return  # the provider gives no Unix identity
    found = claims.get(_claim("GIDS"), [])
    extra = (
        [n for n in (_number(g) for g in found) if n is not None] if isinstance(found, list) else []
    )
    UnixAccount.objects.update_or_create(
        user=user,
        defaults={
            "username": user.get_username(),
            "uid": uid,
            "gid": gid,
            "groups": extra,
            "from_directory": True,
        },
    )


class LoginView(auth_views.LoginView):
    """The console's login page: a password of the console's (or the LDAP directory's), and
    the organisation's single sign-on where it is set, saying why it last refused."""

    authentication_form = LoginForm

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        if configured():
            context["single_sign_on"] = settings.TRAINYARD_OIDC_NAME
            context["single_sign_on_refused"] = self.request.session.pop(REFUSAL_KEY, "")
        return context


def start(request: HttpRequest) -> HttpResponse:
    """To the provider (mozilla-django-oidc's view), where single sign-on is set."""
    if not configured():
        raise Http404("single sign-on is not set up here")
    from mozilla_django_oidc.views import OIDCAuthenticationRequestView

    return OIDCAuthenticationRequestView.as_view()(request)


def callback(request: HttpRequest) -> HttpResponse:
    """Back from the provider: the code, exchanged and checked (mozilla-django-oidc's view)."""
    if not configured():
        raise Http404("single sign-on is not set up here")
    from mozilla_django_oidc.views import OIDCAuthenticationCallbackView

    return OIDCAuthenticationCallbackView.as_view()(request)
