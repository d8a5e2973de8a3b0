"""Add or change a framework image that runs its trainers in a container, as the admin's image
page does (docs/deploy.md, "Images that are containers"):

    python manage.py container_image NAME [--like STARTER] [--reference REF]
        [--lets-in PREFIX ...] [--disable | --enable]

With --like, NAME becomes a copy of the image STARTER (its framework, how its roles launch, its
defaults and rules) whose trainers run in the OCI image REF ("": on the host's Python), letting
users bring their own images whose references start with a --lets-in prefix. An image NAME that
exists already is changed in place, keeping its jobs, and what is not given stays as it is;
--disable takes it off the New job form (its jobs keep it). The fields are checked as the
admin's image page checks them.
"""

from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from jobs.models import FrameworkImage

# What a copy does not take from its starter: its identity and what this command sets. Its
# Slurm pools are not copied either: a pool runs the host's Python, never a container.
_OWN_FIELDS = {"id", "name", "container_image", "user_image_prefixes", "enabled"}


class Command(BaseCommand):
    help = "Add or change a framework image whose trainers run in a container."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")
        parser.add_argument("--like", help="the image to copy the rest from (a new one needs it)")
        parser.add_argument("--reference", help='the OCI image; "": the host\'s Python')
        parser.add_argument(
            "--lets-in",
            action="append",
            metavar="PREFIX",
            help="a prefix of references users may bring; repeatable",
        )
        enabled = parser.add_mutually_exclusive_group()
        enabled.add_argument("--disable", action="store_true", help="off the New job form")
        enabled.add_argument("--enable", action="store_true", help="back on the form")

    def handle(self, *args: Any, **options: Any) -> None:
        with transaction.atomic():
            image = FrameworkImage.objects.filter(name=options["name"]).first()
            if options["like"] is not None:
                image = image or FrameworkImage(name=options["name"])
                self._copy(image, options["like"])
            elif image is None:
                raise CommandError(f"No image {options['name']!r}: --like names what to copy.")
            if options["reference"] is not None:
                image.container_image = options["reference"]
            if options["lets_in"] is not None:
                image.user_image_prefixes = list(options["lets_in"])
            if options["disable"] or options["enable"]:
                image.enabled = bool(options["enable"])
            try:
                image.full_clean(validate_unique=False)
            except ValidationError as exc:
                raise CommandError(
                    "; ".join(f"{k}: {' '.join(v)}" for k, v in exc.message_dict.items())
                ) from None
            image.save()
        where = f"in {image.container_image}" if image.container_image else "on the host's Python"
        self.stdout.write(f"{image.name}: runs {where}{'' if image.enabled else ', disabled'}")

    @staticmethod
    def _copy(image: FrameworkImage, like: str) -> None:
        starter = FrameworkImage.objects.filter(name=like).first()
        if starter is None:
            raise CommandError(f"No image {like!r} to copy.")
        for f in FrameworkImage._meta.concrete_fields:
            if f.name not in _OWN_FIELDS:
                setattr(image, f.name, getattr(starter, f.name))
