"""Make (or rotate) a node agent's credentials and print its REDIS_URL, once:

    python manage.py agent_credentials NODE [NODE ...] [--host HOST] [--port PORT]

One URL a line, in the order of the nodes. The database keeps only the hash of the secret and
the report-signing key derived from it (jobs.models.AgentCredential); the URL is not shown
again: run the command again to rotate (the old secret stops working at once).
"""

from typing import Any

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
        for node in options["nodes"]:  # all checked before any is made
            try:
                credentials.check_node_name(node)
            except credentials.CredentialError as exc:
                raise CommandError(str(exc)) from None
        for node in options["nodes"]:
            self.stdout.write(agent_access.issue_url(node, options["host"], options["port"]))
