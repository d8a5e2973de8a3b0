"""An experiment's request checked (jobs/services/experiments/space.py): what it means, each bad
part refused with a message under its field, and a trial's values applied to the template."""

from typing import Any

import pytest
from django.contrib.auth.models import User
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from jobs.services.experiments import space
from jobs.services.submission import ValidationFailed
from tests.unit.experiment_helpers import search_request

pytestmark = pytest.mark.usefixtures("catalog", "code_root", "nodes")


def refusal(**overrides: Any) -> dict[str, list[str]]:
    with pytest.raises(ValidationFailed) as caught:
        space.parse_request(search_request(**overrides))
    return caught.value.errors


def test_it_reads_a_search_over_arguments_and_variables() -> None:
    spec = space.parse_request(
        search_request(
            space={
                "--lr": {"type": "float", "low": 0.01, "high": 1.0, "log": True},
                "--batch-size": {"type": "int", "low": 16, "high": 128, "step": 16},
                "$OPTIMIZER": {"type": "choice", "choices": ["sgd", "adam"]},
            }
        )
    )
    found = space.distributions(spec.dimensions)
    assert found["--lr"] == FloatDistribution(0.01, 1.0, log=True)
    assert found["--batch-size"] == IntDistribution(16, 128, step=16)
    assert found["$OPTIMIZER"] == CategoricalDistribution(("sgd", "adam"))
    assert (spec.metric, spec.goal, spec.unit) == ("eval_accuracy", "max", "epoch")
    assert (spec.budget.trials, spec.budget.parallel, spec.budget.core_hours) == (6, 3, None)
    assert spec.pruner_options == {"min_resource": 1, "reduction_factor": 3}


@pytest.mark.parametrize(
    ("dimension", "message"),
    [
        ({"type": "float", "low": 1.0, "high": 0.1}, '"low" (1.0) is above "high" (0.1).'),
        ({"type": "float", "low": 0, "high": 1, "log": True}, 'On a log scale "low" is above 0'),
        ({"type": "int", "low": 1.5, "high": 4}, 'Its "low" is a whole number.'),
        ({"type": "float", "low": "a", "high": 1}, 'Its "low" is a number.'),
        ({"type": "normal", "low": 0, "high": 1}, 'Its "type" is "float", "int" or "choice".'),
        ({"type": "choice", "choices": []}, 'Give its "choices" as a list'),
        ({"type": "choice", "choices": [1, 1]}, "A choice is given twice."),
        ({"type": "choice", "choices": [[1]]}, "Each choice is a string, a number or a boolean."),
        ({"type": "float", "low": 0, "high": 1, "mean": 3}, "A float has no 'mean'."),
        ({"type": "float", "low": 0, "high": 1, "step": 0}, 'Its "step" is a number above 0.'),
    ],
)
def test_it_refuses_a_bad_dimension_under_its_key(dimension: dict[str, Any], message: str) -> None:
    errors = refusal(space={"--lr": dimension})
    assert list(errors) == ["space.--lr"]
    assert errors["space.--lr"][0].startswith(message), errors


def test_it_refuses_a_key_that_is_neither_an_argument_nor_a_variable() -> None:
    errors = refusal(space={"lr": {"type": "float", "low": 0.1, "high": 1}})
    assert errors == {
        "space.lr": [
            "A searched value is an argument of the program (--flag) or a variable ($NAME)."
        ]
    }


def test_it_names_every_bad_part_by_field() -> None:
    errors = refusal(
        objective={"metric": "", "goal": "up"},
        searcher="bayes",
        pruner="asha",
        budget={"trials": 2, "parallel": 3, "core_hours": -1},
        seed="seven",
    )
    assert set(errors) == {
        "objective.metric",
        "objective.goal",
        "searcher",
        "pruner",
        "budget.parallel",
        "budget.core_hours",
        "seed",
    }
    assert errors["budget.parallel"] == ["At most the number of trials (2)."]
    assert errors["searcher"] == ["One of random, tpe, grid."]


def test_a_pruner_takes_only_its_own_options() -> None:
    errors = refusal(pruner="median", pruner_options={"reduction_factor": 3})
    assert errors == {
        "pruner_options.reduction_factor": [
            "The median pruner takes interval_steps, n_startup_trials, n_warmup_steps."
        ]
    }
    errors = refusal(pruner_options={"reduction_factor": 1})
    assert errors == {"pruner_options.reduction_factor": ["A whole number, at least 2."]}


def test_a_grid_needs_a_step_or_choices_for_every_dimension() -> None:
    errors = refusal(searcher="grid")
    assert errors == {
        "space.--lr": ['A grid search needs a "step" (or choices) here.'],
        "space.--batch-size": ['A grid search needs a "step" (or choices) here.'],
    }
    spec = space.parse_request(
        search_request(
            searcher="grid",
            space={
                "--lr": {"type": "choice", "choices": [0.05, 0.1, 0.5]},
                "--batch-size": {"type": "int", "low": 16, "high": 64, "step": 16},
            },
        )
    )
    assert space.grid_size(spec.dimensions) == 12


def test_a_trials_values_replace_the_templates_own_or_are_added() -> None:
    template: dict[str, Any] = {
        "name": "t",
        "program": {"script": "digits-ddp", "args": ["--lr", "0.5", "--batch-size=8", "--x"]},
        "env": {"KEEP": "1"},
    }
    request = space.apply(
        template, {"--lr": 0.05, "--batch-size": 32, "--epochs": 3, "$OPTIMIZER": "adam"}
    )
    assert request["program"]["args"] == [
        "--lr", "0.05", "--batch-size=32", "--x", "--epochs", "3",
    ]  # fmt: skip
    assert request["env"] == {"KEEP": "1", "OPTIMIZER": "adam"}
    assert template["program"]["args"][1] == "0.5", "the template itself is left as it was"


def test_a_template_that_could_never_be_submitted_is_refused_under_template(alice: User) -> None:
    template = {**search_request()["template"], "image": "nope"}
    spec = space.parse_request(search_request(template=template))
    with pytest.raises(ValidationFailed) as caught:
        space.check_template(spec, alice)
    assert "template.image" in caught.value.errors
    assert caught.value.errors["template.image"] == ["Unknown framework image 'nope'."]
    assert all(field.startswith("template.") for field in caught.value.errors)


def test_a_variable_that_the_platform_sets_is_refused_under_template(alice: User) -> None:
    spec = space.parse_request(
        search_request(space={"$RANK": {"type": "choice", "choices": ["0"]}})
    )
    with pytest.raises(ValidationFailed) as caught:
        space.check_template(spec, alice)
    assert list(caught.value.errors) == ["template.env"]
