"""Regular expressions that users write (metric definitions, log-pattern health rules): compiled
by RE2, and matched under a CPU budget per job.

Why RE2 (the `google-re2` wheel) rather than Python's `re`: `re` backtracks, so `(a+)+$` against
"a"*30 + "b" takes about 2**30 steps; worse, its C code holds the GIL for the whole match, so
one such line in an agent's pipe reader froze every thread of the agent, the heartbeat's
included, and one such rule froze the log keeper for every job (issue 23). RE2 matches in time
linear in the text for every pattern it accepts, and it releases the GIL while it matches
(measured: a thread beside a long search keeps ticking). What it cannot run in linear time it
refuses at compile time: backreferences (`\\1`), lookaround (`(?=`, `(?!`, `(?<=`), possessive
and atomic forms, and counted repetitions beyond 1000. The `regex` module with a timeout was
the other candidate: it stays a backtracker, so every hostile line would still burn its whole
timeout, and a timeout per match is not a bound per job.

Linear is not free: a large pattern on a 16 KiB line can still take tens of milliseconds
(`(?:(?:a|b){0,30}){0,30}x`: about 50-400 ms a line, measured), and a trainer may print many
lines. So matching is also metered: `MatchBudget` counts the CPU seconds that one job's
patterns spend per window, and names the pattern to switch off when the job goes over.
"""

import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import re2

MAX_PATTERN_CHARS = 500
# CPU seconds one job's patterns may spend matching per window, on one agent (its replica's
# metric definitions) or in the log keeper (its health rules): 5% of a core.
BUDGET_SECONDS = 0.5
BUDGET_WINDOW_SECONDS = 10.0
# ...plus this much per line a pattern was tried on. A cheap pattern costs RE2 a microsecond or
# two a line, so volume alone (a busy but honest job, bounded by its log limit) never switches
# a rule off; a pattern that costs tens of microseconds a line, or milliseconds, does.
BUDGET_PER_LINE_SECONDS = 20e-6

# RE2's own error for the features it leaves out, said in words a user can act on.
_REFUSED_FEATURES = (
    ("invalid escape sequence: \\1", "backreferences such as \\1"),
    ("invalid escape sequence: \\2", "backreferences such as \\1"),
    ("invalid perl operator: (?=", "lookahead (?=...)"),
    ("invalid perl operator: (?!", "negative lookahead (?!...)"),
    ("invalid perl operator: (?<=", "lookbehind (?<=...)"),
    ("invalid perl operator: (?<!", "negative lookbehind (?<!...)"),
    ("invalid perl operator: (?>", "atomic groups (?>...)"),
    ("bad repetition operator: ++", "possessive repetition such as a++"),
    ("bad repetition operator: *+", "possessive repetition such as a*+"),
    ("invalid repetition size", "counted repetition beyond {1000} (nested counts multiply)"),
)


Key = TypeVar("Key", bound=Hashable)


class UnsafeRegex(ValueError):
    """The pattern is not one Trainyard will run; the message says why, without the field name
    (the caller knows which field it checked)."""


Pattern = Any  # re2._Regexp: search(text) -> match or None, .groups, .groupindex


def _options() -> Any:
    options = re2.Options()
    options.log_errors = False  # RE2 would print every refused pattern on the process's stderr
    return options


def compile_pattern(pattern: object) -> Pattern:
    """`pattern` compiled by RE2, or UnsafeRegex saying what is wrong with it."""
    if not isinstance(pattern, str):
        raise UnsafeRegex("must be a string (a regular expression)")
    if len(pattern) > MAX_PATTERN_CHARS:
        raise UnsafeRegex(f"is {len(pattern)} characters long; at most {MAX_PATTERN_CHARS}")
    try:
        return re2.compile(pattern, _options())
    except re2.error as exc:
        raise UnsafeRegex(_explain(exc)) from None
    except (TypeError, ValueError, OverflowError) as exc:  # e.g. a lone surrogate
        raise UnsafeRegex(f"is not a valid regular expression: {exc}") from None


def search(pattern: Pattern, text: str) -> Any:
    """`pattern.search(text)`; RE2 matches UTF-8, and a lone surrogate (which `re` took) has
    none: such a line is searched with the surrogate replaced, never raised on."""
    try:
        return pattern.search(text)
    except UnicodeEncodeError:
        return pattern.search(text.encode("utf-8", "replace").decode("utf-8"))


def _explain(exc: Exception) -> str:
    detail = exc.args[0] if exc.args else exc
    text = detail.decode("utf-8", "replace") if isinstance(detail, bytes) else str(detail)
    for marker, feature in _REFUSED_FEATURES:
        if marker in text:
            return (
                f"uses {feature}, which Trainyard does not run: patterns run on RE2, which "
                f"matches in time linear in the line ({text})"
            )
    if "pattern too large" in text:
        return f"is too large a pattern for RE2 ({text}); use fewer or smaller repetitions"
    return f"is not a valid regular expression for RE2: {text}"


@dataclass
class MatchBudget(Generic[Key]):
    """CPU seconds that one job's patterns may spend matching per window.

    `charge(key, seconds)` after each match (or batch of matches) of the pattern named `key`;
    when the job's patterns together went over the budget in the current window it returns an
    `Overrun` naming the pattern to switch off: the one that spent the most of it. The
    switched-off pattern's spending is forgotten, so the job's other patterns go on with what
    is left of the window.

    The window is measured on `now` (a monotonic clock by default); what is charged is the
    caller's measure of the match, CPU time of the matching thread (`cpu_clock`), so that a busy
    machine does not count against a job.
    """

    seconds: float = BUDGET_SECONDS
    window: float = BUDGET_WINDOW_SECONDS
    per_line: float = BUDGET_PER_LINE_SECONDS
    now: Callable[[], float] = time.monotonic
    cpu_clock: Callable[[], float] = time.thread_time
    _window_started: float | None = None
    _spent: dict[Key, float] = field(default_factory=dict)
    _lines: int = 0  # lines tried in the window, by all the job's patterns

    def charge(self, key: Key, seconds: float, lines: int = 1) -> "Overrun[Key] | None":
        now = self.now()
        if self._window_started is None or now - self._window_started >= self.window:
            self._window_started = now
            self._spent.clear()
            self._lines = 0
        self._spent[key] = self._spent.get(key, 0.0) + max(0.0, seconds)
        self._lines += lines
        if sum(self._spent.values()) <= self.seconds + self.per_line * self._lines:
            return None
        worst = max(self._spent, key=lambda k: self._spent[k])
        return Overrun(worst, self._spent.pop(worst), self)

    def describe(self) -> str:
        return (
            f"{self.seconds:g} s of CPU per {self.window:g} s, plus "
            f"{self.per_line * 1e6:g} µs for each line a pattern is tried on"
        )


@dataclass(frozen=True)
class Overrun(Generic[Key]):
    key: Key
    spent: float  # CPU seconds the pattern spent in the window
    budget: "MatchBudget[Key]"

    def message(self, what: str) -> str:
        """Why `what` (e.g. "metric 'loss'") was switched off, for the job's log and events."""
        return (
            f"{what} switched off: its regex spent {self.spent:.2f} s of CPU matching in "
            f"{self.budget.window:g} s, over the job's budget of {self.budget.describe()}"
        )
