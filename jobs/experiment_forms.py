"""The New job form's "Search…" part: what turns the form's job into an experiment (issue 48).

Its fields carry the prefix `search-` beside the job's own; the space is a list of rows (one
per argument or variable searched), sent as parallel lists. This module only gives them their
shapes (numbers, lists of choices) and builds the experiment request the contract names; what
the request means (a range that is empty, a log scale from 0, a budget over the quota) is
judged by jobs.services.experiments.control.create_experiment, for the form as for the API."""

from typing import Any

from django import forms
from django.http import QueryDict

from jobs.models import Experiment
from jobs.services.experiments import space

PREFIX = "search"
SPACE_COLUMNS = ("key", "type", "low", "high", "scale", "step", "choices")
PARAMETER_TYPES = [("float", "float"), ("int", "integer"), ("choice", "choices")]


# The form's fields for the pruner's settings, and the settings' names in the request.
PRUNER_OPTION_FIELDS = {
    "startup_trials": "n_startup_trials",
    "min_resource": "min_resource",
    "reduction_factor": "reduction_factor",
}
# The menus' words for the model's choices (its labels read "Tpe", "Successive Halving").
GOALS = [("max", "maximize"), ("min", "minimize")]
UNITS = [("epoch", "epoch"), ("step", "step")]
SEARCHERS = [("tpe", "TPE (Bayesian)"), ("random", "random"), ("grid", "grid")]
PRUNERS = [
    ("median", "below the median"),
    ("successive_halving", "successive halving"),
    ("hyperband", "Hyperband"),
    ("none", "never"),
]


class SearchForm(forms.Form):
    name = forms.CharField(
        required=False, max_length=200, help_text="Empty: the job's name with “search”."
    )
    metric = forms.CharField(max_length=64, initial="eval_accuracy", label="Objective metric")
    goal = forms.ChoiceField(choices=GOALS, initial="max")
    unit = forms.ChoiceField(choices=UNITS, initial="epoch", label="Judged at each")
    searcher = forms.ChoiceField(choices=SEARCHERS, initial="tpe")
    pruner = forms.ChoiceField(
        choices=PRUNERS,
        initial="median",
        label="Stop early",
        help_text="How trials that will not pay off are stopped.",
    )
    # The pruner's settings the form offers (the API takes all of Optuna's): each shown only
    # for a pruner that takes it (static/trainyard/experiment/search_form.js).
    startup_trials = forms.IntegerField(
        required=False,
        min_value=0,
        label="Judge after",
        help_text="Trials run to the end before any is stopped (Optuna: 5).",
    )
    min_resource = forms.IntegerField(
        required=False,
        min_value=1,
        label="First cut at",
        help_text="The epoch (or step) trials are first judged at.",
    )
    reduction_factor = forms.IntegerField(
        required=False,
        min_value=2,
        label="Keep 1 in",
        help_text="Each cut keeps the best 1 in this many (3).",
    )
    trials = forms.IntegerField(min_value=1, initial=12, label="Trials")
    parallel = forms.IntegerField(min_value=1, initial=3, label="At once")
    core_hours = forms.FloatField(required=False, min_value=0, label="Core-hours")
    gpu_hours = forms.FloatField(required=False, min_value=0, label="GPU-hours")
    seed = forms.IntegerField(required=False, help_text="Seeds the searcher's random choices.")

    def __init__(self, data: QueryDict | None = None) -> None:
        super().__init__(data, prefix=PREFIX)
        self.rows = space_rows(data)
        self.space_errors: list[str] = []

    def is_valid(self) -> bool:
        valid = super().is_valid()
        self.space, self.space_errors = space_of(self.rows)
        return valid and not self.space_errors

    def as_request(self, template: dict[str, Any]) -> dict[str, Any]:
        """The experiment request (the contract's shape) around this job request."""
        data = self.cleaned_data
        request: dict[str, Any] = {
            "name": data["name"] or f"{template.get('name', 'job')} search",
            "template": template,
            "space": self.space,
            "objective": {"metric": data["metric"], "goal": data["goal"], "unit": data["unit"]},
            "searcher": data["searcher"],
            "pruner": data["pruner"],
            "budget": {
                "trials": data["trials"],
                "parallel": data["parallel"],
                "core_hours": data["core_hours"],
                "gpu_hours": data["gpu_hours"],
            },
        }
        takes = space.PRUNER_OPTIONS[Experiment.Pruner(data["pruner"])]
        options = {
            option: data[field]
            for field, option in PRUNER_OPTION_FIELDS.items()
            if option in takes and data[field] is not None
        }
        if options:
            request["pruner_options"] = options
        if data["seed"] is not None:
            request["seed"] = data["seed"]
        return request


def space_rows(data: QueryDict | None) -> list[dict[str, str]]:
    """The rows as sent (the form shows them again as they were), or one empty row."""
    if data is None:
        return [dict.fromkeys(SPACE_COLUMNS, "")]
    columns = {c: data.getlist(f"{PREFIX}-space-{c}") for c in SPACE_COLUMNS}
    count = max((len(values) for values in columns.values()), default=0)
    rows = [
        {c: (values[i] if i < len(values) else "").strip() for c, values in columns.items()}
        for i in range(count)
    ]
    return rows or [dict.fromkeys(SPACE_COLUMNS, "")]


def space_of(rows: list[dict[str, str]]) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """The space (the contract's shape) from the rows that name a parameter, and what could
    not be read as numbers. An empty row is left out; a key given twice is refused."""
    space: dict[str, dict[str, Any]] = {}
    problems: list[str] = []
    for row in rows:
        key = row["key"]
        if not key:
            continue
        if key in space:
            problems.append(f"{key}: searched twice; keep one row for it.")
            continue
        kind = row["type"] or "float"
        if kind == "choice":
            space[key] = {"type": "choice", "choices": [_choice(c) for c in _split(row["choices"])]}
            continue
        spec: dict[str, Any] = {"type": kind, "log": row["scale"] == "log"}
        for bound in ("low", "high", "step"):
            text = row[bound]
            if not text and bound == "step":
                continue
            number = _number(text, whole=kind == "int")
            if number is None:
                problems.append(f"{key}: {bound} {text!r} is not {_a_number(kind)}.")
            else:
                spec[bound] = number
        space[key] = spec
    if not space and not problems:
        problems.append("Name at least one argument (--lr) or variable ($OPTIMIZER) to search.")
    return space, problems


def _a_number(kind: str) -> str:
    return "a whole number" if kind == "int" else "a number"


def _number(text: str, whole: bool) -> int | float | None:
    try:
        number = float(text)
    except ValueError:
        return None
    if whole:
        return int(number) if number.is_integer() else None
    return number


def _split(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _choice(text: str) -> str | int | float | bool:
    """A choice as the program would read it: true/false, a number, else the text."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text
