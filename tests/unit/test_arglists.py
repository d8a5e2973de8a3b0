"""Editing argument lists as a person edits a command line (jobs.arglists)."""

import argparse

import pytest

from jobs.arglists import items, merge, set_option


@pytest.mark.parametrize(
    ("args", "changes", "expected"),
    [
        # nanoGPT's resume: a `--key=value` option takes the place of the first attempt's.
        (
            ["--init_from=scratch", "--max_iters=50"],
            ["--init_from=resume"],
            ["--init_from=resume", "--max_iters=50"],
        ),
        # Absent: added at the end.
        (["--max_iters=50"], ["--init_from=resume"], ["--max_iters=50", "--init_from=resume"]),
        # Written apart in one list and joined in the other: still the same option.
        (["--lr", "0.1", "--epochs", "3"], ["--lr=0.2"], ["--lr=0.2", "--epochs", "3"]),
        (["--lr=0.1", "--epochs", "3"], ["--lr", "0.2"], ["--lr", "0.2", "--epochs", "3"]),
        # Every copy goes, so the program never sees the old value at all.
        (["--lr", "0.1", "x", "--lr=0.3"], ["--lr", "0.2"], ["--lr", "0.2", "x"]),
        # A bare flag is added once.
        (["--epochs", "3"], ["--resume"], ["--epochs", "3", "--resume"]),
        (["--resume", "--epochs", "3"], ["--resume"], ["--resume", "--epochs", "3"]),
        # Positional arguments: added unless already there.
        (["train.yaml"], ["resume.yaml"], ["train.yaml", "resume.yaml"]),
        (["train.yaml"], ["train.yaml"], ["train.yaml"]),
        # A negative number is a value, not an option.
        (["--shift", "-1"], ["--shift", "-2"], ["--shift", "-2"]),
        ([], [], []),
    ],
)
def test_merge_puts_an_option_in_place_of_the_same_option(
    args: list[str], changes: list[str], expected: list[str]
) -> None:
    assert merge(args, changes) == expected


def test_merging_twice_changes_nothing_more() -> None:
    once = merge(["--lr", "0.1", "--resume"], ["--resume", "--lr=0.2", "extra"])
    assert merge(once, ["--resume", "--lr=0.2", "extra"]) == once


def test_everything_after_a_double_dash_is_positional() -> None:
    assert [item.name for item in items(["--a", "1", "--", "--b"])] == ["--a", "", ""]


def test_set_option_keeps_the_lists_own_spelling() -> None:
    assert set_option(["--lr=0.1"], "--lr", "0.5") == ["--lr=0.5"]
    assert set_option(["--lr", "0.1"], "--lr", "0.5") == ["--lr", "0.5"]
    assert set_option(["--epochs", "3"], "--lr", "0.5") == ["--epochs", "3", "--lr", "0.5"]
    # A value that looks like an option is joined to its name, or argparse would refuse it.
    assert set_option([], "--opt", "-x") == ["--opt=-x"]


def test_argparse_reads_what_set_option_wrote() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float)
    parser.add_argument("--opt")
    parser.add_argument("--epochs", type=int)
    args = set_option(set_option(["--lr", "0.1", "--epochs", "3"], "--lr", "0.02"), "--opt", "-x")
    assert vars(parser.parse_args(args)) == {"lr": 0.02, "opt": "-x", "epochs": 3}
