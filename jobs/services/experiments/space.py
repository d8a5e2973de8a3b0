"""An experiment's request, checked, and a trial's parameters applied to its job template.

The request (POST /api/v1/experiments, a job file's `search:`, the form) is plain JSON: this
module says what each part means and refuses what it cannot mean, by field (`space.--lr`,
`objective.metric`, `budget.parallel`), the way job requests are refused. The template itself
is checked by the job submission's own `check_job_request` (its problems under `template.`),
with the space's lowest values in it, so that an experiment whose trials could never be
submitted is refused before it starts.
"""

import math
from dataclasses import dataclass, field
from typing import Any

from django.contrib.auth.models import User
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

from jobs import arglists
from jobs.models import Experiment
from jobs.services.submission import ValidationFailed, check_job_request

MAX_TRIALS = 1000
MAX_DIMENSIONS = 20
MAX_CHOICES = 100
MAX_GRID_POINTS = 10_000
METRIC_NAME_LENGTH = 64

Choice = str | int | float | bool
Params = dict[str, Choice]


@dataclass(frozen=True)
class Dimension:
    """One searched value: an argument (`--lr`) or a variable (`$OPTIMIZER`)."""

    key: str
    kind: str  # float | int | choice
    low: float = 0.0
    high: float = 0.0
    log: bool = False
    step: float | None = None
    choices: tuple[Choice, ...] = ()

    @property
    def is_variable(self) -> bool:
        return self.key.startswith("$")

    def distribution(self) -> BaseDistribution:
        if self.kind == "choice":
            return CategoricalDistribution(self.choices)
        if self.kind == "int":
            return IntDistribution(
                int(self.low), int(self.high), log=self.log, step=int(self.step or 1)
            )
        return FloatDistribution(self.low, self.high, log=self.log, step=self.step)

    def grid(self) -> list[Choice]:
        """Every value a grid search tries (a choice's choices, or low to high by step)."""
        if self.kind == "choice":
            return list(self.choices)
        assert self.step is not None
        count = math.floor((self.high - self.low) / self.step + 1e-9) + 1
        if self.kind == "int":
            return [int(self.low) + k * int(self.step) for k in range(count)]
        return [round(self.low + k * self.step, 12) for k in range(count)]

    def lowest(self) -> Choice:
        return self.choices[0] if self.kind == "choice" else self.low


@dataclass(frozen=True)
class Budget:
    trials: int
    parallel: int
    core_hours: float | None = None
    gpu_hours: float | None = None


@dataclass(frozen=True)
class ExperimentSpec:
    """A request, checked: everything an Experiment row is made of."""

    name: str
    template: dict[str, Any]
    dimensions: tuple[Dimension, ...]
    metric: str
    goal: str
    unit: str
    searcher: str
    pruner: str
    pruner_options: dict[str, int]
    budget: Budget
    seed: int | None
    space: dict[str, Any] = field(default_factory=dict)  # as given (normalised)


class _Errors:
    def __init__(self) -> None:
        self.by_field: dict[str, list[str]] = {}

    def add(self, where: str, message: str) -> None:
        self.by_field.setdefault(where, []).append(message)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def parse_dimension(key: Any, raw: Any, errors: _Errors) -> Dimension | None:
    where = f"space.{key}"
    if not isinstance(key, str) or not (
        (key.startswith("--") and len(key) > 2 and "=" not in key and " " not in key)
        or (key.startswith("$") and len(key) > 1)
    ):
        errors.add(
            where,
            "A searched value is an argument of the program (--flag) or a variable ($NAME).",
        )
        return None
    if not isinstance(raw, dict):
        errors.add(where, 'Give it as {"type": "float", "low": 0.01, "high": 1, "log": true}.')
        return None
    kind = raw.get("type")
    known = {"float": {"low", "high", "log", "step"}, "int": {"low", "high", "log", "step"}}
    known["choice"] = {"choices"}
    if kind not in known:
        errors.add(where, 'Its "type" is "float", "int" or "choice".')
        return None
    unknown = sorted(set(raw) - known[kind] - {"type"})
    if unknown:
        errors.add(where, f"A {kind} has no {', '.join(map(repr, unknown))}.")
        return None
    if kind == "choice":
        return _parse_choices(key, raw.get("choices"), where, errors)
    return _parse_range(key, kind, raw, where, errors)


