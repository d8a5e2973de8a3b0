"""What a user does to an experiment: create it, pause, resume, stop. With the driver, the only
writers of Experiment and Trial state; every change happens with the experiment's row locked,
and what the console worker should do next is asked for once the change has committed."""

import uuid
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction

from jobs import text
from jobs.models import Experiment
from jobs.services.experiments import driver, reasons, space
from jobs.services.experiments import study as studies
from jobs.services.lifecycle import experiment_requests
from jobs.services.submission import ValidationFailed

MAX_NAME_LENGTH = 200


class ExperimentStateError(Exception):
    """The experiment is not in a state that allows this; the message says which it is in."""


def create_experiment(user: User, data: dict[str, Any]) -> Experiment:
    """Check the request (ValidationFailed with every problem, by field: `space.--lr`,
    `budget.parallel`, `template.roles`, …), write the experiment and its Optuna study, and
    have the console worker start its first trials."""
    spec = space.parse_request(data)
    if len(spec.name) > MAX_NAME_LENGTH:
        raise ValidationFailed({"name": [f"At most {MAX_NAME_LENGTH} characters."]})
    if problem := text.name_problem(spec.name):
        raise ValidationFailed({"name": [problem]})
    space.check_template(spec, user)
    with transaction.atomic():
        experiment = Experiment.objects.create(
            owner=user,
            name=spec.name,
            template=spec.template,
            space=spec.space,
            objective_metric=spec.metric,
            objective_goal=spec.goal,
            objective_unit=spec.unit,
            searcher=spec.searcher,
            pruner=spec.pruner,
            pruner_options=spec.pruner_options,
            seed=spec.seed,
            max_trials=spec.budget.trials,
            parallel_trials=spec.budget.parallel,
            max_core_hours=spec.budget.core_hours,
            max_gpu_hours=spec.budget.gpu_hours,
            study_name=f"trainyard-experiment-{uuid.uuid4().hex}",
        )
        studies.create(experiment)
        experiment_id = experiment.pk
        transaction.on_commit(
            lambda: experiment_requests.request_advance(experiment_id), robust=True
        )
    return experiment


def _locked_or_missing(experiment_id: int) -> Experiment:
    experiment = Experiment.objects.select_for_update().filter(pk=experiment_id).first()
    if experiment is None:
        raise Experiment.DoesNotExist(f"No experiment {experiment_id}.")
    return experiment


def _refusal(experiment: Experiment, what: str) -> ExperimentStateError:
    return ExperimentStateError(f"Experiment {experiment.pk} is {experiment.state}; {what}.")


def pause(experiment_id: int, by: User) -> Experiment:
    """No new trials start; those running go on."""
    with transaction.atomic():
        experiment = _locked_or_missing(experiment_id)
        if experiment.state != Experiment.State.RUNNING:
            raise _refusal(experiment, "only a running experiment can be paused")
        experiment.state = Experiment.State.PAUSED
        experiment.reason = f"paused by {by.get_username()}"
        experiment.save(update_fields=["state", "reason"])
    return experiment


def resume(experiment_id: int, by: User) -> Experiment:
    with transaction.atomic():
        experiment = _locked_or_missing(experiment_id)
        if experiment.state != Experiment.State.PAUSED:
            raise _refusal(experiment, "only a paused experiment can be resumed")
        experiment.state = Experiment.State.RUNNING
        experiment.reason = ""
        experiment.save(update_fields=["state", "reason"])
        transaction.on_commit(
            lambda: experiment_requests.request_advance(experiment_id), robust=True
        )
    return experiment


def stop(experiment_id: int, by: User) -> Experiment:
    """Cancel its running trials (their jobs say "experiment stopped by USER"), drop those
    waiting, and end it: stopped."""
    why = reasons.stopped_by(by.get_username())
    with transaction.atomic():
        experiment = _locked_or_missing(experiment_id)
        if not experiment.is_active:
            raise _refusal(experiment, "it has already ended")
        experiment.state = Experiment.State.STOPPING
        experiment.save(update_fields=["state"])
        driver.end_trials(experiment, studies.load(experiment), why)
        driver.end(experiment, Experiment.State.STOPPED, why)
    return experiment
