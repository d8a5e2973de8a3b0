"""Who may see what: a user sees their own jobs, staff see all."""

from django.contrib.auth.models import AnonymousUser, User
from django.db.models import QuerySet
from django.http import Http404

from jobs.models import Job


def visible_jobs(user: User | AnonymousUser) -> QuerySet[Job]:
    jobs = Job.objects.select_related("image", "owner")
    if getattr(user, "is_staff", False):
        return jobs
    return jobs.filter(owner_id=user.pk)


def get_job_for(user: User | AnonymousUser, job_id: int) -> Job:
    """The job if this user may see it; 404 otherwise (never 403: ids of others stay private)."""
    job = visible_jobs(user).filter(pk=job_id).first()
    if job is None:
        raise Http404("No such job.")
    return job
