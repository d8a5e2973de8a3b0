"""`manage.py unlock_login USERNAME [--address ADDR]`: lift a login lockout before it ends.

The throttle (jobs.login_throttle) locks an account after too many wrong passwords; a user who
mistyped their password, not a guesser, should not have to wait out the window.
"""

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from jobs import login_throttle


class Command(BaseCommand):
    help = "Lift the login lockout of an account and/or a client address, and clear its failures."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username", nargs="?", help="the account to unlock")
        parser.add_argument("--address", help="a client address to unlock (e.g. 10.0.0.7)")

    def handle(self, *args: Any, **options: Any) -> None:
        username, address = options["username"], options["address"]
        if username is None and address is None:
            raise CommandError("Name an account, an --address, or both.")
        if not settings.REDIS_URL:
            # Without it this process has a cache of its own: unlocking there changes nothing.
            raise CommandError(
                "The lockouts live in the console's Redis: set REDIS_URL to it "
                "(`make run` prints it as 'Redis: REDIS_URL=...')."
            )
        for what in login_throttle.lift(username=username, address=address):
            self.stdout.write(f"unlocked {what}")
