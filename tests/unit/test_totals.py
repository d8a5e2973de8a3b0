from decimal import Decimal

from jobs.models import Package
from jobs.services.totals import RoleRequest, compute_totals


def pkg(name: str, cpu: int, gpus: int, mem: int, price: str) -> Package:
    return Package(name=name, cpu=cpu, gpus=gpus, memory_gb=mem, price_per_hour=Decimal(price))


def test_it_reproduces_seed_004s_example() -> None:
    server = pkg("server", 2, 0, 12, "0.20")
    worker = pkg("worker", 12, 2, 120, "3.00")
    totals = compute_totals([RoleRequest("server", server, 1), RoleRequest("worker", worker, 2)])
    assert (totals.cpu, totals.gpus, totals.memory_gb) == (26, 4, 252)
    assert totals.price_per_hour == Decimal("6.20")
    assert totals.formulas["cpu"] == "server 2×1 + worker 12×2 = 26"
    assert totals.formulas["gpus"] == "server 0×1 + worker 2×2 = 4"


def test_it_ignores_roles_with_no_instances() -> None:
    one = pkg("cpu-1", 1, 0, 2, "0.05")
    totals = compute_totals([RoleRequest("master", one, 1), RoleRequest("worker", one, 0)])
    assert totals.cpu == 1
    assert totals.formulas["cpu"] == "master 1×1 = 1"
