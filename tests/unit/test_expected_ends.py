"""When each job that holds capacity gives its nodes back, as backfill reads it
(jobs.services.lifecycle.time_limits.expected_ends): one read of the holding replicas with their
jobs and current attempts."""

from datetime import datetime, timedelta

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from jobs.models import FrameworkImage, Job, JobAttempt, Node, Package, Replica
from jobs.services.lifecycle import time_limits

pytestmark = pytest.mark.usefixtures("catalog")


def holding(
    owner: User,
    node: Node,
    state: str = Job.State.RUNNING,
    limit: int | None = 3600,
    placed: datetime | None = None,
    attempt: int = 0,
    stop_sent: datetime | None = None,
    replicas: int = 1,
) -> Job:
    """A job whose replicas of attempt `attempt` run on `node`; its attempts up to that one,
    the current one placed at `placed`."""
    job = Job.objects.create(
        owner=owner, name="j", image=FrameworkImage.objects.get(name="pytorch:2.13-cpu"),
        program={"example": "digits-ddp"}, state=state, cpu_total=1, gpus_total=0,
        memory_gb_total=2, price_per_hour=0, time_limit=limit, attempt=attempt,
    )  # fmt: skip
    for number in range(attempt + 1):
        earlier = None if placed is None else placed - timedelta(hours=5)
        JobAttempt.objects.create(
            job=job, number=number, placed=placed if number == attempt else earlier
        )
    for index in range(replicas):
        Replica.objects.create(
            job=job, role="worker", index=index, attempt=attempt, node=node,
            package=Package.objects.get(name="cpu-1"), state=Replica.State.RUNNING,
            stop_sent=stop_sent if index == 0 else None,
        )  # fmt: skip
    return job


def test_it_says_when_each_holder_ends_by_its_current_attempts_limit(alice: User) -> None:
    now = timezone.now()
    node = Node.objects.create(name="n1", address="127.0.0.1", cpu=64, memory_gb=256)
    placed_at = now - timedelta(minutes=10)
    limited = holding(alice, node, placed=placed_at, replicas=2)
    unlimited = holding(alice, node, limit=None, placed=placed_at)
    restarted = holding(alice, node, placed=placed_at, attempt=1)
    not_placed = holding(alice, node, placed=None)
    told_to_stop = holding(alice, node, placed=placed_at, stop_sent=now, replicas=2)
    ended = holding(alice, node, state=Job.State.FAILED, placed=placed_at)
    holding(alice, node, placed=placed_at).replicas.update(
        state=Replica.State.STOPPED
    )  # holds nothing

    assert time_limits.expected_ends(now) == {
        limited.pk: placed_at + timedelta(hours=1),
        unlimited.pk: None,
        restarted.pk: placed_at + timedelta(hours=1),  # its own attempt's placement counts
        not_placed.pk: now + timedelta(hours=1),
        told_to_stop.pk: now,
        ended.pk: now,
    }
