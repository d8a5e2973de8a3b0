"""What the command says when it cannot do what was asked, and the exit code it gives.

The codes are part of the interface (scripts branch on them) and are listed by `trainyard
--help` and in docs/cli.md; never reuse one for another meaning.
"""

from collections.abc import Callable
from typing import Any

OK = 0
JOB_DID_NOT_SUCCEED = 1  # --wait: the job failed or was cancelled; search --follow: it failed
BAD_INPUT = 2  # a usage error, a bad job file, or a request the console refused
NOT_LOGGED_IN = 3  # no token, or the console refused it (revoked, wrong console)
NOT_FOUND = 4  # no such job (or not yours), node or snapshot
UNAVAILABLE = 5  # the console cannot be reached, or failed (5xx)
INTERRUPTED = 130  # Ctrl-C; a job being followed goes on running

EXIT_CODES_HELP = (
    "Exit codes: 0 done (with --wait: the job succeeded); 1 the job failed or was cancelled "
    "(search submit --follow: the experiment failed); "
    "2 bad input or a request the console refused; 3 not logged in or token refused; "
    "4 not found; 5 console unreachable or failing; 130 interrupted."
)


class CliError(Exception):
    """A message for the user (and more lines under it), and the exit code."""

    def __init__(self, message: str, exit_code: int, details: list[str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code
        self.details = details or []


def field_messages(body: Any, rename: Callable[[str], str] = str) -> list[str]:
    """The API's refusals, `{"errors": {field: [message]}}`, as "field: message" lines, each
    field named by `rename` (as the user wrote it: a job file's key)."""
    errors = body.get("errors") if isinstance(body, dict) else None
    if not isinstance(errors, dict):
        return []
    lines = []
    for field, messages in errors.items():
        for message in messages if isinstance(messages, list) else [messages]:
            lines.append(message if field in ("request", "auth") else f"{rename(field)}: {message}")
    return lines
