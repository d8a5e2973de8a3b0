"""Trainer environments that images name (`FrameworkImage.python`), made by recipe.

    python -m stack.runtimes mxnet          # or: make mxnet-env
    → /root/.cache/trainyard/runtimes/mxnet-1.9.1-py311/bin/python

Apache MXNet 1.9.1, whose parameter-server jobs the `kvstore-ps` images run, cannot live in the
agent's environment: it needs NumPy below 1.24, and the agent's trainers have NumPy 2. Its
image therefore names an interpreter of its own, made here: a virtualenv with exactly the
pinned packages, built once and reused while the recipe is unchanged (a stamp in it records
the recipe). Everything comes from the package registry (MXNet's wheel is about 50 MB); nothing
is downloaded when a job runs.

On a cluster, run the same command on every GPU host (or build the environment into the host
image) and give the image the path it prints (`docs/deploy.md`).
"""

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

RUNTIMES_DIR_ENV = "TRAINYARD_RUNTIMES_DIR"
DEFAULT_RUNTIMES_DIR = Path.home() / ".cache" / "trainyard" / "runtimes"
STAMP = "trainyard-recipe.json"


@dataclass(frozen=True)
class Recipe:
    name: str
    packages: tuple[str, ...]  # exact pins: the same environment on every host
    check: str  # Python run in the new environment; it must print the version

    @property
    def folder_name(self) -> str:
        return f"{self.name}-py{sys.version_info.major}{sys.version_info.minor}"

    def fingerprint(self) -> str:
        text = json.dumps([self.packages, self.check, sys.version_info[:2]])
        return hashlib.sha256(text.encode()).hexdigest()[:16]


RECIPES = {
    "mxnet": Recipe(
        name="mxnet-1.9.1",
        # MXNet 1.9.1 uses np.bool and friends, which NumPy 1.24 removed.
        packages=("mxnet==1.9.1", "numpy==1.23.5", "requests>=2.20,<3", "graphviz==0.8.4"),
        check="import mxnet; print(mxnet.__version__)",
    ),
}


def runtimes_dir() -> Path:
    return Path(os.environ.get(RUNTIMES_DIR_ENV) or DEFAULT_RUNTIMES_DIR)


def ensure(recipe: Recipe, root: Path | None = None, quiet: bool = True) -> Path:
    """The recipe's environment, built if it is missing, half-built, or from another recipe;
    returns its python. The stamp is written last: its presence means the build finished."""
    folder = (root or runtimes_dir()) / recipe.folder_name
    python = folder / "bin" / "python"
    stamp = folder / STAMP
    if python.exists() and stamp.exists():
        if json.loads(stamp.read_text()).get("fingerprint") == recipe.fingerprint():
            return python
    shutil.rmtree(folder, ignore_errors=True)
    folder.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True)
    pip = [str(python), "-m", "pip", "install", "--disable-pip-version-check"]
    if quiet:
        pip.append("--quiet")
    subprocess.run([*pip, *recipe.packages], check=True)
    version = subprocess.run(
        [str(python), "-c", recipe.check], capture_output=True, text=True, check=True
    ).stdout.strip()
    stamp.write_text(
        json.dumps(
            {"fingerprint": recipe.fingerprint(), "packages": recipe.packages, "version": version}
        )
    )
    return python


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build a trainer environment by recipe.")
    parser.add_argument("recipe", choices=sorted(RECIPES))
    parser.add_argument("--root", type=Path, default=None, help=f"default: ${RUNTIMES_DIR_ENV}")
    args = parser.parse_args(argv)
    print(ensure(RECIPES[args.recipe], args.root, quiet=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
