import os
from pathlib import Path

import pytest

from workers.programs import EXAMPLES_DIR, ProgramError, resolve_program, resolve_under_root


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
