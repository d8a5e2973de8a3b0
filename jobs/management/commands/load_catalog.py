"""Load the starter catalog (images, packages, default quota). Safe to run again: existing
rows keep whatever an admin changed."""

from decimal import Decimal
from typing import Any

from django.core.management.base import BaseCommand

from jobs.models import Framework, FrameworkImage, Package, Quota

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

IMAGES = [
    {
        "name": "pytorch:2.13-cpu",
        "framework": Framework.PYTORCH,
        "description": "PyTorch 2.13 DDP: gloo on CPU, NCCL where the package has GPUs.",
        "health_rules": DEFAULT_HEALTH_RULES,
    },
    {
        "name": "kvstore-ps:2.13",
        "framework": Framework.KVSTORE,
        "description": "Parameter server in MXNet kvstore style (scheduler, servers, workers) "
        "on torch.distributed 2.13.",
        "health_rules": DEFAULT_HEALTH_RULES,
    },
]

# Seed 004's example packages, plus small CPU ones that fit a laptop.
PACKAGES = [
    {"name": "cpu-1", "cpu": 1, "memory_gb": 2, "price_per_hour": Decimal("0.05")},
    {"name": "cpu-2", "cpu": 2, "memory_gb": 4, "price_per_hour": Decimal("0.10")},
    # Two PyTorch processes per instance, as `torchrun --nproc-per-node 2` on a CPU host.
    {
        "name": "cpu-2-x2",
        "cpu": 2,
        "memory_gb": 4,
        "processes": 2,
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

DEFAULT_QUOTA = {"cpu": 32, "gpus": 4, "memory_gb": 256, "running_jobs": 4}


class Command(BaseCommand):
    help = "Create the starter framework images, packages and default quota if missing."

    def handle(self, *args: Any, **options: Any) -> None:
        for image in IMAGES:
            FrameworkImage.objects.get_or_create(name=image["name"], defaults=image)
        for package in PACKAGES:
            Package.objects.get_or_create(name=package["name"], defaults=package)
        Quota.objects.get_or_create(is_default=True, defaults=DEFAULT_QUOTA)
        self.stdout.write("starter catalog loaded")
