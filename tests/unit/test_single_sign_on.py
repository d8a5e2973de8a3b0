"""Sign-in through the organisation's OpenID Connect provider (jobs/single_sign_on.py), against
a real provider run for these tests (django-oauth-toolkit's, stack/oidc_provider.py): the
console's own login page and callback, the authorization code flow with PKCE over real HTTP,
the ID token's RS256 signature checked against the provider's keys.

- a person the provider signs in becomes the console's user with their groups (for quotas),
  staff from the staff group, and their Unix identity from the provider's POSIX claims, which
  their jobs then run as; signing in again is the same user;
- a person outside the required group is refused, and the login page says why; so is one whose
  name is a local account's (no account is taken over by a name); a wrong password at the
  provider signs nobody in;
- without single sign-on set up, neither the button nor the paths exist.
"""

import io
import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from django.contrib.auth.models import User
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client

from jobs.models import DirectoryAccount, UnixAccount
from jobs.services import identity
from stack import oidc_provider

pytestmark = pytest.mark.django_db(transaction=True)

CALLBACK = "http://testserver/oidc/callback/"
PEOPLE: list[dict[str, Any]] = [
    {"username": "ada", "password": "ada-sso-pw", "name": "Ada Tester", "email": "ada@example.org",
     "groups": ["trainyard-users", "vision"], "uidNumber": 20001, "gidNumber": 20001,
     "gidNumbers": [30000, 30001]},
    {"username": "grace", "password": "grace-sso-pw", "email": "grace@example.org",
     "groups": ["trainyard-users", "ml-admins"]},
    {"username": "mallory", "password": "mallory-sso-pw", "groups": ["contractors"]},
    {"username": "eve", "password": "eve-sso-pw", "groups": ["trainyard-users"]},
]  # fmt: skip


@pytest.fixture(scope="module")
def provider(tmp_path_factory: pytest.TempPathFactory) -> Iterator[oidc_provider.Provider]:
    with oidc_provider.private_provider(tmp_path_factory.mktemp("oidc"), PEOPLE, CALLBACK) as p:
        yield p


def console_settings(provider: oidc_provider.Provider, **more: str) -> dict[str, Any]:
    from console.sso_settings import oidc_settings

    return oidc_settings(
        {
            **provider.console_env(),
            "TRAINYARD_OIDC_NAME": "Example SSO",
            "TRAINYARD_OIDC_REQUIRE_GROUP": "trainyard-users",
            "TRAINYARD_OIDC_STAFF_GROUP": "ml-admins",
            **more,
        }
    )


@pytest.fixture
def signs_in_through(provider: oidc_provider.Provider, settings: Any) -> oidc_provider.Provider:
    """The console set up as a site sets it: TRAINYARD_OIDC_* read by console/settings.py."""
    for name, value in console_settings(provider).items():
        setattr(settings, name, value)
    settings.TRAINYARD_OIDC_CLIENT_ID = provider.client_id
    settings.AUTHENTICATION_BACKENDS = [
        "jobs.login_throttle.ThrottledModelBackend",
        "jobs.single_sign_on.SingleSignOnBackend",
    ]
    return provider


def sign_in(client: Client, username: str, password: str) -> str:
    """Through the console's button, the provider's login page and back: where the console
    sent the browser at the end."""
    started = client.get("/oidc/authenticate/")
    assert started.status_code == 302, started
    authorize = started["Location"]
    with httpx.Client() as browser:  # the provider's side of the browser
        to_login = browser.get(authorize)
        assert to_login.status_code == 302, to_login.text
        login_url = httpx.URL(authorize).join(to_login.headers["location"])
        form = browser.get(login_url)
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text)
        assert token is not None, form.text
        after = browser.post(
            login_url,
            data={"username": username, "password": password,
                  "csrfmiddlewaretoken": token.group(1), "next": login_url.params["next"]},
        )  # fmt: skip
        if after.status_code != 302:
            return "stayed at the provider"
        back = browser.get(httpx.URL(authorize).join(after.headers["location"]))
        assert back.status_code == 302, back.text
        callback = back.headers["location"]
    assert callback.startswith(CALLBACK), callback
    parts = urlsplit(callback)
    done = client.get(f"{parts.path}?{parts.query}")
    assert done.status_code == 302, done
    return str(done["Location"])


