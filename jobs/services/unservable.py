"""Packages a user could never run an instance of: one instance needs more than a quota that
binds them allows at all, or more than any node has. The New-job form shows them disabled,
with why, instead of letting Launch find out."""

from django.contrib.auth.models import User

from jobs.models import Node, Package
from jobs.services import quota
from jobs.services.placement import Demand, Room, describe, never_fits

# How the reasons name each resource's amount.
_AMOUNTS = {
    "gpus": lambda n: f"{n} GPU{'s' if n != 1 else ''}",
    "cpu": lambda n: f"{n} CPU core{'s' if n != 1 else ''}",
    "memory_gb": lambda n: f"{n} GB",
}


def unservable_packages(user: User) -> dict[str, str]:
    """{package name: why no instance of it could ever run for this user}, for the enabled
    packages that neither the user's quotas nor the nodes can serve."""
    try:
        scopes = quota.scopes_for(user)
    except quota.NoQuota:
        scopes = []  # nothing runs at all; the form says so beside the totals
    # As admission judges placement: nodes that are not draining; none known yet, no verdict.
    rooms = [
        Room(n.name, n.cpu, n.gpus, n.memory_gb)
        for n in Node.objects.exclude(state=Node.State.DRAINING)
    ]
    reasons = {}
    for package in Package.objects.filter(enabled=True):
        why = [*_over_quota(package, scopes), *_on_no_node(package, rooms)]
        if why:
            reasons[package.name] = "; ".join(why)
    return reasons


def _over_quota(package: Package, scopes: list[quota.Scope]) -> list[str]:
    """Against each quota's limit, not what is left: what is left changes as jobs end, and the
    form's live totals say when a job has to wait for that."""
    found = []
    for resource in ("gpus", "cpu", "memory_gb"):
        needed = getattr(package, resource)
        for scope in scopes:
            limit = scope.limit[resource]
            if needed > limit:
                whose = "your quota" if scope.kind != "group" else f"group {scope.name}'s quota"
                amount = _AMOUNTS[resource]
                found.append(f"needs {amount(needed)}: {whose} has {amount(limit)}")
                break
    return found


def _on_no_node(package: Package, rooms: list[Room]) -> list[str]:
    demand = Demand.of((package.name, 0), package)
    if not rooms or not never_fits([demand], rooms):
        return []
    if package.gpus and not any(r.gpus for r in rooms):
        return ["no node has a GPU"]
    return [f"no node has {describe(package.cpu, package.gpus, package.memory_gb)}"]
