"""A run's configuration as key/values, for the run table's columns (issue 49): the program's
options (`--lr 0.1 --batch-size=64 --amp` is {"lr": 0.1, "batch-size": 64, "amp": true}) and
its own environment variables ({"$WARMUP": "500"}, a "$" before the name so that neither can
hide the other). Numbers are stored as numbers, so that a column sorts 0.01 before 0.1.

Variables whose names look secret (workers.contract.looks_secret) are left out: the table is
shown to admins too, and a column sorted by a secret would tell its order. Kept on the job
(Job.config) when it is submitted, so that sorting by a key is one query over the table.
"""

import re
from typing import Any

from workers.contract import looks_secret

# An option's name as a column can show it: a flag's usual spelling, bounded.
_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_INTEGER = re.compile(r"[+-]?\d{1,15}")
_DECIMAL = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
ENV_PREFIX = "$"


def config_of(args: list[str], env: dict[str, str]) -> dict[str, Any]:
    """The key/values of a program's arguments and variables (see the module's docstring).
    Positional arguments, and options whose names are not plain words, have no key."""
    config: dict[str, Any] = {}
    i = 0
    while i < len(args):
        arg = str(args[i])
        i += 1
        if not arg.startswith("-") or arg in ("-", "--"):
            continue
        name, equals, value = arg.lstrip("-").partition("=")
        given = bool(equals)
        if not given and i < len(args) and not _is_option(str(args[i])):
            value, given = str(args[i]), True
            i += 1
        if _KEY.fullmatch(name):
            config[name] = typed(value) if given else True
    for name, value in env.items():
        if not looks_secret(name):
            config[f"{ENV_PREFIX}{name}"] = typed(str(value))
    return config


def typed(value: str) -> Any:
    """A number where the text is one (an int, else a float), else the text itself."""
    text = value.strip()
    if _INTEGER.fullmatch(text):
        return int(text)
    if _DECIMAL.fullmatch(text):
        number = float(text)
        if number == number and abs(number) != float("inf"):
            return number
    return value


def _is_option(arg: str) -> bool:
    """Whether `arg` starts another option rather than being the value of the one before it:
    "-0.5" and "-3" are values."""
    return arg.startswith("-") and not _DECIMAL.fullmatch(arg)
