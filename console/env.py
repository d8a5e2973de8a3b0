"""Reading configuration from the environment, failing loudly on malformed values."""

import os
from pathlib import Path


class ImproperlyConfiguredEnv(RuntimeError):
    pass


def env_str(name: str, default: str) -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    lowered = raw.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    raise ImproperlyConfiguredEnv(f"{name}={raw!r} is not a boolean (use 1/0, true/false)")


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ImproperlyConfiguredEnv(f"{name}={raw!r} is not an integer") from None


def env_path(name: str, default: Path) -> Path:
    raw = os.environ.get(name)
    return Path(raw).expanduser().resolve() if raw else default.resolve()


def env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise ImproperlyConfiguredEnv(f"{name}={raw!r} is not a number") from None


def comma_list(value: str) -> list[str]:
    """The items of a comma-separated setting, blanks dropped."""
    return [item.strip() for item in value.split(",") if item.strip()]


def env_either(name: str, older: str, default: str) -> str:
    """`name`, or the older name it replaces (still read, so existing deployments keep
    working); both set to different values is a mistake to fail on, not to guess about."""
    new, old = os.environ.get(name, ""), os.environ.get(older, "")
    if new and old and new != old:
        raise ImproperlyConfiguredEnv(f"{name} and {older} are both set, to different values")
    return new or old or default


def secret_from_file(name: str) -> str:
    """The contents of the file the variable names (a secret kept out of the environment,
    e.g. systemd's credentials or a mounted secret); failing loudly on a missing or empty
    file."""
    path = Path(os.environ[name])
    try:
        value = path.read_text().strip()
    except OSError as exc:
        raise ImproperlyConfiguredEnv(f"{name}={path}: cannot read it ({exc.strerror})") from None
    if not value:
        raise ImproperlyConfiguredEnv(f"{name}={path} is empty")
    return value
