"""A job file's `search:` section, checked and turned into an experiment request.

    search:
      space:
        --lr: {type: float, low: 0.01, high: 1.0, log: true}
        --batch-size: {type: int, low: 16, high: 128, log: true}
        $OPTIMIZER: {type: choice, choices: [sgd, adam]}
      objective: {metric: eval_accuracy, goal: max, unit: epoch}
      searcher: tpe                 # random | tpe | grid
      pruner: successive_halving    # none | median | successive_halving | hyperband
      pruner_options: {min_resource: 1, reduction_factor: 3}
      budget: {trials: 12, parallel: 3, core_hours: 2}
      seed: 7

The rest of the file is the experiment's `template`, a job request exactly as `trainyard
submit` builds it. The section is checked here, whole, before anything is uploaded: an unknown
key or a bad value is refused naming its place in the file (`search.space.--lr.low`), so a
mistyped file leaves nothing on the console. What only the console can judge (whether the
metric is one the program reports, the names of a pruner's options, the template's own
fields) it refuses in the same words, its fields renamed to the file's (`renamed`).
"""

import math
import re
from typing import Any

from trainyard_cli.errors import BAD_INPUT, CliError

SECTION = "search"
KEYS = ("name", "space", "objective", "searcher", "pruner", "pruner_options", "budget", "seed")
SEARCHERS = ("random", "tpe", "grid")
PRUNERS = ("none", "median", "successive_halving", "hyperband")
GOALS = ("max", "min")
UNITS = ("epoch", "step")
OBJECTIVE_KEYS = ("metric", "goal", "unit")
BUDGET_KEYS = ("trials", "parallel", "core_hours", "gpu_hours")
DIMENSION_KEYS = {
    "float": ("type", "low", "high", "log", "step"),
    "int": ("type", "low", "high", "log", "step"),
    "choice": ("type", "choices"),
}
ARGUMENT = re.compile(r"--[^=\s]+")  # the program's option: --lr
VARIABLE = re.compile(r"\$[A-Za-z_][A-Za-z0-9_]*")  # an environment variable: $OPTIMIZER
LARGEST_SEED = 2**32 - 1  # Optuna's samplers take a 32-bit seed
# YAML 1.1 (PyYAML) reads 1e-3 as text: a number needs a dot before its exponent.
EXPONENT_AS_TEXT = re.compile(r"[-+]?\d+(\.\d*)?[eE][-+]?\d+")


class Problems:
    """Every problem of the section, by the place in the file it is about."""

    def __init__(self) -> None:
        self.by_field: dict[str, list[str]] = {}

    def add(self, field: str, message: str) -> None:
        self.by_field.setdefault(field, []).append(message)

    def raise_any(self, path: str) -> None:
        if not self.by_field:
            return
        lines = [f"{f}: {m}" for f, messages in self.by_field.items() for m in messages]
        raise CliError(f"{path}: the search: section cannot be used:", BAD_INPUT, lines)


def experiment_request(
    section: Any, template: dict[str, Any], name: str | None, path: str
) -> dict[str, Any]:
    """The body of POST /api/v1/experiments: the section's fields and the template, named by
    `name`, else the section's `name:`, else the job's. CliError (BAD_INPUT) listing every
    problem of the section otherwise."""
    problems = Problems()
    if not isinstance(section, dict):
        problems.add(SECTION, "must be a mapping of space:, objective:, budget:, ...")
        problems.raise_any(path)
        return {}  # not reached
    _unknown_keys(section, KEYS, SECTION, problems)
    for required in ("space", "objective", "budget"):
        if required not in section:
            problems.add(f"{SECTION}.{required}", "is required.")
    space = section.get("space")
    if "space" in section:
        _check_space(space, problems)
    if "objective" in section:
        _check_objective(section["objective"], problems)
    if "budget" in section:
        _check_budget(section["budget"], problems)
    searcher = section.get("searcher")
    if searcher is not None:
        _one_of(searcher, SEARCHERS, f"{SECTION}.searcher", problems)
    if searcher == "grid" and isinstance(space, dict):
        _check_grid(space, problems)
    if "pruner" in section:
        _one_of(section["pruner"], PRUNERS, f"{SECTION}.pruner", problems)
    if "pruner_options" in section:
        _check_pruner_options(section["pruner_options"], problems)
    seed = section.get("seed")
    if seed is not None and not (_is_int(seed) and 0 <= seed <= LARGEST_SEED):
        problems.add(f"{SECTION}.seed", f"must be a whole number from 0 to {LARGEST_SEED}.")
    if "name" in section and not (isinstance(section["name"], str) and section["name"].strip()):
        problems.add(f"{SECTION}.name", "must be the experiment's name, as text.")
    problems.raise_any(path)
    request: dict[str, Any] = {
        "name": name or section.get("name") or template.get("name"),
        "template": template,
    }
    request.update({k: v for k, v in section.items() if k != "name"})
    return request


