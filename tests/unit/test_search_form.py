"""The New job form's "Search…" part (jobs/experiment_forms.py): its rows and fields become the
experiment request the contract names; what cannot be read as numbers is said per row, and
what the numbers mean is left to the experiment service."""

from django.http import QueryDict

from jobs.experiment_forms import GOALS, PRUNERS, SEARCHERS, UNITS, SearchForm
from jobs.models import Experiment

TEMPLATE = {"name": "digits", "image": "pytorch:2.13-cpu", "program": {"script": "digits-ddp"}}


def posted(**given: list[str] | str) -> QueryDict:
    """The search part as the form posts it: lists are the space's columns, strings replace
    the fields' values."""
    data = QueryDict(mutable=True)
    fields = {"metric": "eval_accuracy", "goal": "max", "unit": "epoch", "searcher": "tpe"}
    fields.update(pruner="median", trials="4", parallel="2", seed="7")
    fields.update({k: v for k, v in given.items() if isinstance(v, str)})
    for name, value in fields.items():
        data[f"search-{name}"] = value
    for column, values in given.items():
        if isinstance(values, list):
            data.setlist(f"search-space-{column}", values)
    return data


def test_it_builds_the_experiment_request_around_the_job() -> None:
    form = SearchForm(
        posted(
            key=["--lr", "--batch-size", "$OPTIMIZER", ""],
            type=["float", "int", "choice", "float"],
            low=["0.01", "16", "", ""],
            high=["1", "128", "", ""],
            scale=["log", "linear", "linear", "linear"],
            step=["", "16", "", ""],
            choices=["", "", "sgd, adam, 3, true", ""],
        )
    )
    assert form.is_valid(), (form.errors, form.space_errors)
    request = form.as_request(TEMPLATE)
    assert request["name"] == "digits search"
    assert request["template"] is TEMPLATE
    assert request["space"] == {
        "--lr": {"type": "float", "log": True, "low": 0.01, "high": 1.0},
        "--batch-size": {"type": "int", "log": False, "low": 16, "high": 128, "step": 16},
        "$OPTIMIZER": {"type": "choice", "choices": ["sgd", "adam", 3, True]},
    }
    assert request["objective"] == {"metric": "eval_accuracy", "goal": "max", "unit": "epoch"}
    assert (request["searcher"], request["pruner"], request["seed"]) == ("tpe", "median", 7)
    assert request["budget"] == {"trials": 4, "parallel": 2, "core_hours": None, "gpu_hours": None}


def test_a_bound_that_is_no_number_is_named_with_its_row() -> None:
    form = SearchForm(
        posted(
            key=["--lr", "--batch-size"],
            type=["float", "int"],
            low=["small", "16.5"],
            high=["1", "64"],
            scale=["log", "linear"],
            step=["", ""],
            choices=["", ""],
        )
    )
    assert not form.is_valid()
    assert form.space_errors == [
        "--lr: low 'small' is not a number.",
        "--batch-size: low '16.5' is not a whole number.",
    ]


def test_a_search_of_nothing_or_of_one_key_twice_is_refused() -> None:
    empty = SearchForm(posted(key=[""], type=["float"], low=[""], high=[""]))
    assert not empty.is_valid()
    assert empty.space_errors == [
        "Name at least one argument (--lr) or variable ($OPTIMIZER) to search."
    ]
    twice = SearchForm(
        posted(key=["--lr", "--lr"], type=["float", "float"], low=["1", "1"], high=["2", "3"])
    )
    assert not twice.is_valid()
    assert twice.space_errors == ["--lr: searched twice; keep one row for it."]


def test_the_budget_must_be_whole_trials() -> None:
    data = posted(key=["--lr"], type=["float"], low=["0.1"], high=["1"], scale=["log"])
    data["search-trials"] = "0"
    form = SearchForm(data)
    assert not form.is_valid()
    assert "trials" in form.errors


def test_the_menus_offer_every_choice_the_model_has_and_no_other() -> None:
    assert [v for v, _ in GOALS] == Experiment.Goal.values
    assert sorted(v for v, _ in UNITS) == sorted(Experiment.Unit.values)
    assert sorted(v for v, _ in SEARCHERS) == sorted(Experiment.Searcher.values)
    assert sorted(v for v, _ in PRUNERS) == sorted(Experiment.Pruner.values)


def test_only_the_settings_the_chosen_pruner_takes_are_sent() -> None:
    rows = {"key": ["--lr"], "type": ["float"], "low": ["0.1"], "high": ["1"]}
    median = posted(**rows, pruner="median", startup_trials="1", reduction_factor="2")
    form = SearchForm(median)
    assert form.is_valid(), form.errors
    assert form.as_request(TEMPLATE)["pruner_options"] == {"n_startup_trials": 1}
    halving = posted(
        **rows,
        pruner="successive_halving",
        startup_trials="1",
        min_resource="1",
        reduction_factor="2",
    )
    form = SearchForm(halving)
    assert form.is_valid(), form.errors
    assert form.as_request(TEMPLATE)["pruner_options"] == {"min_resource": 1, "reduction_factor": 2}
    unset = SearchForm(posted(**rows))
    assert unset.is_valid()
    assert "pruner_options" not in unset.as_request(TEMPLATE)
