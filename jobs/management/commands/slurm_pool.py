"""Add or change a Slurm pool, as the admin's Slurm pools page does (docs/slurm.md):

    python manage.py slurm_pool NAME --partition P --shared-root DIR --python PATH
        [--slurm-conf FILE] [--code-root DIR] [--redis-host HOST] [--account A] [--qos Q]
        [--constraint C] [--reservation R] [--exclusive] [--run-as-owner]
        [--job-accounts "A B"] [--job-qos "Q R"] [--job-constraints "C D"]
        [--job-reservations "R S"] [--job-exclusive] [--all-images] [--all-packages] [--check]

--partition may list several partitions, separated by commas (Slurm's own list). --account,
--qos, --constraint, --reservation and --exclusive are sent with every job of the pool, as
sbatch's options of the same names, unless the job chooses otherwise among what --job-accounts,
--job-qos, --job-constraints and --job-reservations list (separated by spaces) and
--job-exclusive allows.

--all-images and --all-packages offer every enabled image and package in it. --check runs a
test job on the pool (jobs.services.slurm.slurm_probe: the nodes' Python, the shared root, the
code root, Redis from a node) and refuses the pool, saying what failed.
"""

from pathlib import Path
from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from jobs.models import FrameworkImage, Package, SlurmPool
from jobs.services.slurm import slurm_probe


class Command(BaseCommand):
    help = "Add or change a Slurm pool jobs can run in."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")
        parser.add_argument("--partition", required=True)
        parser.add_argument("--shared-root", required=True, type=Path)
        parser.add_argument("--python", required=True, help="Trainyard's Python on the nodes")
        parser.add_argument("--slurm-conf", default="", help="SLURM_CONF for the commands")
        parser.add_argument("--code-root", default="", help="the code root as nodes see it")
        parser.add_argument("--redis-host", default="", help="Redis as the nodes reach it")
        parser.add_argument("--account", default="", help="sbatch --account for every job")
        parser.add_argument("--qos", default="", help="sbatch --qos for every job")
        parser.add_argument("--constraint", default="", help="sbatch --constraint (features)")
        parser.add_argument("--reservation", default="", help="sbatch --reservation")
        parser.add_argument("--exclusive", action="store_true", help="sbatch --exclusive")
        parser.add_argument("--job-accounts", default="", help="accounts a job may choose")
        parser.add_argument("--job-qos", default="", help="QOS a job may choose")
        parser.add_argument("--job-constraints", default="", help="constraints a job may choose")
        parser.add_argument("--job-reservations", default="", help="reservations a job may choose")
        parser.add_argument(
            "--job-exclusive", action="store_true", help="a job may ask for whole nodes"
        )
        parser.add_argument(
            "--run-as-owner",
            action="store_true",
            help="each job runs as its owner's Unix account (admin → Unix accounts)",
        )
        parser.add_argument("--all-images", action="store_true")
        parser.add_argument("--all-packages", action="store_true")
        parser.add_argument(
            "--check", action="store_true", help="run a test job on the pool before saving it"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        fields = {
            "partition": options["partition"],
            "shared_root": str(options["shared_root"].resolve()),
            "python": options["python"],
            "slurm_conf": options["slurm_conf"],
            "code_root": options["code_root"],
            "redis_host": options["redis_host"],
            "account": options["account"],
            "qos": options["qos"],
            "constraint": options["constraint"],
            "reservation": options["reservation"],
            "exclusive": options["exclusive"],
            "job_accounts": options["job_accounts"],
            "job_qos": options["job_qos"],
            "job_constraints": options["job_constraints"],
            "job_reservations": options["job_reservations"],
            "job_exclusive": options["job_exclusive"],
            "run_as_owner": options["run_as_owner"],
        }
        pool = SlurmPool(name=options["name"], **fields)
        try:
            pool.full_clean(validate_unique=False)
        except ValidationError as exc:
            raise CommandError(
                "; ".join(f"{k}: {' '.join(v)}" for k, v in exc.message_dict.items())
            ) from None
        if options["check"]:
            self._check(pool)
        with transaction.atomic():
            pool, created = SlurmPool.objects.update_or_create(
                name=options["name"], defaults=fields
            )
            if options["all_images"]:
                pool.images.set(FrameworkImage.objects.filter(enabled=True))
            if options["all_packages"]:
                pool.packages.set(Package.objects.filter(enabled=True))
        done = "Added" if created else "Changed"
        self.stdout.write(f"{done} Slurm pool {pool.name} (partition {pool.partition})")

    def _check(self, pool: SlurmPool) -> None:
        """A test job on the pool (slurm_probe): each finding on a line; any failure refuses."""
        findings = slurm_probe.check_pool(pool)
        for finding in findings:
            self.stdout.write(str(finding))
        failed = [f.words for f in findings if not f.ok]
        if failed:
            raise CommandError(f"the pool's check failed: {'; '.join(failed)}")