def renamed(field: str) -> str:
    """The console's name of a field of the experiment request as the job file names it:
    `template.roles.worker.package` is the file's `roles.worker.package`, and `space.--lr`
    its `search.space.--lr`."""
    head, _, rest = field.partition(".")
    if head == "template":
        return rest or "the job"
    if head in KEYS:
        return f"{SECTION}.{field}"
    return field


def _unknown_keys(
    mapping: dict[Any, Any], known: tuple[str, ...], where: str, problems: Problems
) -> None:
    for key in mapping:
        if key not in known:
            problems.add(f"{where}.{key}", f"is not a key here (it takes {', '.join(known)}).")


def _one_of(value: Any, allowed: tuple[str, ...], field: str, problems: Problems) -> None:
    if value not in allowed:
        problems.add(field, f"{value!r} is not one of {', '.join(allowed)}.")


def _check_space(space: Any, problems: Problems) -> None:
    where = f"{SECTION}.space"
    if not isinstance(space, dict) or not space:
        problems.add(where, "must map an argument (--lr) or a variable ($OPTIMIZER) to its values.")
        return
    for key, dimension in space.items():
        field = f"{where}.{key}"
        if not isinstance(key, str) or not (ARGUMENT.fullmatch(key) or VARIABLE.fullmatch(key)):
            problems.add(
                field,
                "is neither an argument of the program (--name) nor an environment variable "
                "($NAME).",
            )
            continue
        if not isinstance(dimension, dict):
            problems.add(field, "must be a mapping: {type: float|int|choice, ...}.")
            continue
        kind = dimension.get("type")
        if kind not in DIMENSION_KEYS:
            problems.add(f"{field}.type", f"{kind!r} is not one of float, int, choice.")
            continue
        _unknown_keys(dimension, DIMENSION_KEYS[kind], field, problems)
        if kind == "choice":
            _check_choices(dimension.get("choices"), f"{field}.choices", problems)
        else:
            _check_range(dimension, kind, field, problems)


def _check_choices(choices: Any, field: str, problems: Problems) -> None:
    if not isinstance(choices, list) or not choices:
        problems.add(field, "must be a list of the values to try.")
        return
    for index, choice in enumerate(choices):
        if not isinstance(choice, str | int | float) or (
            isinstance(choice, float) and not math.isfinite(choice)
        ):
            problems.add(f"{field}[{index}]", "must be text, a number or true/false.")
    seen: list[Any] = []
    for choice in choices:
        # 1 and true are equal in Python, but not as values of an argument.
        if any(type(choice) is type(s) and choice == s for s in seen):
            problems.add(field, f"{choice!r} is given twice.")
        seen.append(choice)


