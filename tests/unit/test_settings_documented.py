"""Every environment variable the console and the agents read as a setting is in the settings
table of docs/operations.md, the one place an operator looks them up."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Where a process reads its settings: the console's settings and helpers, the local stack, the
# agent side. Not the trainer side (examples, trainer_lib, the parameter-server runtime), whose
# variables the platform sets or a job gives; the README's "What a trainer process gets" lists
# those.
READERS = ("console", "jobs", "stack", "workers")
NOT_SETTINGS_FOLDERS = ("workers/examples", "workers/trainer_lib", "workers/ps")
# Read from the environment but not settings of Trainyard's: the make variable `make run
# PORT=` passes, the sandbox's PATH, and Slurm's own name of the node a Slurm pool's test job
# runs on (jobs/services/slurm/slurm_probe.py's script, run there).
NOT_SETTINGS = {"PORT", "PATH", "SLURMD_NODENAME"}
READ = re.compile(
    r'env_\w+\(\s*"([A-Z][A-Z0-9_]+)"'
    r'|env_either\(\s*"[A-Z][A-Z0-9_]+",\s*"([A-Z][A-Z0-9_]+)"'
    r'|os\.environ\.get\(\s*"([A-Z][A-Z0-9_]+)"'
    r'|os\.environ\[\s*"([A-Z][A-Z0-9_]+)"\]'
    r'|os\.getenv\(\s*"([A-Z][A-Z0-9_]+)"'
    r'|^\w*_ENV\w* = "([A-Z][A-Z0-9_]+)"',
    re.M,
)


def settings_read() -> dict[str, str]:
    found: dict[str, str] = {}
    for folder in READERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            if relative.startswith(NOT_SETTINGS_FOLDERS):
                continue
            for match in READ.finditer(path.read_text()):
                name = next(g for g in match.groups() if g)
                found.setdefault(name, relative)
    return {n: where for n, where in found.items() if n not in NOT_SETTINGS}


def settings_table() -> str:
    text = (ROOT / "docs/operations.md").read_text()
    return text[text.index("\n## Settings\n") :]


def test_every_setting_the_code_reads_is_in_the_operations_settings_table() -> None:
    read = settings_read()
    assert "TRAINYARD_NODE_LOST_SECONDS" in read and "TRAINYARD_KEEPER_GRACE_SECONDS" in read
    table = settings_table()
    missing = {n: where for n, where in read.items() if f"`{n}`" not in table}
    assert not missing, f"read but not in docs/operations.md's Settings: {missing}"


def test_the_table_names_no_setting_that_nothing_reads() -> None:
    read = settings_read()
    named = set(re.findall(r"^\| `([A-Z][A-Z0-9_]+)`", settings_table(), re.M))
    assert named, "the Settings table lost its rows"
    stale = sorted(n for n in named if n not in read)
    assert not stale, f"in docs/operations.md's Settings but read by nothing: {stale}"
