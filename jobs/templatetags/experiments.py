"""`{% load experiments %}` (issue 48): the New job form's "Search…" part, filled as it was sent
when "Start search" was refused (jobs.experiment_views.experiment_new), empty otherwise, so
that every page with the job form (New job, Edit and run again) offers it; and the job page's
line naming the experiment a trial's job belongs to."""

from typing import Any

from django import template

from jobs.experiment_forms import (
    PARAMETER_TYPES,
    PRUNER_OPTION_FIELDS,
    PRUNERS,
    SEARCHERS,
    SearchForm,
)
from jobs.models import Job, Trial
from jobs.services.experiments import space

register = template.Library()


@register.inclusion_tag("jobs/_search.html", takes_context=True)
def search_part(context: template.Context) -> dict[str, Any]:
    search = context.get("search") or SearchForm()
    return {
        "search": search,
        "rows": search.rows,
        "types": PARAMETER_TYPES,
        "problems": context.get("search_problems", []),
        # Which of the form's pruner settings each pruner takes, for the page's script.
        "pruner_fields": {
            pruner: [f for f, option in PRUNER_OPTION_FIELDS.items() if option in takes]
            for pruner, takes in space.PRUNER_OPTIONS.items()
        },
    }


@register.inclusion_tag("jobs/_trial_line.html")
def trial_line(job: Job) -> dict[str, Any]:
    """The job page's "Trial 3 of experiment digits-lr-bs" with the trial's parameters: nothing
    for a job that is no trial."""
    trial = Trial.objects.select_related("experiment").filter(job_id=job.pk).first()
    if trial is None:
        return {"trial": None}
    return {"trial": trial, "params": params_text(trial.params)}


def params_text(params: dict[str, Any]) -> str:
    """The parameters as the experiment page writes them: "--lr 0.0316 $OPTIMIZER=adam"."""
    return " ".join(
        f"{key}={_value(value)}" if key.startswith("$") else f"{key} {_value(value)}"
        for key, value in params.items()
    )


def _value(value: Any) -> str:
    if isinstance(value, float) and not value.is_integer():
        return f"{value:.3g}"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


@register.filter
def searcher_words(searcher: str) -> str:
    """The words the Search… menu uses for a searcher: "TPE (Bayesian)" for "tpe"."""
    return dict(SEARCHERS).get(searcher, searcher)


@register.filter
def pruner_words(pruner: str) -> str:
    """The words the Search… menu uses for a pruner: "below the median", "never"."""
    return dict(PRUNERS).get(pruner, pruner)


@register.filter
def objective_value(value: float) -> str:
    """An objective in four significant digits ("0.9556"), as the experiment page's script
    writes it (static/trainyard/experiment/trials.js objectiveText)."""
    return f"{float(f'{value:.4g}'):g}"
