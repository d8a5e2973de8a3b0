"""Create the local admin account once and print its login (used by `make run`)."""

import secrets
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandParser


class Command(BaseCommand):
    help = "Create a superuser 'admin' with a generated password kept in the var directory."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--username", default="admin")

    def handle(self, *args: Any, **options: Any) -> None:
        username = options["username"]
        password_file = Path(settings.VAR_DIR) / f"{username}-password"
        User = get_user_model()
        if not password_file.exists():
            password_file.write_text(secrets.token_urlsafe(12))
            password_file.chmod(0o600)
        password = password_file.read_text().strip()
        user = User.objects.filter(username=username).first()
        if user is None:
            User.objects.create_superuser(username, password=password)
        elif not user.check_password(password):
            # Someone changed it in the admin: keep theirs, say where the login comes from.
            self.stdout.write(f"{username}: password was changed in the admin; not shown")
            return
        self.stdout.write(f"{username} {password}")