def _parse_choices(key: str, choices: Any, where: str, errors: _Errors) -> Dimension | None:
    if not isinstance(choices, list) or not choices:
        errors.add(where, 'Give its "choices" as a list of at least one value.')
        return None
    if len(choices) > MAX_CHOICES:
        errors.add(where, f"{len(choices)} choices; at most {MAX_CHOICES}.")
        return None
    if not all(isinstance(c, str | bool) or _number(c) for c in choices):
        errors.add(where, "Each choice is a string, a number or a boolean.")
        return None
    if len({(type(c), c) for c in choices}) != len(choices):
        errors.add(where, "A choice is given twice.")
        return None
    return Dimension(key, "choice", choices=tuple(choices))


def _parse_range(
    key: str, kind: str, raw: dict[str, Any], where: str, errors: _Errors
) -> Dimension | None:
    low: Any = raw.get("low")
    high: Any = raw.get("high")
    log: Any = raw.get("log", False)
    step: Any = raw.get("step")
    whole = kind == "int"
    problems = []
    for name, value in (("low", low), ("high", high)):
        if not _number(value) or (whole and not float(value).is_integer()):
            problems.append(f'Its "{name}" is {"a whole number" if whole else "a number"}.')
    if not isinstance(log, bool):
        problems.append('Its "log" is true or false.')
    if step is not None and (not _number(step) or step <= 0 or (whole and step % 1)):
        problems.append(f'Its "step" is a {"whole " if whole else ""}number above 0.')
    if problems:
        for problem in problems:
            errors.add(where, problem)
        return None
    if low > high:
        errors.add(where, f'"low" ({low}) is above "high" ({high}).')
        return None
    if log and low <= 0:
        errors.add(where, f'On a log scale "low" is above 0 (it is {low}).')
        return None
    if log and step is not None and (not whole or step != 1):
        errors.add(where, 'A log scale takes no "step".')
        return None
    return Dimension(key, kind, float(low), float(high), log, float(step) if step else None)


def _parse_objective(raw: Any, errors: _Errors) -> tuple[str, str, str]:
    if not isinstance(raw, dict):
        errors.add("objective", 'Give it as {"metric": "eval_accuracy", "goal": "max"}.')
        return "", "", ""
    # An absent or null goal or unit is the default one.
    metric = raw.get("metric")
    goal = raw.get("goal") or Experiment.Goal.MAXIMIZE
    unit = raw.get("unit") or Experiment.Unit.EPOCH
    if not isinstance(metric, str) or not metric.strip():
        errors.add("objective.metric", "Name the metric the jobs report (e.g. eval_accuracy).")
    elif len(metric) > METRIC_NAME_LENGTH:
        errors.add("objective.metric", f"At most {METRIC_NAME_LENGTH} characters.")
    if goal not in Experiment.Goal.values:
        errors.add("objective.goal", '"max" or "min".')
    if unit not in Experiment.Unit.values:
        errors.add("objective.unit", '"epoch" or "step": what a trial\'s progress counts in.')
    unknown = sorted(set(raw) - {"metric", "goal", "unit"})
    if unknown:
        errors.add("objective", f"An objective has no {', '.join(map(repr, unknown))}.")
    return str(metric).strip() if isinstance(metric, str) else "", str(goal), str(unit)


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _parse_budget(raw: Any, errors: _Errors) -> Budget:
    if not isinstance(raw, dict):
        errors.add("budget", 'Give it as {"trials": 12, "parallel": 3}.')
        return Budget(1, 1)
    trials: Any = raw.get("trials")
    parallel: Any = 1 if raw.get("parallel") is None else raw["parallel"]
    if not _whole(trials) or not 1 <= trials <= MAX_TRIALS:
        errors.add("budget.trials", f"How many trials in all: a whole number, 1 to {MAX_TRIALS}.")
        trials = 1
    if not _whole(parallel) or parallel < 1:
        errors.add("budget.parallel", "How many trials at once: a whole number, at least 1.")
        parallel = 1
    elif parallel > trials:
        errors.add("budget.parallel", f"At most the number of trials ({trials}).")
    hours: dict[str, float | None] = {}
    for name in ("core_hours", "gpu_hours"):
        value = raw.get(name)
        if value is not None and (not _number(value) or value <= 0):
            errors.add(f"budget.{name}", "A number of hours above 0, or null for no limit.")
            value = None
        hours[name] = float(value) if value is not None else None
    unknown = sorted(set(raw) - {"trials", "parallel", "core_hours", "gpu_hours"})
    if unknown:
        errors.add("budget", f"A budget has no {', '.join(map(repr, unknown))}.")
    return Budget(trials, min(parallel, trials), hours["core_hours"], hours["gpu_hours"])