def _check_range(dimension: dict[str, Any], kind: str, field: str, problems: Problems) -> None:
    is_value = _is_whole if kind == "int" else _is_number
    what = "a whole number" if kind == "int" else "a number"
    bounds = {}
    for key in ("low", "high"):
        value = dimension.get(key)
        if key not in dimension:
            problems.add(f"{field}.{key}", "is required.")
        elif not is_value(value):
            problems.add(f"{field}.{key}", f"must be {what}{_as_text_hint(value)}.")
        else:
            bounds[key] = value
    low, high = bounds.get("low"), bounds.get("high")
    if low is not None and high is not None and low > high:
        problems.add(f"{field}.high", f"must be at least low ({low}).")
    log = dimension.get("log", False)
    if not isinstance(log, bool):
        problems.add(f"{field}.log", "must be true or false.")
    elif log and low is not None and low <= 0:
        problems.add(f"{field}.low", "must be above 0 on a log scale.")
    if "step" in dimension:
        step = dimension["step"]
        if not is_value(step) or step <= 0:
            problems.add(f"{field}.step", f"must be {what} above 0{_as_text_hint(step)}.")
        elif log is True and not (kind == "int" and step == 1):
            problems.add(f"{field}.step", "cannot go with log: true (a log scale has no step).")


def _check_grid(space: dict[str, Any], problems: Problems) -> None:
    """A grid tries every value of every dimension: each must be a list of choices or have a
    step."""
    for key, dimension in space.items():
        if isinstance(dimension, dict) and dimension.get("type") in ("float", "int"):
            if "step" not in dimension:
                problems.add(
                    f"{SECTION}.space.{key}",
                    "needs a step (or a list of choices) for searcher: grid.",
                )


def _check_objective(objective: Any, problems: Problems) -> None:
    where = f"{SECTION}.objective"
    if not isinstance(objective, dict):
        problems.add(where, "must be a mapping: {metric: eval_accuracy, goal: max, unit: epoch}.")
        return
    _unknown_keys(objective, OBJECTIVE_KEYS, where, problems)
    metric = objective.get("metric")
    if not isinstance(metric, str) or not metric.strip():
        problems.add(f"{where}.metric", "must name a metric the program reports.")
    if "goal" in objective:
        _one_of(objective["goal"], GOALS, f"{where}.goal", problems)
    if "unit" in objective:
        _one_of(objective["unit"], UNITS, f"{where}.unit", problems)


def _check_budget(budget: Any, problems: Problems) -> None:
    where = f"{SECTION}.budget"
    if not isinstance(budget, dict):
        problems.add(where, "must be a mapping: {trials: 12, parallel: 3, core_hours: 2}.")
        return
    _unknown_keys(budget, BUDGET_KEYS, where, problems)
    for key in ("trials", "parallel"):
        if key in budget and not (_is_int(budget[key]) and budget[key] >= 1):
            problems.add(f"{where}.{key}", "must be a whole number from 1.")
    if "trials" not in budget:
        problems.add(f"{where}.trials", "is required: how many trials in all.")
    for key in ("core_hours", "gpu_hours"):
        value = budget.get(key)
        if value is not None and not (_is_number(value) and value > 0):
            problems.add(
                f"{where}.{key}", f"must be a number above 0, or null{_as_text_hint(value)}."
            )


def _check_pruner_options(options: Any, problems: Problems) -> None:
    """Their names and least values depend on the pruner: the console says which it takes."""
    where = f"{SECTION}.pruner_options"
    if not isinstance(options, dict):
        problems.add(where, "must be a mapping: {min_resource: 1, reduction_factor: 3}.")
        return
    for key, value in options.items():
        if not _is_int(value):
            problems.add(f"{where}.{key}", f"must be a whole number{_as_text_hint(value)}.")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_whole(value: Any) -> bool:
    """A whole number, written as one or not (16 or 16.0)."""
    return _is_int(value) or (_is_number(value) and float(value).is_integer())


def _is_number(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    return _is_int(value)


def _as_text_hint(value: Any) -> str:
    if isinstance(value, str) and EXPONENT_AS_TEXT.fullmatch(value.strip()):
        return f" (YAML reads {value} as text: write it with a dot, e.g. 1.0e-3, or as 0.001)"
    return ""
