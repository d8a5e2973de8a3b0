"""Read models for the node and quota pages: what each node holds and each quota is used for."""

from dataclasses import dataclass

from django.contrib.auth.models import AnonymousUser, Group, User
from django.db.models import Q

from jobs.access import visible_jobs
from jobs.models import Node, Quota
from jobs.services import quota as quotas
from jobs.services.scheduler.scheduling import holdings


@dataclass(frozen=True)
class NodeRow:
    node: Node
    status: str
    used: dict[str, int]
    free: dict[str, int]
    jobs: list[int]  # the ids of the jobs here that the viewer may see


def node_rows(viewer: User | AnonymousUser) -> list[NodeRow]:
    """Every node with what it holds. What is used and free counts every job (a fact about the
    cluster); the job ids are only those `viewer` may see (staff: all; others: their own), so
    that a shared page names no one else's job."""
    nodes = list(Node.objects.order_by("name"))
    held = holdings(nodes)
    shown = set(
        visible_jobs(viewer).filter(pk__in={h.job_id for h in held}).values_list("pk", flat=True)
    )
    rows = []
    for node in nodes:
        mine = [h for h in held if h.node == node.name]
        used = {
            "cpu": sum(h.cpu for h in mine),
            "gpus": sum(h.gpus for h in mine),
            "memory_gb": sum(h.memory_gb for h in mine),
        }
        capacity = {"cpu": node.cpu, "gpus": node.gpus, "memory_gb": node.memory_gb}
        free = {k: capacity[k] - used[k] for k in capacity}
        rows.append(
            NodeRow(node, node.status, used, free, sorted({h.job_id for h in mine} & shown))
        )
    return rows


@dataclass(frozen=True)
class QuotaRow:
    kind: str  # "user", "default" (a user on the default quota) or "group"
    name: str
    limit: dict[str, int]
    used: dict[str, int]

    @property
    def cells(self) -> list[tuple[str, int, int, bool]]:
        """(resource, used, limit, full) in display order; full: what was given is used up. A
        limit of 0 gives none of it (GPUs on a CPU cluster): nothing to use up, nothing to
        flag, unless something holds some anyway (an admin lowered it)."""
        return [
            (r, self.used[r], self.limit[r], self._full(self.used[r], self.limit[r]))
            for r in quotas.LIMITED
        ]

    @staticmethod
    def _full(used: int, limit: int) -> bool:
        return used > limit or (limit > 0 and used >= limit)


def quota_rows(viewer: User) -> list[QuotaRow]:
    """Staff see every user and group; others see themselves and their groups."""
    users = User.objects.order_by("username") if viewer.is_staff else [viewer]
    groups = (
        Group.objects.filter(quota__isnull=False).order_by("name")
        if viewer.is_staff
        else viewer.groups.filter(quota__isnull=False).order_by("name")
    )
    rows = []
    for user in users:
        try:
            scope = quotas.scopes_for(user)[0]
        except quotas.NoQuota:
            continue
        rows.append(QuotaRow(scope.kind, user.get_username(), scope.limit, scope.used.as_dict()))
    for group in groups:
        limit = Quota.objects.get(group=group)
        scope = quotas.Scope("group", group.name, limit, quotas.usage_of(Q(owner__groups=group)))
        rows.append(QuotaRow("group", group.name, scope.limit, scope.used.as_dict()))
    return rows
