"""A private OpenID Connect provider, for the tests and for trying single sign-on on one
machine: django-oauth-toolkit's provider (authorization code with PKCE, RS256 ID tokens,
userinfo, JWKS, discovery) in a small Django project of its own, with its own SQLite database
in a folder of its own, serving on 127.0.0.1. It is not the console: it stands for the
organisation's provider (Keycloak, Dex, Authentik, Entra ID).

    python -m stack.oidc_provider FOLDER --port PORT --people people.json \\
        --client-id ID --client-secret SECRET --redirect-uri URI

people.json: [{"username", "password", "name", "email", "groups": [...], "uidNumber",
"gidNumber", "gidNumbers": [...]}]: each a person who may sign in, and the claims the
provider gives about them: `groups` (scope groups) and the POSIX numbers (scope posix), as
providers that front an LDAP directory map them. Start it with `private_provider`, which
waits until it answers and stops it after.
"""

import argparse
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import httpx

ROOT = Path(__file__).resolve().parent.parent
START_TIMEOUT_SECONDS = 60
LOGIN_TEMPLATE = """<!doctype html><title>Example organisation · sign in</title>
<h1>Example organisation</h1>
{% if form.errors %}<p class="error">Wrong user name or password.</p>{% endif %}
<form method="post">{% csrf_token %}
<label>User name <input name="username" autofocus></label>
<label>Password <input name="password" type="password"></label>
<input type="hidden" name="next" value="{{ next }}">
<button type="submit">Sign in</button></form>"""
# Claims beyond the standard ones, and the scope that releases each.
EXTRA_CLAIM_SCOPES = {"groups": "groups", "uidNumber": "posix", "gidNumber": "posix",
                      "gidNumbers": "posix"}  # fmt: skip


