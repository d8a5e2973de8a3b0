"""API v1 operations on experiments (hyperparameter searches whose trials are jobs; issue 48):
create, list, show, pause, resume, stop. A user sees their own experiments, staff all; another
user's is a 404, the same as one that does not exist. Registered on jobs.api's NinjaAPI, whose
refusals they share; console/urls.py imports this module beside it."""

from collections.abc import Callable
from typing import Any

from django.contrib.auth.models import User
from django.http import HttpRequest
from ninja import Status

from jobs.api import ERRORS, ApiError, _user, api
from jobs.models import Experiment
from jobs.schemas import ExperimentIn, ExperimentListOut, ExperimentOut
from jobs.services.experiments import access, control
from jobs.services.views import experiments as presenter

# Experiments listed, newest first.
MAX_LISTED = 200


def _visible(request: HttpRequest, experiment_id: int) -> Experiment:
    try:
        return access.get_experiment_for(request.user, experiment_id)
    except access.NoSuchExperiment as exc:
        raise ApiError(404, "experiment", str(exc)) from None


@api.post(
    "/experiments",
    response={201: ExperimentOut, **ERRORS},
    tags=["experiments"],
    url_name="api_experiments",
)
def experiment_create(request: HttpRequest, payload: ExperimentIn) -> Status[dict[str, Any]]:
    """Check the search (400 with every problem, by field: `space.--lr`, `objective.metric`,
    `budget.parallel`, `template.<job field>` for the template's own), and start it: its
    trials are submitted as your jobs, within your quota and its budget."""
    experiment = control.create_experiment(_user(request), payload.model_dump(exclude_unset=True))
    return Status(201, presenter.experiment_detail(experiment))


@api.get(
    "/experiments",
    response={200: ExperimentListOut, **ERRORS},
    tags=["experiments"],
    url_name="api_experiment_list",
)
def experiment_list(request: HttpRequest) -> dict[str, Any]:
    """Your experiments (staff: everyone's), newest first, without their trials."""
    experiments = access.visible_experiments(request.user)[:MAX_LISTED]
    return {"experiments": [presenter.experiment_summary(e) for e in experiments]}


@api.get(
    "/experiments/{int:experiment_id}",
    response={200: ExperimentOut, **ERRORS},
    tags=["experiments"],
    url_name="api_experiment",
)
def experiment_detail(request: HttpRequest, experiment_id: int) -> dict[str, Any]:
    return presenter.experiment_detail(_visible(request, experiment_id))


def _act(
    request: HttpRequest, experiment_id: int, action: Callable[[int, User], Experiment]
) -> dict[str, Any]:
    experiment = _visible(request, experiment_id)
    try:
        experiment = action(experiment.pk, _user(request))
    except control.ExperimentStateError as exc:
        raise ApiError(409, "state", str(exc)) from None
    return presenter.experiment_detail(experiment)


@api.post(
    "/experiments/{int:experiment_id}/pause",
    response={200: ExperimentOut, **ERRORS},
    tags=["experiments"],
    url_name="api_experiment_pause",
)
def experiment_pause(request: HttpRequest, experiment_id: int) -> dict[str, Any]:
    """No new trials start; those running go on. 409 unless it runs."""
    return _act(request, experiment_id, control.pause)


@api.post(
    "/experiments/{int:experiment_id}/resume",
    response={200: ExperimentOut, **ERRORS},
    tags=["experiments"],
    url_name="api_experiment_resume",
)
def experiment_resume(request: HttpRequest, experiment_id: int) -> dict[str, Any]:
    """New trials start again. 409 unless it is paused."""
    return _act(request, experiment_id, control.resume)


@api.post(
    "/experiments/{int:experiment_id}/stop",
    response={200: ExperimentOut, **ERRORS},
    tags=["experiments"],
    url_name="api_experiment_stop",
)
def experiment_stop(request: HttpRequest, experiment_id: int) -> dict[str, Any]:
    """Cancel its running trials ("experiment stopped by YOU") and end it. 409 once ended."""
    return _act(request, experiment_id, control.stop)
