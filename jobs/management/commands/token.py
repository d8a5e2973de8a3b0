"""Print a new API key for an existing user: python manage.py token USERNAME"""

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from jobs.models import ApiToken


class Command(BaseCommand):
    help = "Print a new API token (Authorization: Token KEY) for an existing user."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")

    def handle(self, *args: Any, **options: Any) -> None:
        user = get_user_model().objects.filter(username=options["username"]).first()
        if user is None:
            raise CommandError(f"No user named {options['username']!r}.")
        self.stdout.write(ApiToken.issue(user))
