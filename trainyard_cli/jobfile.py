"""A job request from a job file (YAML) and the command's flags.

A job file holds exactly the body of `POST /api/v1/jobs` (name, image, program, roles,
kvstore, restart, health_rules, metrics, env), plus one key of the CLI's own:

    code: ./src      # the folder to upload as the code snapshot, relative to the job file

The console checks the request; this module only reads the file and applies the flags, so
that every refusal is the API's own message about the field.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from trainyard_cli.errors import BAD_INPUT, CliError

CODE_KEY = "code"


@dataclass
class Draft:
    body: dict[str, Any]
    code: Path | None  # from the job file's `code:`, resolved against the file's folder


def read(path: Path) -> Draft:
    try:
        text = path.read_text()
    except OSError as exc:
        raise CliError(f"Cannot read the job file {path}: {exc.strerror}.", BAD_INPUT) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        at = f" (line {where.line + 1}, column {where.column + 1})" if where else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise CliError(f"{path} is not valid YAML{at}: {problem}.", BAD_INPUT) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise CliError(f"{path} must be a mapping of fields (name:, image:, ...).", BAD_INPUT)
    code = data.pop(CODE_KEY, None)
    if code is not None and not isinstance(code, str):
        raise CliError(f"{path}: code: must be a folder's path.", BAD_INPUT)
    return Draft(data, (path.parent / code).resolve() if code else None)


def parse_role(text: str) -> tuple[str, dict[str, Any]]:
    """--role ROLE=PACKAGE[:INSTANCES], e.g. worker=cpu-1:2 (one instance when not given)."""
    role, sep, rest = text.partition("=")
    package, _, count = rest.partition(":")
    if not sep or not role or not package:
        raise CliError(f"--role {text}: write ROLE=PACKAGE or ROLE=PACKAGE:INSTANCES.", BAD_INPUT)
    try:
        instances = int(count) if count else 1
    except ValueError:
        raise CliError(f"--role {text}: {count!r} is not a whole number.", BAD_INPUT) from None
    return role, {"package": package, "instances": instances}


def parse_env(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise CliError(f"--env {text}: write NAME=VALUE.", BAD_INPUT)
    return name, value


def apply_flags(
    body: dict[str, Any],
    *,
    name: str | None,
    image: str | None,
    script: str | None,
    args: list[str],
    roles: list[str],
    kvstore: str | None,
    env: list[str],
    restart_policy: str | None,
    max_restarts: int | None,
) -> dict[str, Any]:
    """The job file's body with the flags on top: a flag wins over the file's value."""
    body = dict(body)
    if name is not None:
        body["name"] = name
    if image is not None:
        body["image"] = image
    if script is not None or args:
        program = _section(body, "program")
        if script is not None:
            program["script"] = script
        if args:
            program["args"] = list(args)
        body["program"] = program
    if roles:
        body["roles"] = {**_section(body, "roles"), **dict(parse_role(r) for r in roles)}
    if kvstore is not None:
        body["kvstore"] = kvstore
    if env:
        body["env"] = {**_section(body, "env"), **dict(parse_env(e) for e in env)}
    if restart_policy is not None or max_restarts is not None:
        restart = _section(body, "restart")
        if restart_policy is not None:
            restart["policy"] = restart_policy
        if max_restarts is not None:
            restart["max_restarts"] = max_restarts
        body["restart"] = restart
    script_name = script_of(body)
    if "name" not in body and script_name:
        body["name"] = Path(script_name).stem  # a name the list can show; the user may set one
    return body


def _section(body: dict[str, Any], key: str) -> dict[str, Any]:
    """A copy of the mapping at `key` ({} when there is none), to change without touching the
    job file's own. Anything else there is dropped: the flag replaces it."""
    value = body.get(key)
    return dict(value) if isinstance(value, dict) else {}


def script_of(body: dict[str, Any]) -> str | None:
    """The program's script, when the body names one."""
    script = _section(body, "program").get("script")
    return script if isinstance(script, str) and script else None
