"""Experiment pages (issue 48): the list, an experiment's page, its Pause / Resume / Stop, and
the New job form's "Search…", which turns the form's job into an experiment. Thin views over
jobs.services.experiments.control (every write) and jobs.services.views.experiments (what is
shown: the same answer as GET /api/v1/experiments/ID, which the page refreshes from)."""

from collections.abc import Callable

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import AnonymousUser, User
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from jobs.api import catalog_for
from jobs.experiment_forms import SearchForm
from jobs.forms import NewJobForm
from jobs.healthrules import describe_kinds
from jobs.models import Experiment
from jobs.services.experiments import access, control
from jobs.services.submission import ValidationFailed
from jobs.services.views import experiments as presenter

# The experiment's template's own errors are the job form's: "template.args" goes beside Arguments.
TEMPLATE_ERROR = "template."


def _experiment_for(user: User | AnonymousUser, experiment_id: int) -> Experiment:
    """The experiment if this user may see it; 404 otherwise (never 403: ids stay private)."""
    try:
        return access.get_experiment_for(user, experiment_id)
    except access.NoSuchExperiment:
        raise Http404("No such experiment.") from None


# The list shows this many experiments, newest first (as GET /api/v1/experiments does).
LIST_LIMIT = 200


@login_required
def experiment_list(request: HttpRequest) -> HttpResponse:
    experiments = list(access.visible_experiments(request.user)[: LIST_LIMIT + 1])
    return render(
        request,
        "jobs/experiment_list.html",
        {
            "rows": [(e, presenter.experiment_summary(e)) for e in experiments[:LIST_LIMIT]],
            "more": len(experiments) > LIST_LIMIT,
            "limit": LIST_LIMIT,
        },
    )


@login_required
def experiment_detail(request: HttpRequest, experiment_id: int) -> HttpResponse:
    """The page: what the server knows now, which static/trainyard/experiment/main.js draws
    and then refreshes from the API while the experiment is active."""
    experiment = _experiment_for(request.user, experiment_id)
    return render(
        request,
        "jobs/experiment_detail.html",
        {"experiment": experiment, "detail": presenter.experiment_detail(experiment)},
    )


def _control_view(
    action: Callable[..., Experiment], done: str
) -> Callable[[HttpRequest, int], HttpResponse]:
    """A POST that calls one of control's operations and goes back to the page, saying what
    happened, or why not (an experiment that has ended cannot be paused)."""

    @login_required
    @require_POST
    def view(request: HttpRequest, experiment_id: int) -> HttpResponse:
        experiment = _experiment_for(request.user, experiment_id)
        try:
            action(experiment.pk, by=request.user)
        except control.ExperimentStateError as exc:
            messages.error(request, str(exc))
        else:
            messages.success(request, done)
        return redirect("experiment_detail", experiment_id=experiment.pk)

    return view


experiment_pause = _control_view(control.pause, "Paused: running trials go on, no new one starts.")
experiment_resume = _control_view(control.resume, "Resumed: new trials start as the budget allows.")
experiment_stop = _control_view(control.stop, "Stopping: its running trials are being cancelled.")


@login_required
@require_POST
def experiment_new(request: HttpRequest) -> HttpResponse:
    """The New job form's "Start search": its job, checked as Launch checks it, becomes the
    experiment's template. A refusal shows the form again, with the search open and the
    reasons beside the fields they are about."""
    user: User = request.user  # type: ignore[assignment]  # login_required
    form = NewJobForm(request.POST, user=user)
    search = SearchForm(request.POST)
    problems: list[str] = []
    if form.is_valid() and search.is_valid():
        try:
            experiment = control.create_experiment(user, search.as_request(form.as_request()))
        except ValidationFailed as exc:
            template_errors = {
                field.removeprefix(TEMPLATE_ERROR): errors
                for field, errors in exc.errors.items()
                if field.startswith(TEMPLATE_ERROR)
            }
            form.add_service_errors(template_errors)
            problems = [
                f"{field}: {' '.join(errors)}"
                for field, errors in exc.errors.items()
                if not field.startswith(TEMPLATE_ERROR)
            ]
        else:
            return redirect("experiment_detail", experiment_id=experiment.pk)
    problems += search.space_errors
    return render(
        request,
        "jobs/new_job.html",
        {
            "form": form,
            "catalog": catalog_for(user),
            "over": [],
            "snapshot_scripts": form.snapshot_scripts(),
            "health_rule_kinds": describe_kinds(),
            "again": None,
            "search": search,
            "search_problems": problems,
        },
        status=400,
    )
