import argparse
import importlib
import os
from pathlib import Path

import pytest

from workers.programs import (
    BUILTIN_ARGUMENTS,
    BUILTIN_EXAMPLES,
    EXAMPLES_DIR,
    ProgramError,
    resolve_program,
    resolve_under_root,
)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "code" / "sub").mkdir(parents=True)
    (tmp_path / "code" / "sub" / "train.py").write_text("print(1)\n")
    (tmp_path / "outside.py").write_text("print('outside')\n")
    return tmp_path / "code"


def test_it_resolves_a_relative_path_inside_the_root(root: Path) -> None:
    assert resolve_under_root(root, "sub/train.py") == (root / "sub" / "train.py").resolve()


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("../outside.py", "'..'"),
        ("sub/../../outside.py", "'..'"),
        ("/etc/passwd", "absolute"),
        ("~/x.py", "absolute"),
        ("", "relative"),
        ("sub/missing.py", "No script"),
        ("sub", "No script"),
        ("a\x00b", "NUL"),
    ],
)
def test_it_refuses_paths_that_are_not_files_inside_the_root(
    root: Path, path: str, message: str
) -> None:
    with pytest.raises(ProgramError, match=message):
        resolve_under_root(root, path)


def test_it_refuses_a_symlink_that_leads_out(root: Path) -> None:
    os.symlink(root.parent / "outside.py", root / "link.py")
    with pytest.raises(ProgramError, match="outside the code root"):
        resolve_under_root(root, "link.py")


def test_it_refuses_a_symlinked_folder_that_leads_out(root: Path) -> None:
    os.symlink(root.parent, root / "up")
    with pytest.raises(ProgramError, match="outside the code root"):
        resolve_under_root(root, "up/outside.py")


def test_it_maps_builtin_examples_to_shipped_files(root: Path) -> None:
    path = resolve_program({"example": "digits-ddp"}, root)
    assert path.parent == EXAMPLES_DIR and path.is_file()
    with pytest.raises(ProgramError):
        resolve_program({"example": "nope"}, root)


class _Parsed(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser


def options_of(example: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, argparse.Action]:
    """The example's own argument parser's options, caught as its parse_args runs."""

    def catch(self: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        raise _Parsed(self)

    module = importlib.import_module(f"workers.examples.{BUILTIN_EXAMPLES[example][:-3]}")
    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", catch)
    with pytest.raises(_Parsed) as caught:
        module.parse_args([])
    return {a.option_strings[-1]: a for a in caught.value.parser._actions if a.dest != "help"}


@pytest.mark.parametrize("example", sorted(BUILTIN_EXAMPLES))
def test_the_arguments_the_page_lists_are_the_examples_own(
    example: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TRAINYARD_KVSTORE", raising=False)
    options = options_of(example, monkeypatch)
    listed = BUILTIN_ARGUMENTS[example]
    assert [a.flag for a in listed] == list(options)
    for argument in listed:
        option = options[argument.flag]
        assert argument.help == option.help
        if option.dest == "kvstore":  # from TRAINYARD_KVSTORE: the mode picked for the job
            assert argument.default == "the job's kvstore mode"
        else:
            assert argument.default == str(option.default)
