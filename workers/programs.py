"""Resolving a job's program to a file, without ever leaving its root.

The console checks a path when the job is submitted and the agent checks it again on its own
host before running anything: the agent never trusts a path it was sent.
"""

from dataclasses import dataclass
from pathlib import Path, PurePosixPath

EXAMPLES_DIR = Path(__file__).resolve().parent / "examples"

# Built-in example programs by the name users pick in the form and the API.
BUILTIN_EXAMPLES: dict[str, str] = {
    "digits-ddp": "digits_ddp.py",
    "digits-ps": "digits_ps.py",
    "synthetic-ddp": "synthetic_ddp.py",
}
BUILTIN_DESCRIPTIONS: dict[str, str] = {
    "digits-ddp": "PyTorch DDP: a small MLP on scikit-learn's digits, one data shard per rank",
    "digits-ps": "Parameter server: the same MLP, servers hold the weights, workers push grads",
    "synthetic-ddp": "Throughput benchmark with cached input: DDP on one random batch, reused",
}


@dataclass(frozen=True)
class ExampleArgument:
    """One command-line option of a built-in example, as the New-job page lists it."""

    flag: str  # "--epochs"
    value: str  # what it takes: "N", "RATE", "MODE"
    default: str  # as given when the option is left out
    help: str


# Each example's options, in its --help order; tests/unit/test_programs.py checks them against
# the example's own argument parser, so that the page never lists an option the script lacks.
BUILTIN_ARGUMENTS: dict[str, tuple[ExampleArgument, ...]] = {
    "digits-ddp": (
        ExampleArgument("--epochs", "N", "20", "passes over the data"),
        ExampleArgument("--batch-size", "N", "32", "mini-batch size per rank, not global"),
        ExampleArgument(
            "--lr",
            "RATE",
            "0.05",
            "learning rate for one rank; scaled linearly by the world size after warm-up",
        ),
        ExampleArgument(
            "--seed", "N", "0", "the same number gives the same initial weights and data order"
        ),
        ExampleArgument(
            "--min-epoch-seconds",
            "S",
            "0",
            "make every epoch last at least this long, as a larger data set's would (0: as fast "
            "as it goes): for trying what acts between epochs, early stopping or preemption",
        ),
    ),
    "digits-ps": (
        ExampleArgument(
            "--kvstore",
            "MODE",
            "the job's kvstore mode",
            "how servers apply the workers' gradients",
        ),
        ExampleArgument("--epochs", "N", "20", "passes over the data"),
        ExampleArgument("--batch-size", "N", "32", "mini-batch size per worker, not global"),
        ExampleArgument(
            "--lr",
            "RATE",
            "0.05",
            "learning rate for one machine; sync modes scale it by the number of workers",
        ),
        ExampleArgument(
            "--seed", "N", "0", "the same number gives the same initial weights and data order"
        ),
    ),
    "synthetic-ddp": (
        ExampleArgument("--steps", "N", "300", "training steps; the first 5 are not timed"),
        ExampleArgument("--batch-size", "N", "128", "mini-batch size per rank"),
        ExampleArgument("--width", "N", "512", "hidden units of the MLP"),
        ExampleArgument("--lr", "RATE", "0.01", "learning rate"),
    ),
}
# Which framework each example is written for; it only runs under an image of that framework.
BUILTIN_FRAMEWORKS: dict[str, str] = {
    "digits-ddp": "pytorch",
    "digits-ps": "kvstore",
    "synthetic-ddp": "pytorch",
}


class ProgramError(ValueError):
    """The program reference is not something we will run; the message says why."""


def resolve_under_root(root: Path, relative: str) -> Path:
    """Return the existing regular file `relative` names inside `root`, or raise ProgramError.

    Absolute paths, `..` components and symlinks that lead outside the root are all refused;
    the check is made on the fully resolved path, so a symlink chain cannot slip out.
    """
    if not relative or not relative.strip():
        raise ProgramError("Give a script path relative to the code root.")
    if "\x00" in relative:
        raise ProgramError("The script path contains a NUL byte.")
    pure = PurePosixPath(relative)
    if pure.is_absolute() or relative.startswith("~"):
        raise ProgramError("The script path must be relative to the code root, not absolute.")
    if ".." in pure.parts:
        raise ProgramError("The script path may not contain '..'.")
    root = root.resolve()
    candidate = (root / pure).resolve()
    if not candidate.is_relative_to(root):
        raise ProgramError("The script path leads outside the code root.")
    try:
        is_file = candidate.is_file()
    except OSError as exc:  # a name too long for the file system, say
        raise ProgramError(f"No script at that path under the code root: {exc.strerror}.") from None
    if not is_file:
        raise ProgramError(f"No script at {relative!r} under the code root.")
    return candidate


def resolve_program(program: dict[str, str], code_root: Path) -> Path:
    """Map {"example": name} or {"path": relative} to the file to run."""
    if "example" in program:
        name = program["example"]
        if name not in BUILTIN_EXAMPLES:
            raise ProgramError(f"Unknown built-in example {name!r}.")
        return EXAMPLES_DIR / BUILTIN_EXAMPLES[name]
    if "path" in program:
        return resolve_under_root(code_root, program["path"])
    raise ProgramError("A program is either a built-in example or a path under the code root.")