def test_a_person_the_provider_signs_in_brings_their_groups_and_unix_identity(
    signs_in_through: oidc_provider.Provider, client: Client
) -> None:
    page = client.get("/accounts/login/").content.decode()
    assert "Sign in with Example SSO" in page
    assert sign_in(client, "ada", "ada-sso-pw") == "/"
    ada = User.objects.get(username="ada")
    assert (ada.first_name, ada.email, ada.is_staff, ada.has_usable_password()) == (
        "Ada Tester", "ada@example.org", False, False
    )  # fmt: skip
    assert sorted(ada.groups.values_list("name", flat=True)) == ["trainyard-users", "vision"]
    account = DirectoryAccount.objects.get(user=ada)
    assert account.via == "oidc" and account.dn.endswith(f"at {signs_in_through.endpoint('token')}")
    unix = UnixAccount.objects.get(user=ada)
    assert (unix.uid, unix.gid, unix.groups, unix.from_directory) == (
        20001, 20001, [30000, 30001], True
    )  # fmt: skip
    # Her jobs run as that identity.
    assert identity.unix_identity_of(ada) == identity.Resolved(20001, 20001, (20001, 30000, 30001))
    profile = client.get("/account/").content.decode()
    assert "through the organisation&#x27;s single sign-on" in profile or (
        "through the organisation's single sign-on" in profile
    )
    assert "uid 20001 · gid 20001" in profile
    # Again, in another browser: the same person, not a second account.
    assert sign_in(Client(), "ada", "ada-sso-pw") == "/"
    assert User.objects.filter(username__startswith="ada").count() == 1
    # Staff comes from the staff group; no POSIX claims, no Unix identity.
    assert sign_in(Client(), "grace", "grace-sso-pw") == "/"
    grace = User.objects.get(username="grace")
    assert grace.is_staff and identity.unix_identity_of(grace) is None


def test_who_the_console_does_not_let_in_is_told_why(
    signs_in_through: oidc_provider.Provider, client: Client
) -> None:
    assert sign_in(client, "mallory", "mallory-sso-pw") == "/accounts/login/"
    said = client.get("/accounts/login/").content.decode()
    assert (
        "Example SSO did not let you in here: you are not in the group trainyard-users, which "
        "this console requires." in said
    )
    assert not User.objects.filter(username="mallory").exists()
    # A local account of that name is not taken over.
    User.objects.create_user("eve", password="eve-local-password-1")
    assert sign_in(Client(), "eve", "eve-sso-pw") == "/accounts/login/"
    assert not DirectoryAccount.objects.filter(user__username="eve").exists()
    # A wrong password at the provider: nobody signs in here.
    assert sign_in(Client(), "ada", "not-her-password") == "stayed at the provider"
    assert not User.objects.filter(username="ada").exists()


def test_without_single_sign_on_there_is_no_button_and_no_path(client: Client) -> None:
    assert "Sign in with" not in client.get("/accounts/login/").content.decode()
    assert client.get("/oidc/authenticate/").status_code == 404
    assert client.get("/oidc/callback/?code=x&state=y").status_code == 404


def test_the_settings_say_what_is_missing(provider: oidc_provider.Provider) -> None:
    from console.sso_settings import oidc_settings

    env = provider.console_env()
    del env["TRAINYARD_OIDC_JWKS_ENDPOINT"]
    with pytest.raises(ImproperlyConfigured, match="set TRAINYARD_OIDC_JWKS_ENDPOINT as well"):
        oidc_settings(env)
    assert console_settings(provider)["OIDC_OP_TOKEN_ENDPOINT"] == provider.endpoint("token")


def test_the_endpoints_come_from_the_providers_discovery_document(
    provider: oidc_provider.Provider,
) -> None:
    out = io.StringIO()
    call_command("oidc_endpoints", provider.url, stdout=out)
    assert out.getvalue().splitlines() == [
        f"{name}={value}" for name, value in provider.console_env().items() if "ENDPOINT" in name
    ]
    with pytest.raises(CommandError, match=re.escape("could not read http://127.0.0.1:9/")):
        call_command("oidc_endpoints", "http://127.0.0.1:9")
