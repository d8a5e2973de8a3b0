"""Node agents' heartbeats: register or refresh a node, and notice an agent that restarted."""

from typing import Any

from django.db import transaction
from django.utils import timezone

from jobs.models import Node
from jobs.services import scheduling


def node_heartbeat(payload: dict[str, Any]) -> None:
    """Register or refresh a node from its agent's heartbeat.

    The agent's capacity becomes the advertised one unless an admin has set it. A node that is
    new, or back after being lost, may let waiting jobs in. A heartbeat from a new incarnation
    of the agent (it started again) is checked against the database at once: whatever the old
    one ran is gone, and the jobs it belonged to should hear so now, not at the next pass.
    """
    name = str(payload["node"])
    reported = {
        "reported_cpu": int(payload["cpus"]),
        "reported_gpus": int(payload["gpus"]),
        "reported_memory_gb": int(payload["memory_gb"]),
    }
    incarnation = str(payload.get("incarnation", ""))
    now = timezone.now()
    with transaction.atomic():
        node = Node.objects.select_for_update().filter(name=name).first()
        came_back = node is None or node.is_lost(now)
        if node is None:
            node = Node(name=name, cpu=0, memory_gb=0)
        restarted = bool(node.incarnation) and incarnation != node.incarnation
        if incarnation != node.incarnation:
            node.previous_heartbeat = node.last_heartbeat
            node.incarnation = incarnation
            node.incarnation_since = now
        node.address = str(payload["address"])
        node.gpu_model = str(payload.get("gpu_model", ""))
        for field, value in reported.items():
            setattr(node, field, value)
        if not node.capacity_set_by_admin:
            node.cpu, node.gpus, node.memory_gb = (
                reported["reported_cpu"],
                reported["reported_gpus"],
                reported["reported_memory_gb"],
            )
        node.running = list(payload.get("running", []))
        node.finished = list(payload.get("finished", []))
        node.last_heartbeat = now
        node.save()
        if came_back:
            scheduling.request_schedule()
    if restarted:
        from jobs.services import reconcile  # reconcile builds on this module

        reconcile.check_node_now(name)