@dataclass(frozen=True)
class Provider:
    url: str  # the issuer: http://127.0.0.1:PORT/o
    client_id: str
    client_secret: str

    def endpoint(self, name: str) -> str:
        paths = {"authorization": "authorize/", "token": "token/", "userinfo": "userinfo/",
                 "jwks": ".well-known/jwks.json"}  # fmt: skip
        return f"{self.url}/{paths[name]}"

    def console_env(self) -> dict[str, str]:
        """The TRAINYARD_OIDC_* a console signs in through this provider with."""
        return {
            "TRAINYARD_OIDC_CLIENT_ID": self.client_id,
            "TRAINYARD_OIDC_CLIENT_SECRET": self.client_secret,
            "TRAINYARD_OIDC_AUTHORIZATION_ENDPOINT": self.endpoint("authorization"),
            "TRAINYARD_OIDC_TOKEN_ENDPOINT": self.endpoint("token"),
            "TRAINYARD_OIDC_USERINFO_ENDPOINT": self.endpoint("userinfo"),
            "TRAINYARD_OIDC_JWKS_ENDPOINT": self.endpoint("jwks"),
        }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def private_provider(
    folder: Path, people: list[dict[str, Any]], redirect_uri: str
) -> Iterator[Provider]:
    """A provider for `people`, letting in the client that comes back to `redirect_uri`;
    stopped (by its PID) when the block ends."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "people.json").write_text(json.dumps(people))
    port = _free_port()
    provider = Provider(f"http://127.0.0.1:{port}/o", "trainyard-console", os.urandom(16).hex())
    argv = [
        sys.executable, "-m", "stack.oidc_provider", str(folder), "--port", str(port),
        "--people", str(folder / "people.json"), "--client-id", provider.client_id,
        "--client-secret", provider.client_secret, "--redirect-uri", redirect_uri,
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("DJANGO_")}
    log = (folder / "provider.log").open("ab")
    process = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while True:
            if process.poll() is not None:
                said = (folder / "provider.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"the OpenID Connect provider ended at its start:\n{said}")
            try:
                if httpx.get(f"{provider.url}/.well-known/openid-configuration").is_success:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the OpenID Connect provider did not answer in time")
            time.sleep(0.1)
        yield provider
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


# --- the provider process ----------------------------------------------------------------------


def _configure(folder: Path, people_file: Path) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from django.conf import settings

    key_file = folder / "signing-key.pem"
    if not key_file.exists():
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        key_file.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        key_file.chmod(0o600)
    settings.configure(
        DEBUG=False,
        SECRET_KEY=os.urandom(32).hex(),
        ALLOWED_HOSTS=["127.0.0.1", "localhost"],
        ROOT_URLCONF="stack.oidc_provider",
        INSTALLED_APPS=[
            "django.contrib.auth",
            "django.contrib.contenttypes",
            "django.contrib.sessions",
            "oauth2_provider",
        ],
        MIDDLEWARE=[
            "django.contrib.sessions.middleware.SessionMiddleware",
            "django.middleware.csrf.CsrfViewMiddleware",
            "django.contrib.auth.middleware.AuthenticationMiddleware",
        ],
        DATABASES={
            "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": str(folder / "db.sqlite3")}
        },
        TEMPLATES=[
            {
                "BACKEND": "django.template.backends.django.DjangoTemplates",
                "OPTIONS": {
                    "loaders": [
                        ("django.template.loaders.locmem.Loader", {"login.html": LOGIN_TEMPLATE})
                    ],
                    "context_processors": ["django.template.context_processors.csrf"],
                },
            }
        ],
        LOGIN_URL="/login/",
        USE_TZ=True,
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher"],  # a test's, quick
        OAUTH2_PROVIDER={
            "OIDC_ENABLED": True,
            "OIDC_RSA_PRIVATE_KEY": key_file.read_text(),
            "PKCE_REQUIRED": True,
            "SCOPES": {
                "openid": "Who you are",
                "profile": "Your name",
                "email": "Your e-mail address",
                "groups": "Your groups",
                "posix": "Your Unix identity",
            },
            "OAUTH2_VALIDATOR_CLASS": "stack.oidc_provider.PeopleValidator",
        },
    )
    global _people_file
    _people_file = people_file


# The people file of this provider's process (set by _configure).
_people_file: Path | None = None


def _people() -> dict[str, dict[str, Any]]:
    assert _people_file is not None
    people = json.loads(_people_file.read_text())
    return {p["username"]: p for p in people}


def _validator_class() -> type:
    from oauth2_provider.oauth2_validators import OAuth2Validator

    class PeopleValidator(OAuth2Validator):
        oidc_claim_scope = {**OAuth2Validator.oidc_claim_scope, **EXTRA_CLAIM_SCOPES}

        def get_additional_claims(self, request: Any) -> dict[str, Any]:
            person = _people()[request.user.username]
            claims = {
                "preferred_username": person["username"],
                "name": person.get("name", ""),
                "email": person.get("email", ""),
                "groups": person.get("groups", []),
            }
            for number in ("uidNumber", "gidNumber", "gidNumbers"):
                if number in person:
                    claims[number] = person[number]
            return claims

    return PeopleValidator


def __getattr__(name: str) -> Any:
    # The project's urlconf and validator exist only in the provider's process, once Django is
    # configured there (importing them anywhere else needs no django-oauth-toolkit).
    if name == "urlpatterns":
        from django.contrib.auth import views as auth_views
        from django.urls import include, path

        return [
            path("login/", auth_views.LoginView.as_view(template_name="login.html")),
            path("o/", include("oauth2_provider.urls", namespace="oauth2_provider")),
        ]
    if name == "PeopleValidator":
        return _validator_class()
    raise AttributeError(name)


def _seed(people_file: Path, client_id: str, client_secret: str, redirect_uri: str) -> None:
    from django.contrib.auth.models import User
    from django.core.management import call_command
    from oauth2_provider.models import Application

    call_command("migrate", verbosity=0)
    for person in json.loads(people_file.read_text()):
        user, _ = User.objects.get_or_create(username=person["username"])
        user.set_password(person["password"])
        user.is_active = person.get("active", True)
        user.save()
    Application.objects.update_or_create(
        client_id=client_id,
        defaults={
            "name": "Trainyard",
            "client_secret": client_secret,
            "client_type": Application.CLIENT_CONFIDENTIAL,
            "authorization_grant_type": Application.GRANT_AUTHORIZATION_CODE,
            "redirect_uris": redirect_uri,
            "algorithm": Application.RS256_ALGORITHM,
            "skip_authorization": True,  # the organisation's own console: no consent page
        },
    )


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        sys.stderr.write(f"{self.address_string()} {format % args}\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m stack.oidc_provider")
    parser.add_argument("folder", type=Path)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--people", type=Path, required=True)
    parser.add_argument("--client-id", required=True)
    parser.add_argument("--client-secret", required=True)
    parser.add_argument("--redirect-uri", required=True)
    args = parser.parse_args(argv)
    _configure(args.folder, args.people)
    import django
    from django.core.wsgi import get_wsgi_application

    django.setup()
    _seed(args.people, args.client_id, args.client_secret, args.redirect_uri)
    server = make_server(
        "127.0.0.1", args.port, get_wsgi_application(), _ThreadingServer, _QuietHandler
    )
    server.serve_forever()


if __name__ == "__main__":
    # As stack.oidc_provider, the module Django finds the urlconf and validator in, so that
    # they see what main() set up (not in a second copy of this module, __main__'s).
    from stack import oidc_provider

    oidc_provider.main()
