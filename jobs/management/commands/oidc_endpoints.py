"""`manage.py oidc_endpoints ISSUER`: the TRAINYARD_OIDC_*_ENDPOINT lines for console.env,
read from the provider's discovery document (ISSUER/.well-known/openid-configuration), so that
an admin copies what the provider says rather than guessing its paths. The console reads the
endpoints from its settings, not from the provider at each start: it starts while the
provider is away too."""

import json
import urllib.error
import urllib.request
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

DISCOVERY_KEYS = {
    "AUTHORIZATION": "authorization_endpoint",
    "TOKEN": "token_endpoint",
    "USERINFO": "userinfo_endpoint",
    "JWKS": "jwks_uri",
}


class Command(BaseCommand):
    help = "Print the TRAINYARD_OIDC_*_ENDPOINT settings from an OpenID Connect issuer."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("issuer", help="e.g. https://sso.example.org/realms/research")

    def handle(self, *args: Any, **options: Any) -> None:
        issuer = str(options["issuer"]).rstrip("/")
        if not issuer.startswith(("https://", "http://")):
            raise CommandError(f"{issuer!r} is not an http(s) address")
        url = f"{issuer}/.well-known/openid-configuration"
        try:
            with urllib.request.urlopen(url, timeout=10) as answer:  # noqa: S310 (http(s) only)
                found = json.loads(answer.read())
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise CommandError(f"could not read {url}: {exc}") from None
        missing = [key for key in DISCOVERY_KEYS.values() if not found.get(key)]
        if missing:
            raise CommandError(f"{url} does not give {', '.join(missing)}")
        for name, key in DISCOVERY_KEYS.items():
            self.stdout.write(f"TRAINYARD_OIDC_{name}_ENDPOINT={found[key]}")