PRUNER_OPTIONS = {
    Experiment.Pruner.NONE: set(),
    Experiment.Pruner.MEDIAN: {"n_startup_trials", "n_warmup_steps", "interval_steps"},
    Experiment.Pruner.SUCCESSIVE_HALVING: {"min_resource", "reduction_factor"},
    Experiment.Pruner.HYPERBAND: {"min_resource", "max_resource", "reduction_factor"},
}
# Each option's least value (Optuna's own limits).
OPTION_LEAST = {
    "min_resource": 1,
    "max_resource": 1,
    "reduction_factor": 2,
    "n_startup_trials": 0,
    "n_warmup_steps": 0,
    "interval_steps": 1,
}


def _parse_pruner(raw: Any, options: Any, errors: _Errors) -> tuple[str, dict[str, int]]:
    pruner = Experiment.Pruner.NONE if raw is None else raw
    if pruner not in Experiment.Pruner.values:
        errors.add("pruner", f"One of {', '.join(Experiment.Pruner.values)}.")
        return Experiment.Pruner.NONE, {}
    if options is None:
        return str(pruner), {}
    if not isinstance(options, dict):
        errors.add("pruner_options", 'Give them as {"min_resource": 1, "reduction_factor": 3}.')
        return str(pruner), {}
    allowed = PRUNER_OPTIONS[Experiment.Pruner(pruner)]
    checked: dict[str, int] = {}
    for name, value in options.items():
        if name not in allowed:
            takes = ", ".join(sorted(allowed)) or "no options"
            errors.add(f"pruner_options.{name}", f"The {pruner} pruner takes {takes}.")
        elif not _whole(value) or value < OPTION_LEAST[name]:
            least = OPTION_LEAST[name]
            errors.add(f"pruner_options.{name}", f"A whole number, at least {least}.")
        else:
            checked[name] = value
    return str(pruner), checked


def grid_size(dimensions: tuple[Dimension, ...]) -> int:
    return math.prod(len(d.grid()) for d in dimensions)


