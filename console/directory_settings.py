"""django-auth-ldap's settings from Trainyard's environment variables (docs/deploy.md, "Signing
in through a directory"), read only where TRAINYARD_LDAP_URL is set: a console without a
directory needs neither python-ldap nor any of this.

A site names its server, the account the console searches with, where people and groups are,
and which groups make staff; django-auth-ldap does the LDAP. Groups are posixGroups (memberUid),
as the directories that hold Unix identities write them, mirrored as the console's groups
(quotas and fair share are set on those): all of them, or the ones TRAINYARD_LDAP_GROUPS names.
"""

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from django.core.exceptions import ImproperlyConfigured


def secret(env: Mapping[str, str], name: str) -> str:
    """A value, or the contents of the file NAME_FILE names (a container's secret)."""
    path = env.get(f"{name}_FILE")
    return Path(path).read_text().strip() if path else env.get(name, "")


def ldap_settings(env: Mapping[str, str]) -> dict[str, Any]:
    import ldap
    from django_auth_ldap.config import LDAPSearch, PosixGroupType

    user_base = env.get("TRAINYARD_LDAP_USER_BASE", "")
    group_base = env.get("TRAINYARD_LDAP_GROUP_BASE", "")
    if not user_base or not group_base:
        raise ImproperlyConfigured(
            "TRAINYARD_LDAP_URL is set: set TRAINYARD_LDAP_USER_BASE (where people are, e.g. "
            "ou=people,dc=example,dc=org) and TRAINYARD_LDAP_GROUP_BASE (where their groups are)"
        )
    groups = [g.strip() for g in env.get("TRAINYARD_LDAP_GROUPS", "").split(",") if g.strip()]
    found: dict[str, Any] = {
        "AUTH_LDAP_SERVER_URI": env["TRAINYARD_LDAP_URL"],
        "AUTH_LDAP_START_TLS": env.get("TRAINYARD_LDAP_START_TLS", "") in ("1", "true", "yes"),
        "AUTH_LDAP_BIND_DN": env.get("TRAINYARD_LDAP_BIND_DN", ""),
        "AUTH_LDAP_BIND_PASSWORD": secret(env, "TRAINYARD_LDAP_BIND_PASSWORD"),
        "AUTH_LDAP_USER_SEARCH": LDAPSearch(
            user_base, ldap.SCOPE_SUBTREE, env.get("TRAINYARD_LDAP_USER_FILTER", "(uid=%(user)s)")
        ),
        "AUTH_LDAP_GROUP_SEARCH": LDAPSearch(
            group_base, ldap.SCOPE_SUBTREE, "(objectClass=posixGroup)"
        ),
        "AUTH_LDAP_GROUP_TYPE": PosixGroupType(name_attr="cn"),
        # The directory is the authority on a person's groups: each sign-in sets them.
        "AUTH_LDAP_MIRROR_GROUPS": groups or True,
        "AUTH_LDAP_REQUIRE_GROUP": env.get("TRAINYARD_LDAP_REQUIRE_GROUP") or None,
        "AUTH_LDAP_DENY_GROUP": env.get("TRAINYARD_LDAP_DENY_GROUP") or None,
        "AUTH_LDAP_USER_ATTR_MAP": {"first_name": "givenName", "last_name": "sn", "email": "mail"},
        # The operational attributes too: pwdAccountLockedTime says an account is locked.
        "AUTH_LDAP_USER_ATTRLIST": ["*", "+"],
        "AUTH_LDAP_CONNECTION_OPTIONS": {ldap.OPT_NETWORK_TIMEOUT: 10, ldap.OPT_TIMEOUT: 10},
        "TRAINYARD_LDAP_GROUP_BASE": group_base,
    }
    staff = env.get("TRAINYARD_LDAP_STAFF_GROUP")
    if staff:
        found["AUTH_LDAP_USER_FLAGS_BY_GROUP"] = {"is_staff": staff}
    return found
