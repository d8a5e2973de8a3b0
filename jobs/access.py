"""Who may see what: a user sees their own jobs, staff see all; staff pages are staff's only."""

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import AnonymousUser, User
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse

from jobs.models import Job


def _sees_every_job(user: User | AnonymousUser) -> bool:
    """Staff see every user's jobs; everyone else only their own (the one rule of both below)."""
    return bool(getattr(user, "is_staff", False))


def visible_jobs(user: User | AnonymousUser) -> QuerySet[Job]:
    jobs = Job.objects.select_related("image", "owner", "priority_class")
    if _sees_every_job(user):
        return jobs
    return jobs.filter(owner_id=user.pk)


def sees_jobs_of(user: User | AnonymousUser, owner_id: int) -> bool:
    """visible_jobs's rule for one job, from its owner's id alone: for a caller that knows the
    owners of the jobs it names already (a scheduling pass words reasons for forty owners, and
    one query per owner was a third of the pass at 10,000 waiting jobs; issue 24)."""
    return _sees_every_job(user) or owner_id == user.pk


def get_job_for(user: User | AnonymousUser, job_id: int) -> Job:
    """The job if this user may see it; 404 otherwise (never 403: ids of others stay private)."""
    job = visible_jobs(user).filter(pk=job_id).first()
    if job is None:
        raise Http404("No such job.")
    return job


def staff_required(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """For the staff pages (Users, Storage): anonymous visitors go to the login page; logged-in
    users who are not staff get 403."""

    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not request.user.is_staff:
            raise PermissionDenied("Only staff users see this page.")
        return view(request, *args, **kwargs)

    return login_required(wrapper)
