"""Load the starter catalog (images, packages, default quota). Safe to run again: existing
rows keep whatever an admin changed.

The default quota is the starter one (DEFAULT_QUOTA) unless --quota-* options say otherwise:
`make run` gives what its local nodes hold, so that a new user's default fits them. With
options, a default quota that still has the starter values (no admin changed it) is refitted.
"""

from decimal import Decimal
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from jobs.models import Framework, FrameworkImage, Package, PriorityClass, Quota

# What every job on the starter images watches for, unless it sets its own rules. Only what is
# surely wrong stops or restarts a job; what may be wrong warns. The no-progress rule waits at
# least 10 minutes, so that a long evaluation between two steps is not taken for a hang.
DEFAULT_HEALTH_RULES: list[dict[str, object]] = [
    {"kind": "non-finite", "metric": "loss", "action": "stop"},
    {"kind": "log-pattern", "pattern": "CUDA out of memory", "action": "stop"},
    {"kind": "log-pattern", "pattern": "NCCL error", "action": "restart-exclude-node"},
    {"kind": "no-progress", "factor": 20, "min_seconds": 600, "minutes": 60, "action": "restart"},
    {"kind": "throughput-drop", "metric": "samples_per_sec", "fraction": 0.5, "action": "warn"},
    {"kind": "gpu-idle", "metric": "gpu_util_percent", "below": 80, "minutes": 1, "action": "warn"},
]

IMAGES: list[dict[str, Any]] = [
    {
        "name": "pytorch:2.13-cpu",
        "framework": Framework.PYTORCH,
        "description": "PyTorch 2.13 DDP: gloo on CPU, NCCL where the package has GPUs.",
        "health_rules": DEFAULT_HEALTH_RULES,
        # HuggingFace accelerate would otherwise run each CPU instance as a group of its own.
        "default_env": {"ACCELERATE_USE_CPU": "true"},
    },
    {
        "name": "kvstore-ps:2.13",
        "framework": Framework.KVSTORE,
        "description": "Parameter server in MXNet kvstore style (scheduler, servers, workers) "
        "on torch.distributed 2.13.",
        "health_rules": DEFAULT_HEALTH_RULES,
    },
]

# The packages of a typical parameter-server set-up (a 2-core server, a 2-GPU worker), plus
# small CPU ones that fit a laptop.
PACKAGES = [
    {"name": "cpu-1", "cpu": 1, "memory_gb": 2, "disk_gb": 10, "price_per_hour": Decimal("0.05")},
    {"name": "cpu-2", "cpu": 2, "memory_gb": 4, "disk_gb": 20, "price_per_hour": Decimal("0.10")},
    # Two PyTorch processes per instance, as `torchrun --nproc-per-node 2` on a CPU host.
    {
        "name": "cpu-2-x2",
        "cpu": 2,
        "memory_gb": 4,
        "processes": 2,
        "disk_gb": 20,
        "price_per_hour": Decimal("0.10"),
    },
    {"name": "server-2c12g", "cpu": 2, "memory_gb": 12, "price_per_hour": Decimal("0.20")},
    {
        "name": "worker-p100x2",
        "cpu": 12,
        "gpus": 2,
        "gpu_model": "P100",
        "memory_gb": 120,
        "price_per_hour": Decimal("3.00"),
    },
]

# The starter priority classes, as migration 0021 made them for an existing console: loaded
# here too, like the images and packages, so that a database emptied and loaded again (a test's,
# say) has them. An admin's edits are kept: a class is only created when missing.
PRIORITY_CLASSES: list[dict[str, Any]] = [
    {"name": "low", "value": -10, "may_preempt": False, "may_be_preempted": True,
     "description": "Runs when room is free; a high job may preempt it."},
    {"name": "normal", "value": 0, "may_preempt": False, "may_be_preempted": False,
     "description": "The default."},
    {"name": "high", "value": 10, "may_preempt": True, "may_be_preempted": False,
     "description": "Goes first, and may preempt low jobs when it cannot start."},
]  # fmt: skip

DEFAULT_QUOTA = {"cpu": 32, "gpus": 4, "memory_gb": 256, "running_jobs": 4}

# --quota-NAME option → the Quota field it sets.
QUOTA_OPTIONS = {"quota_cpu": "cpu", "quota_gpus": "gpus", "quota_memory_gb": "memory_gb",
                 "quota_jobs": "running_jobs"}  # fmt: skip


class Command(BaseCommand):
    help = "Create the starter framework images, packages and default quota if missing."

    def add_arguments(self, parser: CommandParser) -> None:
        for option, field in QUOTA_OPTIONS.items():
            parser.add_argument(
                "--" + option.replace("_", "-"),
                dest=option,
                type=int,
                default=None,
                metavar="N",
                help=f"the default quota's {field} (default {DEFAULT_QUOTA[field]})",
            )

    def handle(self, *args: Any, **options: Any) -> None:
        wanted = _wanted_quota(options)  # checked before anything is written
        for image in IMAGES:
            FrameworkImage.objects.get_or_create(name=image["name"], defaults=image)
        for package in PACKAGES:
            Package.objects.get_or_create(name=package["name"], defaults=package)
        for pclass in PRIORITY_CLASSES:
            PriorityClass.objects.get_or_create(name=pclass["name"], defaults=pclass)
        self.stdout.write(_load_default_quota(wanted))
        self.stdout.write("starter catalog loaded")


def _wanted_quota(options: dict[str, Any]) -> dict[str, int]:
    wanted = dict(DEFAULT_QUOTA)
    for option, field in QUOTA_OPTIONS.items():
        if options.get(option) is not None:
            if options[option] < 0:
                raise CommandError(f"--{option.replace('_', '-')} cannot be negative.")
            wanted[field] = options[option]
    return wanted


def _load_default_quota(wanted: dict[str, int]) -> str:
    quota, created = Quota.objects.get_or_create(is_default=True, defaults=wanted)
    if created:
        return f"default quota: {_describe(quota)}"
    # Refit only the starter values: anything else is an admin's choice.
    current = {field: getattr(quota, field) for field in DEFAULT_QUOTA}
    if current == DEFAULT_QUOTA and wanted != DEFAULT_QUOTA:
        for field, value in wanted.items():
            setattr(quota, field, value)
        quota.save(update_fields=list(wanted))
        return f"default quota refitted: {_describe(quota)}"
    return f"default quota kept: {_describe(quota)}"


def _describe(quota: Quota) -> str:
    return (
        f"{quota.cpu} CPU cores, {quota.gpus} GPUs, {quota.memory_gb} GB, "
        f"{quota.running_jobs} jobs at once"
    )
