"""Which environment variables a trainer may be given: a job's own (the form, the API) and an
image's defaults (the admin) pass the same checks, so that neither can set what the platform
sets (workers.contract's reserved names) or carry what no process could take. Only an image's
defaults may set what the dynamic loader and the C library act on (docs/security.md)."""

import re

from workers.contract import is_loader_env_name, is_reserved_env_name

MAX_ENV_VARS = 100
MAX_ENV_VALUE_LENGTH = 4096
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


def env_problems(env: object, loader_names_allowed: bool = False) -> list[str]:
    """What is wrong with `env` ({NAME: value}), one message each; [] when nothing is.
    `loader_names_allowed`: an admin's image defaults, which may set LD_LIBRARY_PATH and the
    like; a job's own variables may not."""
    if not isinstance(env, dict):
        return ['Give the variables as {"NAME": "value"}.']
    if len(env) > MAX_ENV_VARS:
        return [f"{len(env)} variables; at most {MAX_ENV_VARS}."]
    problems = []
    for name, value in sorted(env.items()):
        if not ENV_NAME.match(name):
            problems.append(
                f"{name[:60]!r} is not a variable name (letters, digits and _, not starting "
                "with a digit)."
            )
        elif is_reserved_env_name(name):
            problems.append(
                f"{name} is set by the platform (see the README's \"What a trainer process "
                'gets"); pick another name.'
            )
        elif is_loader_env_name(name) and not loader_names_allowed:
            problems.append(
                f"{name} is read by the dynamic loader or the C library, so a job may not set "
                "it; an admin may set it in the image's defaults (see docs/security.md)."
            )
        if not isinstance(value, str):
            problems.append(f'The value of {name[:60]} must be text: "{name[:60]}": "…".')
        elif len(value) > MAX_ENV_VALUE_LENGTH:
            problems.append(
                f"The value of {name[:60]} must be at most {MAX_ENV_VALUE_LENGTH} characters."
            )
    return problems
