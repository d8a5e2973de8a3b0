"""Make (or rotate) a node agent's credentials and print its REDIS_URL, once:

    python manage.py agent_credentials NODE [NODE ...] [--host HOST] [--port PORT]

One URL a line, in the order of the nodes. The database keeps only the hash of the secret and
the report-signing key derived from it (jobs.models.AgentCredential); the URL is not shown
again: run the command again to rotate (the old secret stops working at once).
"""

import urllib.parse
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from jobs.services import agent_access
from workers import credentials


class Command(BaseCommand):
    help = "Make or rotate node agents' credentials; prints each agent's REDIS_URL once."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("nodes", nargs="+", metavar="NODE")
        parser.add_argument(
            "--host", help="the Redis host as the agent reaches it (default: REDIS_URL's)"
        )
        parser.add_argument("--port", type=int, help="the Redis port (default: REDIS_URL's)")

    def handle(self, *args: Any, **options: Any) -> None:
        ours = urllib.parse.urlsplit(settings.REDIS_URL or "redis://127.0.0.1:6379/0")
        host = options["host"] or ours.hostname or "127.0.0.1"
        port = options["port"] or ours.port or 6379
        db = int((ours.path or "/0").lstrip("/") or 0)
        for node in options["nodes"]:
            try:
                credentials.check_node_name(node)
            except credentials.CredentialError as exc:
                raise CommandError(str(exc)) from None
        for node in options["nodes"]:
            secret = agent_access.issue(node)
            self.stdout.write(credentials.agent_url(node, secret, host, port, db, ours.scheme))
