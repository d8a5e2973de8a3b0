"""`manage.py check_directory`: ask the directory about every person it signed in, now, as the
console worker does every TRAINYARD_LDAP_CHECK_SECONDS; those it no longer lets in are signed
out (jobs/directory.py). For an admin who has just disabled someone and will not wait."""

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):
    help = "Sign out the people the LDAP directory no longer lets in, now."

    def handle(self, *args: Any, **options: Any) -> None:
        if not settings.TRAINYARD_LDAP_URL:
            raise CommandError("No directory is set (TRAINYARD_LDAP_URL).")
        from jobs.directory import check_accounts

        refused = check_accounts()
        self.stdout.write(f"signed out {refused} the directory no longer lets in")
