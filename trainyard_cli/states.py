"""Job and instance states as the console's API document declares them: which there are, after
which nothing changes (`x-ended`), and what each means at a glance (`x-tones`). The CLI keeps
no list of its own, so a state the console adds (as `restarting` was) is never misread."""

from dataclasses import dataclass
from typing import Any

from trainyard_cli.errors import UNAVAILABLE, CliError

# How each meaning looks in a terminal; a meaning the CLI does not know yet is plain.
TONE_STYLES = {
    "good": "green",
    "bad": "red",
    "muted": "yellow",
    "working": "cyan",
    "retrying": "magenta",
    "waiting": "blue",
}


@dataclass(frozen=True)
class States:
    ended: frozenset[str]
    tones: dict[str, str]

    def style(self, state: str) -> str:
        return TONE_STYLES.get(self.tones.get(state, ""), "")


@dataclass(frozen=True)
class Vocabulary:
    job: States
    replica: States


def from_openapi(document: dict[str, Any]) -> Vocabulary:
    """The job's and the instance's states from GET /api/v1/openapi.json."""
    try:
        schemas = document["components"]["schemas"]
        return Vocabulary(_of(schemas["JobOut"]), _of(schemas["ReplicaOut"]))
    except (KeyError, TypeError):
        raise CliError(
            "The console's API document does not say which job states are final; is the "
            "console older than this CLI?",
            UNAVAILABLE,
        ) from None


def _of(schema: dict[str, Any]) -> States:
    state = schema["properties"]["state"]
    return States(frozenset(state["x-ended"]), dict(state["x-tones"]))


def is_older(shown: dict[str, Any], heard: dict[str, Any]) -> bool:
    """Whether `heard` is a state from before `shown` (its `state_order` is smaller): the
    console's events of one job come from several processes, and a late one must not print
    `running → queued → running` for a job that never left its attempt. A state without an
    order (an older console) is never older."""
    seen, new = shown.get("state_order"), heard.get("state_order")
    if not isinstance(seen, list) or not isinstance(new, list):
        return False
    return bool(new < seen)
