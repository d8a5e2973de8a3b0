"""Sign-in through an LDAP directory (jobs/directory.py) against a real OpenLDAP slapd started
for these tests (stack/directory.py), through the console's real login page, API and ASGI
websockets on the real Redis channel layer:

- a person signs in with their directory password; their groups become the console's (for
  quotas), the staff group makes staff, and their Unix identity (posixAccount, posixGroups) is
  kept and shown on their profile page;
- the login throttle holds for directory sign-ins as for local ones; local accounts still sign
  in; a directory person cannot sign in with a password of the console's;
- disabling them in the directory (out of the required group) signs them out at the next
  check: sessions, tokens and the streams opened with either end; let in again, they sign in;
- a check the directory does not answer changes nobody;
- a directory uid of a system account never runs a job.
"""

import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from jobs import login_throttle
from jobs.models import DirectoryAccount, Job, UnixAccount
from jobs.services.slurm import slurm_identity
from jobs.services.submission import check_job_request, submit_job
from stack import directory as slapd
from tests.conftest import required_here
from tests.unit.helpers import job_request
from tests.unit.test_revocation import close_of, issue, opened, stream

pytestmark = pytest.mark.django_db(transaction=True)

SUFFIX = "dc=trainyard,dc=test"
PEOPLE = f"ou=people,{SUFFIX}"
GROUPS = f"ou=groups,{SUFFIX}"
USERS_GROUP = f"cn=trainyard-users,{GROUPS}"
STAFF_GROUP = f"cn=ml-admins,{GROUPS}"


@pytest.fixture(scope="module")
def directory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[slapd.Directory]:
    missing = slapd.missing_tools()
    if importlib.util.find_spec("django_auth_ldap") is None:
        missing.append("django-auth-ldap")
    required_here("the directory tests", f"{', '.join(missing)} missing (make directory)"
                  if missing else None)  # fmt: skip
    with slapd.private_directory(tmp_path_factory.mktemp("slapd"), SUFFIX) as found:
        found.add(
            slapd.person("ada", 20001, 20001, "ada-directory-pw", SUFFIX)
            + slapd.person("grace", 20002, 20002, "grace-directory-pw", SUFFIX)
            + slapd.person("toor", 0, 0, "toor-pw", SUFFIX)
            + slapd.group("trainyard-users", 30000, ["ada", "grace", "toor"], SUFFIX)
            + slapd.group("vision", 30001, ["ada"], SUFFIX)
            + slapd.group("ml-admins", 30002, ["grace"], SUFFIX)
            # The console's own account in the directory, which it searches with.
            + f"dn: cn=trainyard,{SUFFIX}\nobjectClass: organizationalRole\n"
            "objectClass: simpleSecurityObject\ncn: trainyard\nuserPassword: console-pw\n\n"
        )
        yield found


@pytest.fixture
def signs_in_through(directory: slapd.Directory, settings: Any) -> slapd.Directory:
    """The console set up as a site sets it: TRAINYARD_LDAP_* read by console/settings.py."""
    from console.directory_settings import ldap_settings

    found = ldap_settings(
        {
            "TRAINYARD_LDAP_URL": directory.url,
            "TRAINYARD_LDAP_BIND_DN": f"cn=trainyard,{SUFFIX}",
            "TRAINYARD_LDAP_BIND_PASSWORD": "console-pw",
            "TRAINYARD_LDAP_USER_BASE": PEOPLE,
            "TRAINYARD_LDAP_GROUP_BASE": GROUPS,
            "TRAINYARD_LDAP_REQUIRE_GROUP": USERS_GROUP,
            "TRAINYARD_LDAP_STAFF_GROUP": STAFF_GROUP,
        }
    )
    for name, value in found.items():
        setattr(settings, name, value)
    settings.TRAINYARD_LDAP_URL = directory.url
    settings.AUTHENTICATION_BACKENDS = ["jobs.directory.ThrottledDirectoryBackend"]
    settings.TRAINYARD_LOGIN_FAILURES_PER_ACCOUNT = 3
    return directory


def log_in(username: str, password: str) -> Client:
    client = Client()
    page = client.post("/accounts/login/", {"username": username, "password": password})
    client.login_page = page  # type: ignore[attr-defined]
    return client


def signed_in(client: Client) -> bool:
    return client.get(reverse("job_list")).status_code == 200


def set_members(directory: slapd.Directory, group: str, members: list[str]) -> None:
    lines = "".join(f"memberUid: {m}\n" for m in members)
    directory.modify(f"dn: {group}\nchangetype: modify\nreplace: memberUid\n{lines}\n")


@pytest.mark.usefixtures("redis_url")
def test_a_person_signs_in_with_their_directory_password_and_brings_their_identity(
    signs_in_through: slapd.Directory,
) -> None:
    ada = log_in("ada", "ada-directory-pw")
    assert signed_in(ada)
    user = User.objects.get(username="ada")
    assert not user.has_usable_password() and not user.is_staff
    assert user.email == "ada@example.org"
    # Her directory groups are the console's groups now: quotas and fair share are set on them.
    assert set(user.groups.values_list("name", flat=True)) == {"trainyard-users", "vision"}
    account = UnixAccount.objects.get(user=user)
    assert (account.username, account.uid, account.gid) == ("ada", 20001, 20001)
    assert account.groups == [30000, 30001] and account.from_directory
    assert DirectoryAccount.objects.get(user=user).dn == f"uid=ada,{PEOPLE}"
    page = ada.get("/account/").content.decode()
    assert f"through the organisation's directory, as <code>uid=ada,{PEOPLE}</code>" in page
    assert "<code>ada</code> · uid 20001 · gid 20001 · groups 30000, 30001" in page
    assert "(from the directory)" in page
    # The staff group makes staff.
    log_in("grace", "grace-directory-pw")
    assert User.objects.get(username="grace").is_staff


