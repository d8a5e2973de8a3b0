"""A job's time limit as people write it ("2h", "90m", "1h30m") and as reasons say it ("2 h",
"1 h 30 min"): pure, so the API schema, the form, the services and their tests share it."""

import re

# A year: a longer limit is a typo, not a plan.
MAX_TIME_LIMIT_SECONDS = 366 * 24 * 3600
_UNITS = {"d": 86400, "h": 3600, "m": 60, "min": 60, "s": 1}
_PART = re.compile(r"(\d+)\s*(d|h|min|m|s)", re.IGNORECASE)
FORMS = 'seconds (7200) or text with units: "2h", "90m", "1h30m", "45s", "1d"'


class BadTimeLimit(ValueError):
    """The message says what is wrong and what would do."""


def parse(raw: object) -> int | None:
    """Seconds from what a request, the form or a job file gives: a whole number of seconds, or
    text with units ("2h", "90m", "1h30m", "45s", "1d"); None or "" for none."""
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, int | str):
        raise BadTimeLimit(f"Give the time limit as {FORMS}.")
    if isinstance(raw, int):
        seconds = raw
    else:
        text = raw.strip()
        if not text:
            return None
        if text.isdigit():
            seconds = int(text)
        else:
            parts = _PART.findall(text)
            if not parts or _PART.sub("", text).strip():
                raise BadTimeLimit(f"{raw!r} is not a time limit: give {FORMS}.")
            seconds = sum(int(n) * _UNITS[unit.lower()] for n, unit in parts)
    if not 1 <= seconds <= MAX_TIME_LIMIT_SECONDS:
        raise BadTimeLimit(
            f"A time limit is from 1 second to 366 days ({MAX_TIME_LIMIT_SECONDS} s); "
            "leave it empty for none."
        )
    return seconds


def in_words(seconds: int) -> str:
    """ "2 h", "1 h 30 min", "45 min", "1 min 30 s", "1 d 2 h": the units a limit was given in."""
    parts = []
    rest = seconds
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60), ("s", 1)):
        count, rest = divmod(rest, size)
        if count:
            parts.append(f"{count} {unit}")
    return " ".join(parts) or "0 s"


def reached(seconds: int) -> str:
    """The reason a job past its limit fails with."""
    return f"time limit of {in_words(seconds)} reached"
