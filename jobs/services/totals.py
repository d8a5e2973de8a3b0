"""Resource totals of a request by the quota formula: CPU_total = Σ package.cpu × instances."""

from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal

from jobs.models import Package

RESOURCES = ("cpu", "gpus", "memory_gb")
RESOURCE_LABELS = {"cpu": "CPU cores", "gpus": "GPUs", "memory_gb": "memory (GB)", "jobs": "jobs"}
# How each sum is named in the formula the New-job page shows.
FORMULA_NAMES = {"cpu": "CPU_total", "gpus": "GPU_total", "memory_gb": "Memory_total"}
FORMULA_UNITS = {"cpu": "", "gpus": "", "memory_gb": " GB"}


@dataclass(frozen=True)
class RoleRequest:
    role: str
    package: Package
    instances: int  # elastic: the most it runs with, what the quota is charged
    min_instances: int | None = None  # elastic: the fewest; None: fixed


@dataclass(frozen=True)
class Totals:
    cpu: int
    gpus: int
    memory_gb: int
    price_per_hour: Decimal
    # Per resource, the formula expanded per role: "server 2×1 + worker 12×2 = 26".
    formulas: dict[str, str]

    def as_dict(self) -> dict[str, int]:
        return {"cpu": self.cpu, "gpus": self.gpus, "memory_gb": self.memory_gb}


def compute_totals(roles: Iterable[RoleRequest]) -> Totals:
    roles = [r for r in roles if r.instances > 0]
    sums: dict[str, int] = {}
    formulas: dict[str, str] = {}
    for resource in RESOURCES:
        terms = [(r.role, getattr(r.package, resource), r.instances) for r in roles]
        sums[resource] = sum(per * n for _, per, n in terms)
        expr = " + ".join(f"{role} {per}×{n}" for role, per, n in terms) or "0"
        formulas[resource] = f"{expr} = {sums[resource]}"
    price = sum((r.package.price_per_hour * r.instances for r in roles), Decimal(0))
    return Totals(sums["cpu"], sums["gpus"], sums["memory_gb"], price, formulas)


def formula_text(totals: Totals) -> str:
    """Every sum written out, e.g. "CPU_total = server 2×1 + worker 12×2 = 26; ..."."""
    return "; ".join(
        f"{FORMULA_NAMES[r]} = {totals.formulas[r]}{FORMULA_UNITS[r]}" for r in RESOURCES
    )
