"""Resolving a job's program to a file, without ever leaving its root.

The console checks a path when the job is submitted and the agent checks it again on its own
host before running anything: the agent never trusts a path it was sent.
"""

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