@pytest.mark.usefixtures("redis_url")
def test_the_throttle_holds_and_local_accounts_still_sign_in(
    signs_in_through: slapd.Directory, alice: User
) -> None:
    try:
        for _ in range(3):
            assert not signed_in(log_in("ada", "a wrong guess"))
        locked = log_in("ada", "ada-directory-pw")
        assert not signed_in(locked)
        said = locked.login_page.content.decode()  # type: ignore[attr-defined]
        assert "Too many failed logins for this account" in said
    finally:
        login_throttle.lift(username="ada")  # the counts live in Redis, past this test
    # A console account (the admin of a small set-up) keeps its own password.
    alice.set_password("alice-local-pw")
    alice.save()
    assert signed_in(log_in(alice.get_username(), "alice-local-pw"))


@pytest.mark.usefixtures("redis_url")
def test_a_directory_person_has_no_console_password_to_fall_back_on(
    signs_in_through: slapd.Directory,
) -> None:
    assert signed_in(log_in("grace", "grace-directory-pw"))
    grace = User.objects.get(username="grace")
    grace.set_password("a-console-password")  # an admin's mistake, say
    grace.save()
    assert not signed_in(log_in("grace", "a-console-password"))


@pytest.mark.usefixtures("catalog", "code_root", "nodes", "redis_url", "sent_tasks")
async def test_disabled_in_the_directory_their_sessions_tokens_and_streams_end(
    signs_in_through: slapd.Directory,
) -> None:
    from jobs.directory import check_accounts

    ada = await database_sync_to_async(log_in)("ada", "ada-directory-pw")
    user = await User.objects.aget(username="ada")
    job = await database_sync_to_async(lambda: submit_job(user, check_job_request(job_request())))()
    _, key = await database_sync_to_async(issue)(user)
    cookie = f"sessionid={ada.cookies['sessionid'].value}"
    by_session = await opened(stream(job.pk, cookie=cookie))
    by_token = await opened(stream(job.pk, key))
    try:
        set_members(signs_in_through, USERS_GROUP, ["grace", "toor"])
        assert await database_sync_to_async(check_accounts)() == 1
    finally:
        set_members(signs_in_through, USERS_GROUP, ["ada", "grace", "toor"])
    for comm in (by_session, by_token):
        closed = await close_of(comm)
        assert closed["code"] == 4401, closed
    assert not await database_sync_to_async(signed_in)(ada)
    api = await database_sync_to_async(Client().get)(
        "/api/v1/jobs", HTTP_AUTHORIZATION=f"Token {key}"
    )
    assert api.status_code == 401
    account = await DirectoryAccount.objects.aget(user=user)
    assert account.refused == f"no longer in the directory group {USERS_GROUP}"
    # Let in again by the directory: she signs in, active again.
    again = await database_sync_to_async(log_in)("ada", "ada-directory-pw")
    assert await database_sync_to_async(signed_in)(again)
    assert await Job.objects.filter(owner=user).aexists()


@pytest.mark.usefixtures("redis_url")
def test_a_check_the_directory_does_not_answer_changes_nobody(
    signs_in_through: slapd.Directory, settings: Any
) -> None:
    from jobs.directory import check_accounts

    assert signed_in(log_in("ada", "ada-directory-pw"))
    settings.AUTH_LDAP_SERVER_URI = "ldap://127.0.0.1:9"  # nothing listens there
    assert check_accounts() == 0
    assert User.objects.get(username="ada").is_active


@pytest.mark.usefixtures("redis_url")
def test_a_directory_uid_of_a_system_account_never_runs_a_job(
    signs_in_through: slapd.Directory,
) -> None:
    assert signed_in(log_in("toor", "toor-pw"))  # signing in is the directory's business
    toor = User.objects.get(username="toor")
    assert UnixAccount.objects.get(user=toor).uid == 0
    with pytest.raises(slurm_identity.NoIdentity, match="has uid 0: root and system accounts"):
        slurm_identity.identity_of(toor)
    ada = log_in("ada", "ada-directory-pw")
    assert signed_in(ada)
    found = slurm_identity.identity_of(User.objects.get(username="ada"))
    assert (found.uid, found.gid, found.groups) == (20001, 20001, (20001, 30000, 30001))


@pytest.mark.usefixtures("directory")
def test_the_settings_say_what_is_missing(tmp_path: Path) -> None:
    from django.core.exceptions import ImproperlyConfigured

    from console.directory_settings import ldap_settings

    with pytest.raises(ImproperlyConfigured, match="set TRAINYARD_LDAP_USER_BASE"):
        ldap_settings({"TRAINYARD_LDAP_URL": "ldap://ldap.example.org"})
    secret = tmp_path / "bind-pw"
    secret.write_text("from-a-file\n")
    found = ldap_settings({
        "TRAINYARD_LDAP_URL": "ldap://ldap.example.org", "TRAINYARD_LDAP_USER_BASE": PEOPLE,
        "TRAINYARD_LDAP_GROUP_BASE": GROUPS, "TRAINYARD_LDAP_BIND_PASSWORD_FILE": str(secret),
        "TRAINYARD_LDAP_GROUPS": "vision, nlp",
    })  # fmt: skip
    assert found["AUTH_LDAP_BIND_PASSWORD"] == "from-a-file"
    assert found["AUTH_LDAP_MIRROR_GROUPS"] == ["vision", "nlp"]
    assert "AUTH_LDAP_USER_FLAGS_BY_GROUP" not in found
