"""Where `trainyard login` keeps the console's address and the user's token.

One file, `credentials.json`, in the user's config folder (~/.config/trainyard on Linux,
TRAINYARD_CONFIG_DIR to move it), readable by its owner only. TRAINYARD_URL and
TRAINYARD_TOKEN override what it holds, for CI jobs that get both as secrets.
"""

import json
import os
from dataclasses import dataclass
from pathlib import Path

import typer

from trainyard_cli.errors import BAD_INPUT, NOT_LOGGED_IN, CliError

CONFIG_DIR_VARIABLE = "TRAINYARD_CONFIG_DIR"
URL_VARIABLE = "TRAINYARD_URL"
TOKEN_VARIABLE = "TRAINYARD_TOKEN"  # noqa: S105  (a variable's name, not a secret)
CREDENTIALS_FILE = "credentials.json"


@dataclass(frozen=True)
class Credentials:
    url: str
    token: str


def config_dir() -> Path:
    return Path(os.environ.get(CONFIG_DIR_VARIABLE) or typer.get_app_dir("trainyard"))


def credentials_path() -> Path:
    return config_dir() / CREDENTIALS_FILE


def normalize_url(url: str) -> str:
    """The console's base address: http(s)://host[:port][/prefix], without a trailing slash."""
    url = url.strip().rstrip("/")
    if url.endswith("/api/v1"):
        url = url[: -len("/api/v1")]
    if not url.startswith(("http://", "https://")) or "://" == url[-3:]:
        raise CliError(
            f"{url or 'The URL'} is not a console address; give one like https://trainyard.example.com",
            BAD_INPUT,
        )
    return url


def _saved() -> dict[str, str]:
    try:
        data = json.loads(credentials_path().read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise CliError(
            f"Cannot read {credentials_path()}: {exc}. Run `trainyard login URL` again.",
            NOT_LOGGED_IN,
        ) from None
    return {k: v for k, v in data.items() if isinstance(v, str)} if isinstance(data, dict) else {}


def load() -> Credentials:
    """The console and token to use: the environment's, else what `login` saved."""
    saved = _saved()
    url = os.environ.get(URL_VARIABLE) or saved.get("url", "")
    token = os.environ.get(TOKEN_VARIABLE) or saved.get("token", "")
    if not url or not token:
        raise CliError(
            "Not logged in. Run `trainyard login URL` (or set TRAINYARD_URL and TRAINYARD_TOKEN).",
            NOT_LOGGED_IN,
        )
    return Credentials(normalize_url(url), token)


def save(credentials: Credentials) -> Path:
    """Write the file whole or not at all, created with mode 0600 (never readable by others,
    not even for a moment), in a folder of mode 0700."""
    folder = config_dir()
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = folder / CREDENTIALS_FILE
    partial = folder / f".{CREDENTIALS_FILE}.{os.getpid()}"
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # an old partial file may have had other bits
        with os.fdopen(fd, "w") as file:
            json.dump({"url": credentials.url, "token": credentials.token}, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return path


def forget() -> bool:
    """Remove the saved token; False when there was none."""
    try:
        credentials_path().unlink()
    except FileNotFoundError:
        return False
    return True
