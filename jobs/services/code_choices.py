"""What the New-job page offers to run: the built-in examples, the scripts under the code root,
and the code snapshots the user uploaded.

Only a menu. Whatever is picked, or typed, is checked on submission like any API request
(jobs.services.submission), so a listing that is stale or cut short never lets anything
through that a typed path would not.
"""

import os
from dataclasses import dataclass
from pathlib import Path

from django.contrib.auth.models import User

from jobs.models import Framework
from jobs.services import snapshots
from workers.programs import (
    BUILTIN_ARGUMENTS,
    BUILTIN_DESCRIPTIONS,
    BUILTIN_EXAMPLES,
    BUILTIN_FRAMEWORKS,
    ExampleArgument,
    ProgramError,
    resolve_under_root,
)

# The most scripts listed; the others still run when their path is typed.
MAX_SCRIPTS = 200
# The most folder entries looked at: a code root that also holds a data set or a virtualenv
# must not make the form slow to open.
MAX_ENTRIES_SEEN = 20_000
# Folders that hold no one's training script.
SKIPPED_FOLDERS = frozenset({"__pycache__", "node_modules", "site-packages"})
# The script a snapshot most likely starts from, in this order, before any other .py file.
LIKELY_ENTRY_POINTS = ("train.py", "main.py", "run.py")


@dataclass(frozen=True)
class Example:
    name: str
    framework: str
    description: str
    arguments: tuple[ExampleArgument, ...]

    @property
    def framework_label(self) -> str:
        return str(Framework(self.framework).label)


@dataclass(frozen=True)
class ScriptList:
    paths: list[str]  # relative to the code root, sorted
    complete: bool  # False: the root holds more than were listed


@dataclass(frozen=True)
class SnapshotChoice:
    sha256: str
    label: str
    scripts: list[str]  # its Python files
    entry_point: str  # the one to preselect; "" when it has no Python file


def examples() -> list[Example]:
    return [
        Example(
            name,
            BUILTIN_FRAMEWORKS[name],
            BUILTIN_DESCRIPTIONS.get(name, ""),
            BUILTIN_ARGUMENTS.get(name, ()),
        )
        for name in BUILTIN_EXAMPLES
    ]


def code_root_scripts(
    root: Path, limit: int = MAX_SCRIPTS, budget: int = MAX_ENTRIES_SEEN
) -> ScriptList:
    """The *.py files under `root` a job may run, skipping hidden files and folders (.git,
    .venv) and SKIPPED_FOLDERS. Symlinks are not followed into folders, and a file whose link
    leads outside the root is left out, as submission would refuse it."""
    found: list[str] = []
    seen = 0
    complete = True
    for folder, subfolders, files in os.walk(root):
        seen += len(subfolders) + len(files)
        subfolders[:] = sorted(
            d for d in subfolders if not d.startswith(".") and d not in SKIPPED_FOLDERS
        )
        relative = Path(folder).relative_to(root)
        for name in sorted(files):
            if not name.endswith(".py") or name.startswith("."):
                continue
            path = (relative / name).as_posix()
            try:
                resolve_under_root(root, path)
            except ProgramError:
                continue
            found.append(path)
        if len(found) > limit or seen > budget:
            complete = False
            break
    return ScriptList(sorted(found)[:limit], complete)


def snapshot_choices(owner: User) -> list[SnapshotChoice]:
    """The owner's uploads, the latest first, each with the Python files it holds."""
    choices = []
    for upload in snapshots.uploads_of(owner):
        snapshot = upload.snapshot
        scripts = [p for p in snapshot.files if p.endswith(".py")]
        files = len(snapshot.files)
        name = upload.name or "unnamed upload"
        label = (
            f"{name} · {snapshot.sha256[:12]} · {files} file{'s' if files != 1 else ''}, "
            f"uploaded {upload.uploaded:%Y-%m-%d %H:%M} UTC"
        )
        choices.append(SnapshotChoice(snapshot.sha256, label, scripts, entry_point(scripts)))
    return choices


def entry_point(scripts: list[str]) -> str:
    """train.py, main.py or run.py at the top, else the first one at the top, else the first."""
    for name in LIKELY_ENTRY_POINTS:
        if name in scripts:
            return name
    top = [p for p in scripts if "/" not in p]
    return (top or scripts or [""])[0]
