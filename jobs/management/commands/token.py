"""Print a new API key for an existing user: python manage.py token USERNAME [--name NAME]"""

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from jobs.services import tokens


class Command(BaseCommand):
    help = "Print a new API token (Authorization: Token KEY) for an existing user."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument(
            "--name",
            default="manage.py",
            help="what the token is called on the user's API tokens page (default: manage.py)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        user = get_user_model().objects.filter(username=options["username"]).first()
        if user is None:
            raise CommandError(f"No user named {options['username']!r}.")
        try:
            issued = tokens.issue(user, options["name"])
        except tokens.BadTokenName as exc:
            raise CommandError(str(exc)) from None
        # Only the key, on one line: scripts read it with $(manage.py token USER).
        self.stdout.write(issued.key)
