"""What the New-job page offers to run (jobs/services/code_choices.py)."""

import io
import tarfile
from pathlib import Path

import pytest
from django.contrib.auth.models import User

from jobs.services import snapshots
from jobs.services.code_choices import (
    code_root_scripts,
    entry_point,
    examples,
    snapshot_choices,
)
from workers.programs import BUILTIN_EXAMPLES


def files(root: Path, *paths: str) -> Path:
    for path in paths:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text("print('hi')\n")
    return root


def test_it_lists_the_python_scripts_under_the_root_sorted(tmp_path: Path) -> None:
    root = files(tmp_path, "train.py", "models/mlp/run.py", "README.md", "data/x.csv", "a.py")
    listed = code_root_scripts(root)
    assert listed.paths == ["a.py", "models/mlp/run.py", "train.py"]
    assert listed.complete


def test_it_skips_hidden_folders_caches_and_installed_packages(tmp_path: Path) -> None:
    root = files(
        tmp_path,
        "train.py",
        ".git/hooks/x.py",
        ".venv/lib/y.py",
        "__pycache__/train.py",
        "lib/site-packages/z.py",
        "node_modules/q.py",
        ".hidden.py",
    )
    assert code_root_scripts(root).paths == ["train.py"]


def test_it_leaves_out_links_that_lead_outside_the_root(tmp_path: Path) -> None:
    root = files(tmp_path / "code", "train.py")
    files(tmp_path, "secret.py")
    (root / "escape.py").symlink_to(tmp_path / "secret.py")
    (root / "outside").symlink_to(tmp_path, target_is_directory=True)
    assert code_root_scripts(root).paths == ["train.py"]


def test_it_stops_at_the_cap_and_says_so(tmp_path: Path) -> None:
    root = files(tmp_path, *(f"s{i:03d}.py" for i in range(30)))
    listed = code_root_scripts(root, limit=10)
    assert listed.paths == [f"s{i:03d}.py" for i in range(10)]
    assert not listed.complete


def test_it_looks_at_no_more_entries_than_its_budget(tmp_path: Path) -> None:
    root = files(tmp_path, *(f"data/{i}.csv" for i in range(50)), "zzz/train.py")
    assert not code_root_scripts(root, budget=20).complete


def test_a_missing_root_lists_nothing(tmp_path: Path) -> None:
    listed = code_root_scripts(tmp_path / "nowhere")
    assert listed.paths == [] and listed.complete


def test_every_example_comes_with_its_description_and_arguments() -> None:
    listed = examples()
    assert [e.name for e in listed] == list(BUILTIN_EXAMPLES)
    digits = listed[0]
    assert digits.framework_label == "PyTorch DDP"
    assert "--epochs" in [a.flag for a in digits.arguments]
    assert all(e.description and e.arguments for e in listed)


@pytest.mark.parametrize(
    ("scripts", "expected"),
    [
        (["lib.py", "main.py", "train.py"], "train.py"),
        (["lib.py", "main.py"], "main.py"),
        (["src/deep.py", "top.py"], "top.py"),
        (["src/deep.py"], "src/deep.py"),
        ([], ""),
    ],
)
def test_it_preselects_the_likely_entry_point(scripts: list[str], expected: str) -> None:
    assert entry_point(scripts) == expected


def archive_of(root: Path) -> io.BytesIO:
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:gz") as tar:
        tar.add(root, arcname=".")
    data.seek(0)
    return data


@pytest.mark.django_db
def test_it_offers_the_users_own_uploads_with_their_python_files(
    alice: User, bob: User, tmp_path: Path
) -> None:
    root = files(tmp_path / "proj", "train.py", "lib/util.py", "README.md")
    stored = snapshots.store_upload(alice, archive_of(root), name="mlp")
    choices = snapshot_choices(alice)
    assert [c.sha256 for c in choices] == [stored.upload.snapshot.sha256]
    assert choices[0].scripts == ["lib/util.py", "train.py"]
    assert choices[0].entry_point == "train.py"
    assert choices[0].label.startswith(f"mlp · {stored.upload.snapshot.sha256[:12]} · 3 files")
    assert snapshot_choices(bob) == []
