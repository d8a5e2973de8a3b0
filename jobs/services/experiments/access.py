"""Who sees which experiment: its owner, and staff, as for jobs (jobs.access)."""

from django.contrib.auth.models import AnonymousUser, User
from django.db.models import QuerySet

from jobs.models import Experiment


class NoSuchExperiment(Exception):
    """Missing, or another user's: the same answer for both (ids of others stay private)."""


def visible_experiments(user: User | AnonymousUser) -> QuerySet[Experiment]:
    experiments = Experiment.objects.select_related("owner")
    if getattr(user, "is_staff", False):
        return experiments
    return experiments.filter(owner_id=user.pk)


def get_experiment_for(user: User | AnonymousUser, experiment_id: int) -> Experiment:
    experiment = visible_experiments(user).filter(pk=experiment_id).first()
    if experiment is None:
        raise NoSuchExperiment("No such experiment.")
    return experiment
