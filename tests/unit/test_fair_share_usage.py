"""Fair share as read from the database: whose share each user draws on, and the attempts it
counts, with the same sums as the pure policy's (fairshare.decayed_usage) for them."""

from datetime import datetime, timedelta

import pytest
from django.contrib.auth.models import Group, User
from django.utils import timezone

from jobs.models import FrameworkImage, Job, JobAttempt, Quota
from jobs.services.scheduler import fairshare
from jobs.services.scheduler.fairshare import Resources, UsageRecord

pytestmark = pytest.mark.usefixtures("catalog")

HALF_LIFE = 3600.0


def attempt(
    owner: User, cpu: int, started: datetime | None, finished: datetime | None, number: int = 0
) -> None:
    job = Job.objects.create(
        owner=owner, name="j", image=FrameworkImage.objects.get(name="pytorch:2.13-cpu"),
        program={"example": "digits-ddp"}, state=Job.State.RUNNING, cpu_total=cpu,
        gpus_total=1, memory_gb_total=2 * cpu, price_per_hour=0,
    )  # fmt: skip
    JobAttempt.objects.create(job=job, number=number, started=started, finished=finished)


def test_it_counts_running_and_lately_ended_attempts_as_decayed_usage_does(
    alice: User, bob: User
) -> None:
    now = timezone.now()
    running = now - timedelta(minutes=30)
    ended = (now - timedelta(hours=3), now - timedelta(hours=2))
    attempt(alice, 4, running, None)
    attempt(alice, 2, *ended)
    attempt(alice, 8, now - timedelta(hours=30), now - timedelta(hours=29))  # past the horizon
    attempt(alice, 16, None, None)  # never started: it waits
    attempt(bob, 1, running, None)

    usage = fairshare.usage_by_user({alice.pk, bob.pk}, now, HALF_LIFE)

    assert usage == {
        alice.pk: fairshare.decayed_usage(
            [
                UsageRecord(running, None, Resources(4, 1, 8)),
                UsageRecord(*ended, Resources(2, 1, 4)),
            ],
            now,
            HALF_LIFE,
        ),
        bob.pk: fairshare.decayed_usage(
            [UsageRecord(running, None, Resources(1, 1, 2))], now, HALF_LIFE
        ),
    }


def test_each_user_draws_on_their_first_group_by_name_else_their_own_or_the_default_quota(
    alice: User, bob: User
) -> None:
    carol, dave = (User.objects.create_user(name) for name in ("carol", "dave"))
    zeta, alpha, plain = (Group.objects.create(name=n) for n in ("zeta", "alpha", "no-quota"))
    Quota.objects.create(group=zeta, cpu=8, gpus=0, memory_gb=64, running_jobs=9)
    Quota.objects.create(group=alpha, cpu=4, gpus=2, memory_gb=32, running_jobs=9)
    alice.groups.add(zeta, alpha, plain)
    bob.groups.add(zeta)
    carol.groups.add(plain)
    Quota.objects.create(user=carol, cpu=2, gpus=0, memory_gb=8, running_jobs=9)
    default = Quota.objects.get(is_default=True)

    found = fairshare.tenancies_of({alice.pk, bob.pk, carol.pk, dave.pk})

    assert found == {
        alice.pk: fairshare.Tenancy("group:alpha", Resources(4, 2, 32), (alice.pk,)),
        bob.pk: fairshare.Tenancy("group:zeta", Resources(8, 0, 64), (alice.pk, bob.pk)),
        carol.pk: fairshare.Tenancy(f"user:{carol.pk}", Resources(2, 0, 8), (carol.pk,)),
        dave.pk: fairshare.Tenancy(
            f"user:{dave.pk}",
            Resources(default.cpu, default.gpus, default.memory_gb),
            (dave.pk,),
        ),
    }
