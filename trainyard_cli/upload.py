"""The user's code folder as the archive a code snapshot is made of.

What is left out: version control and tool folders (.git, __pycache__, virtualenvs,
node_modules), and whatever the folder's .gitignore and .trainyardignore name (the same
wildcard rules as git's). Symbolic links are left out too, with a warning: the console refuses
them, since a link can point outside the folder.
"""

import io
import os
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

import pathspec

from trainyard_cli.errors import BAD_INPUT, CliError

IGNORE_FILES = (".gitignore", ".trainyardignore")
ALWAYS_LEFT_OUT = [
    ".git/",
    ".hg/",
    ".svn/",
    "__pycache__/",
    "*.pyc",
    ".venv/",
    "venv/",
    "node_modules/",
    ".mypy_cache/",
    ".pytest_cache/",
    ".ruff_cache/",
    ".ipynb_checkpoints/",
    ".DS_Store",
]


@dataclass
class Packed:
    archive: bytes
    files: list[str]
    size: int  # bytes of the files, before compression
    skipped_links: list[str] = field(default_factory=list)
    # What the folder's own .gitignore or .trainyardignore left out (a folder ends in "/"):
    # said, since a project's prepared data is often ignored by git and needed by its script.
    ignored: list[str] = field(default_factory=list)


def _rules(folder: Path) -> pathspec.GitIgnoreSpec:
    lines = list(ALWAYS_LEFT_OUT)
    for name in IGNORE_FILES:
        path = folder / name
        if path.is_file():
            lines += path.read_text(errors="replace").splitlines()
    return pathspec.GitIgnoreSpec.from_lines(lines)


@dataclass
class Chosen:
    files: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)


def files_to_upload(folder: Path) -> Chosen:
    """The files of `folder` to upload, the links left out, and what the folder's own ignore
    files left out (not tool folders), as sorted relative paths."""
    rules = _rules(folder)
    tools = pathspec.GitIgnoreSpec.from_lines(ALWAYS_LEFT_OUT)
    chosen = Chosen()

    def left_out(relative: str) -> bool:
        if not rules.match_file(relative):
            return False
        if not tools.match_file(relative):
            chosen.ignored.append(relative)
        return True

    for current, dirs, names in os.walk(folder):
        here = Path(current).relative_to(folder)
        kept_dirs = []
        for d in sorted(dirs):
            relative = (here / d).as_posix()
            if (Path(current) / d).is_symlink():
                chosen.links.append(relative)
            elif not left_out(relative + "/"):
                kept_dirs.append(d)
        dirs[:] = kept_dirs  # os.walk descends only into these
        for name in names:
            relative = (here / name).as_posix()
            path = Path(current) / name
            if left_out(relative):
                continue
            if path.is_symlink():
                chosen.links.append(relative)
            elif path.is_file():
                chosen.files.append(relative)
    return Chosen(sorted(chosen.files), sorted(chosen.links), sorted(chosen.ignored))


def pack(folder: Path) -> Packed:
    """A .tar.gz of the folder's files (the console repacks it canonically and names it by
    its SHA-256, so the same files always make the same snapshot)."""
    if not folder.is_dir():
        raise CliError(f"{folder} is not a folder.", BAD_INPUT)
    chosen = files_to_upload(folder)
    files = chosen.files
    if not files:
        raise CliError(f"{folder} has no files to upload.", BAD_INPUT)
    buffer = io.BytesIO()
    size = 0
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for relative in files:
            path = folder / relative
            info = archive.gettarinfo(str(path), arcname=relative)
            size += info.size
            with path.open("rb") as content:
                archive.addfile(info, content)
    return Packed(buffer.getvalue(), files, size, chosen.links, chosen.ignored)
