"""mozilla-django-oidc's settings from Trainyard's environment variables (docs/deploy.md,
"Signing in through single sign-on"), read only where TRAINYARD_OIDC_CLIENT_ID is set.

A site registers the console with its OpenID Connect provider (Keycloak, Dex, Authentik, Entra
ID, …) as a confidential client whose redirect URI is https://CONSOLE/oidc/callback/, and names
the provider's endpoints (`python manage.py oidc_endpoints ISSUER` prints them from its
discovery document). Which claims hold a person's user name, groups and Unix numbers differs
between providers, so each is a setting (jobs/single_sign_on.py reads them).
"""

from collections.abc import Mapping
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from console.directory_settings import secret

ENDPOINTS = ("AUTHORIZATION", "TOKEN", "USERINFO", "JWKS")
DEFAULT_CLAIMS = {
    "USERNAME": "preferred_username",
    "GROUPS": "groups",
    "UID": "uidNumber",
    "GID": "gidNumber",
    "GIDS": "gidNumbers",
}


def oidc_settings(env: Mapping[str, str]) -> dict[str, Any]:
    missing = [
        f"TRAINYARD_OIDC_{e}_ENDPOINT"
        for e in ENDPOINTS
        if not env.get(f"TRAINYARD_OIDC_{e}_ENDPOINT")
    ]
    client_secret = secret(env, "TRAINYARD_OIDC_CLIENT_SECRET")
    if not client_secret:
        missing.append("TRAINYARD_OIDC_CLIENT_SECRET (or …_FILE)")
    if missing:
        raise ImproperlyConfigured(
            "TRAINYARD_OIDC_CLIENT_ID is set: set " + ", ".join(missing) + " as well (python "
            "manage.py oidc_endpoints ISSUER prints the endpoints)"
        )
    groups = [g.strip() for g in env.get("TRAINYARD_OIDC_GROUPS", "").split(",") if g.strip()]
    return {
        "OIDC_RP_CLIENT_ID": env["TRAINYARD_OIDC_CLIENT_ID"],
        "OIDC_RP_CLIENT_SECRET": client_secret,
        "OIDC_OP_AUTHORIZATION_ENDPOINT": env["TRAINYARD_OIDC_AUTHORIZATION_ENDPOINT"],
        "OIDC_OP_TOKEN_ENDPOINT": env["TRAINYARD_OIDC_TOKEN_ENDPOINT"],
        "OIDC_OP_USER_ENDPOINT": env["TRAINYARD_OIDC_USERINFO_ENDPOINT"],
        "OIDC_OP_JWKS_ENDPOINT": env["TRAINYARD_OIDC_JWKS_ENDPOINT"],
        "OIDC_RP_SIGN_ALGO": env.get("TRAINYARD_OIDC_SIGN_ALGORITHM", "RS256"),
        "OIDC_RP_SCOPES": env.get("TRAINYARD_OIDC_SCOPES", "openid profile email groups posix"),
        "OIDC_USE_PKCE": True,
        "OIDC_TIMEOUT": 10,
        # Where a refused sign-in lands: the login page, which says why (jobs/single_sign_on.py).
        "LOGIN_REDIRECT_URL_FAILURE": "/accounts/login/",
        "TRAINYARD_OIDC_NAME": env.get("TRAINYARD_OIDC_NAME", "your organisation's sign-in"),
        "TRAINYARD_OIDC_CLAIMS": {
            name: env.get(f"TRAINYARD_OIDC_{name}_CLAIM", default)
            for name, default in DEFAULT_CLAIMS.items()
        },
        "TRAINYARD_OIDC_GROUPS": groups,
        "TRAINYARD_OIDC_REQUIRE_GROUP": env.get("TRAINYARD_OIDC_REQUIRE_GROUP", ""),
        "TRAINYARD_OIDC_STAFF_GROUP": env.get("TRAINYARD_OIDC_STAFF_GROUP", ""),
    }