def parse_request(data: Any) -> ExperimentSpec:
    """The request checked for its own sense (not the template's: check_template); raises
    ValidationFailed with every problem, by field."""
    if not isinstance(data, dict):
        raise ValidationFailed({"request": ["Give the experiment as a JSON object."]})
    errors = _Errors()
    known = {"name", "template", "space", "objective", "searcher", "pruner"}
    known |= {"pruner_options", "budget", "seed"}
    for unknown in sorted(set(data) - known):
        errors.add(str(unknown), "An experiment has no such field.")
    name = data.get("name")
    if not isinstance(name, str) or not name.strip():
        errors.add("name", "Give the experiment a name.")
        name = ""
    template = data.get("template")
    if not isinstance(template, dict):
        errors.add("template", "Give the job request each trial runs (as POST /api/v1/jobs).")
        template = {}
    raw_space = data.get("space")
    dimensions: list[Dimension] = []
    if not isinstance(raw_space, dict) or not raw_space:
        errors.add("space", 'Give at least one searched value: {"--lr": {"type": "float", …}}.')
    elif len(raw_space) > MAX_DIMENSIONS:
        errors.add("space", f"{len(raw_space)} searched values; at most {MAX_DIMENSIONS}.")
    else:
        for key, raw in raw_space.items():
            found = parse_dimension(key, raw, errors)
            if found is not None:
                dimensions.append(found)
    metric, goal, unit = _parse_objective(data.get("objective"), errors)
    searcher = data.get("searcher") or Experiment.Searcher.TPE
    if searcher not in Experiment.Searcher.values:
        errors.add("searcher", f"One of {', '.join(Experiment.Searcher.values)}.")
    pruner, options = _parse_pruner(data.get("pruner"), data.get("pruner_options"), errors)
    budget = _parse_budget(data.get("budget"), errors)
    seed: Any = data.get("seed")
    if seed is not None and (not _whole(seed) or not 0 <= seed < 2**32):
        errors.add("seed", "A whole number from 0 to 4294967295, or null.")
    if searcher == Experiment.Searcher.GRID and dimensions:
        _check_grid(tuple(dimensions), errors)
    if errors.by_field:
        raise ValidationFailed(errors.by_field)
    return ExperimentSpec(
        name.strip(),
        template,
        tuple(dimensions),
        metric,
        goal,
        unit,
        str(searcher),
        pruner,
        options,
        budget,
        seed,
        {d.key: raw_space[d.key] for d in dimensions} if isinstance(raw_space, dict) else {},
    )


def _check_grid(dimensions: tuple[Dimension, ...], errors: _Errors) -> None:
    for d in dimensions:
        if d.kind != "choice" and d.step is None:
            errors.add(f"space.{d.key}", 'A grid search needs a "step" (or choices) here.')
    if not any(f.startswith("space.") for f in errors.by_field):
        points = math.prod(len(d.grid()) for d in dimensions if d.kind == "choice" or d.step)
        if points > MAX_GRID_POINTS:
            errors.add("space", f"The grid has {points:,} points; at most {MAX_GRID_POINTS:,}.")


def distributions(dimensions: tuple[Dimension, ...]) -> dict[str, BaseDistribution]:
    return {d.key: d.distribution() for d in dimensions}


def dimensions_of(space: dict[str, Any]) -> tuple[Dimension, ...]:
    """An experiment's stored space as dimensions (it was checked when it was created)."""
    errors = _Errors()
    found = tuple(d for key, raw in space.items() if (d := parse_dimension(key, raw, errors)))
    if errors.by_field:
        raise ValueError(f"a stored space no longer parses: {errors.by_field}")
    return found


def _text(value: Choice) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)  # the shortest text that reads back as the same float
    return str(value)


def apply(template: dict[str, Any], params: Params) -> dict[str, Any]:
    """The job request of a trial: the template with each `--flag` set in its program's
    arguments (in place of `--flag V` or `--flag=V`, or added) and each `$NAME` in its
    variables."""
    request = dict(template)
    program = dict(request.get("program") or {})
    args = list(program.get("args") or [])
    env = dict(request.get("env") or {})
    for key, value in params.items():
        if key.startswith("$"):
            env[key[1:]] = _text(value)
        else:
            args = arglists.set_option(args, key, _text(value))
    program["args"] = args
    request["program"] = program
    if env:
        request["env"] = env
    return request


def trial_name(experiment_name: str, number: int) -> str:
    return f"{experiment_name} #{number}"


def check_template(spec: ExperimentSpec, owner: User) -> None:
    """Refuse (ValidationFailed, fields under `template.`) a template whose trials could not
    be submitted: it is checked as a job, with the space's lowest values in it."""
    probe = apply(spec.template, {d.key: d.lowest() for d in spec.dimensions})
    probe["name"] = trial_name(spec.name, 0)
    try:
        check_job_request(probe, owner=owner)
    except ValidationFailed as exc:
        raise ValidationFailed(
            {f"template.{where}": messages for where, messages in exc.errors.items()}
        ) from None
