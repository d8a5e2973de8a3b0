"""jobs.access.sees_jobs_of, visible_jobs's rule for one job from its owner's id alone (the
scheduler names jobs in waiting reasons with it): it must agree with visible_jobs."""

import pytest
from django.contrib.auth.models import AnonymousUser, User

from jobs.access import sees_jobs_of, visible_jobs
from jobs.models import FrameworkImage, Job

pytestmark = pytest.mark.usefixtures("catalog")


def test_it_agrees_with_visible_jobs_for_owners_others_staff_and_anonymous(
    alice: User, bob: User, charlie_admin: User
) -> None:
    image = FrameworkImage.objects.get(name="pytorch:2.13-cpu")
    sizes = {"cpu_total": 1, "gpus_total": 0, "memory_gb_total": 2, "price_per_hour": 0}
    jobs = [
        Job.objects.create(owner=owner, name="j", image=image, program={}, **sizes)
        for owner in (alice, bob, charlie_admin)
    ]
    for viewer in (alice, bob, charlie_admin, AnonymousUser()):
        visible = set(visible_jobs(viewer).values_list("pk", flat=True))
        assert {j.pk for j in jobs if sees_jobs_of(viewer, j.owner_id)} == visible
    assert sees_jobs_of(charlie_admin, alice.pk) and not sees_jobs_of(alice, bob.pk)
