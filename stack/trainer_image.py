"""The built-in trainer image, made on this machine without a registry.

    python -m stack.trainer_image          # or: make trainer-image
    → localhost/trainyard-trainer:3f2a…

No registry is reachable from these hosts, but Debian's packages and PyPI are. The image is
made in three steps, once per machine and recipe (its tag is the recipe's fingerprint, so an
image that exists is the one this recipe makes and a changed recipe makes a new one):

1. a Debian root file system of Python and little else (`mmdebstrap --variant=minbase`),
   imported as an image of one layer (`podman import`);
2. the trainer's wheels fetched on the host by `pip download`, at the versions the agent's own
   trainers have (torch as constraints.txt pins it: the local CPU wheel);
3. `podman build` of deploy/images/trainer/Containerfile, which installs them with the wheels
   bound read-only for that step only.

A cluster builds its images its own way (docs/deploy.md); this one is what `make test` and
`make run --containers` use.
"""

import argparse
import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from workers import containers
from workers.containers import Runtime

REPO = Path(__file__).resolve().parent.parent
CONTAINERFILE = REPO / "deploy" / "images" / "trainer" / "Containerfile"
# podman's settings for these hosts: no raised rlimits, runc, cgroupfs (the file says why).
CONTAINERS_CONF = REPO / "deploy" / "podman" / "containers.conf"
CONSTRAINTS = REPO / "constraints.txt"
REPOSITORY = "localhost/trainyard-trainer"
DEBIAN_SUITE = "bookworm"  # its python3 is 3.11, the agent's own
DEBIAN_PACKAGES = ("python3", "python3-venv")
# What the built-in examples import; torch's version comes from constraints.txt.
TRAINER_PACKAGES = ("torch", "numpy", "scikit-learn")
TOOLS = ("podman", "runc", "mmdebstrap")


class ImageBuildError(RuntimeError):
    pass


# podman as the agents here run it: this machine's settings file, an environment of its own.
PODMAN = Runtime("podman", CONTAINERS_CONF)


def runtime_env() -> dict[str, str]:
    return PODMAN.env()


def missing_tools() -> list[str]:
    return [tool for tool in TOOLS if shutil.which(tool) is None]


def pinned(package: str) -> str:
    """`package==version`: constraints.txt's pin, else the version this environment has."""
    for line in CONSTRAINTS.read_text().splitlines():
        requirement = line.split("#")[0].strip()
        if requirement.split("==")[0].strip().lower() == package:
            return requirement
    return f"{package}=={importlib.metadata.version(package)}"


@dataclass(frozen=True)
class Recipe:
    packages: tuple[str, ...]

    @classmethod
    def current(cls) -> "Recipe":
        return cls(tuple(pinned(p) for p in TRAINER_PACKAGES))

    def fingerprint(self) -> str:
        text = json.dumps([DEBIAN_SUITE, DEBIAN_PACKAGES, self.packages, CONTAINERFILE.read_text()])
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    @property
    def reference(self) -> str:
        return f"{REPOSITORY}:{self.fingerprint()}"


def exists(reference: str) -> bool:
    argv = containers.image_exists_argv(PODMAN.path, reference)
    return subprocess.run(argv, env=runtime_env(), check=False).returncode == 0


def _run(argv: list[str], what: str, env: dict[str, str] | None = None) -> None:
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        words = (done.stderr or done.stdout).strip().splitlines()[-5:]
        raise ImageBuildError(f"{what} failed ({done.returncode}): " + " / ".join(words))


def build(recipe: Recipe, say=print) -> str:
    """Make the recipe's image; returns its reference."""
    lacking = missing_tools()
    if lacking:
        raise ImageBuildError(
            f"{', '.join(lacking)} missing: `make containers` installs them "
            "(apt-get install podman runc mmdebstrap)"
        )
    reference = recipe.reference
    base = f"localhost/trainyard-debian:{DEBIAN_SUITE}-{recipe.fingerprint()}"
    with tempfile.TemporaryDirectory(prefix="trainyard-image-") as scratch:
        root_tar = Path(scratch) / "root.tar"
        wheels = Path(scratch) / "wheels"
        started = time.monotonic()
        say(f"Debian {DEBIAN_SUITE} root file system (mmdebstrap) …")
        _run(
            ["mmdebstrap", "--quiet", "--variant=minbase",
             f"--include={','.join(DEBIAN_PACKAGES)}", DEBIAN_SUITE, str(root_tar)],
            "mmdebstrap",
        )  # fmt: skip
        _run(["podman", "import", str(root_tar), base], "podman import", runtime_env())
        root_tar.unlink()
        say(f"wheels: {' '.join(recipe.packages)} …")
        _run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:",
             "--dest", str(wheels), *recipe.packages],
            "pip download",
        )  # fmt: skip
        say(f"podman build {reference} …")
        _run(
            ["podman", "build", "--quiet", "--network", "none",
             "--volume", f"{wheels}:/wheels:ro",
             "--build-arg", f"BASE={base}", "--build-arg", f"PACKAGES={' '.join(recipe.packages)}",
             "--label", f"trainyard.recipe={recipe.fingerprint()}",
             "--file", str(CONTAINERFILE), "--tag", reference, scratch],
            "podman build",
            runtime_env(),
        )  # fmt: skip
        # The base served this build only; the image keeps its layer.
        subprocess.run(["podman", "rmi", base], env=runtime_env(), capture_output=True, check=False)
        say(f"built {reference} in {time.monotonic() - started:.0f} s")
    return reference


def ensure(say=print) -> str:
    """The trainer image of the current recipe, built if this machine lacks it."""
    recipe = Recipe.current()
    if not missing_tools() and exists(recipe.reference):
        return recipe.reference
    return build(recipe, say)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build the trainer container image here.")
    parser.add_argument(
        "--check", action="store_true", help="print the reference if built; exit 1 if not"
    )
    args = parser.parse_args(argv)
    if args.check:
        reference = Recipe.current().reference
        if missing_tools() or not exists(reference):
            return 1
        print(reference)
        return 0
    try:
        print(ensure(say=lambda line: print(line, file=sys.stderr)))
    except ImageBuildError as exc:
        print(f"trainer image: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    os.umask(0o022)
    sys.exit(main())
