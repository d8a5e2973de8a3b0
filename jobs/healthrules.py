"""Health rules: what a job's owner asks the console to watch for while an attempt runs, and
the engine that watches. Pure Python: no Django, no I/O, no clock (time is always passed in;
the one exception is the CPU clock of a MatchBudget, when the caller gives the Watch one).

A rule is a JSON object such as {"kind": "non-finite", "metric": "loss", "action": "stop"};
`parse_rules` checks a list of them and says exactly what is wrong. A `Watch` covers one
attempt: the console feeds it every metric point and log line of every instance (`metric`,
`line`) and calls `tick` now and then for the rules that fire on silence; each returns the
`Firing`s the console records and acts on.

Kinds (parameters in brackets have defaults):
- non-finite [metric "loss"; "*" = any metric]: a value is NaN or ±inf. The default is
  "loss", not "*": with mixed precision an inf grad norm is routine (the scaler skips the step).
- no-progress (factor and/or minutes, [min_seconds 30], [metric: any]): no new step for
  factor × the median time between steps, or for `minutes`, whichever is shorter, but never
  less than `min_seconds`. A new step is a point whose step exceeds the largest step seen from
  that instance (of `metric` when given). The median counts once MIN_INTERVALS intervals are
  known; the time before the first step is not an interval (start-up is not a step). Each
  instance's clock starts at the Watch's `started_at`, so `minutes` catches a job that never
  steps. Judged in `tick` only.
- log-pattern (pattern, [stream "any"]): a log line matches the regex (a search, on RE2: see
  workers/userregex.py; backreferences and lookaround are refused). Matching is metered: a
  Watch given a MatchBudget switches off the log-pattern rule that spends most of the job's
  budget, and `take_switched_off` says which, once.
- throughput-drop ([metric "samples_per_sec"], [fraction 0.5]): a value is below fraction ×
  the mean of that instance's previous RECENT_VALUES values, once MIN_VALUES are known.
- gpu-idle ([metric "gpu_util_percent"], [below 80], [minutes 1]): an instance's samples of
  the metric all stayed below `below` over at least `minutes`, measured between the first and
  the latest sample of the run (the agent samples every 2 s). Judged when a sample arrives:
  the samples are the evidence, and a sampler that went quiet proves nothing. An instance
  without samples (no GPU) never fires. Defaults: the figures' low-utilisation rule
  (jobs/services/figures.py).

Firing once:
- A rule whose action ends the attempt (stop, restart, restart-exclude-node) fires at most once
  per Watch, naming the first instance found (for a hang, the one silent the longest): a
  DDP hang stalls every rank, and an attempt can be ended only once.
- A "warn" rule fires at most once per instance. Re-arm choice: a warn rule of kind
  throughput-drop re-arms for that instance when a value is back at or above its moving
  average (a real recovery, not a hover at the threshold), and one of kind gpu-idle when a
  sample reaches `below` again (the next warning needs a full new `minutes` below). Other
  warn rules (non-finite, no-progress, log-pattern) never re-arm within an attempt.
"""

import dataclasses
import difflib
import json
import math
import re
import statistics
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from workers import metricparse
from workers.contract import tag_of
from workers.userregex import (
    MAX_PATTERN_CHARS,
    MatchBudget,
    Pattern,
    UnsafeRegex,
    compile_pattern,
    search,
)

ACTIONS: tuple[str, ...] = ("warn", "stop", "restart", "restart-exclude-node")
KINDS: tuple[str, ...] = ("non-finite", "no-progress", "log-pattern", "throughput-drop", "gpu-idle")
STREAMS: tuple[str, ...] = ("any", "stdout", "stderr")
ENDING_ACTIONS = frozenset(("stop", "restart", "restart-exclude-node"))
REARMING_KINDS = frozenset(("throughput-drop", "gpu-idle"))

MAX_RULES = 20
MAX_NAME_CHARS = 100
ANY_METRIC = "*"
# A rule names a metric by the names the metrics protocol accepts.
METRIC_NAME = metricparse.NAME

DEFAULT_NON_FINITE_METRIC = "loss"
DEFAULT_MIN_SECONDS = 30.0
DEFAULT_DROP_METRIC = "samples_per_sec"
DEFAULT_DROP_FRACTION = 0.5
DEFAULT_GPU_METRIC = "gpu_util_percent"  # what the agent's SystemSampler reports
DEFAULT_GPU_BELOW = 80.0
DEFAULT_GPU_MINUTES = 1.0

MIN_INTERVALS = 3  # intervals between steps before a median means anything
MAX_INTERVALS = 200  # recent intervals kept per instance: bounds the state, tracks the pace
MIN_VALUES = 5  # values before a throughput average means anything
RECENT_VALUES = 20  # the moving window of a throughput average
MAX_INSTANCES = 1024  # far above TRAINYARD_MAX_INSTANCES; bounds what a stray feed can grow
# A pattern that can tell a line's start or end from a batch's: \A, \z, or multi-line mode
# turned off by a flag group such as (?-m) or (?s-m:...). Searched line by line only.
_LINE_BOUND_SENSITIVE = re.compile(r"\\[Az]|\(\?[A-Za-z]*-")
MAX_SEARCH_CHARS = 16 * 1024  # a log-pattern searches this much of a line (the protocol's max)
QUOTED_LINE_CHARS = 200
MAX_WHOLE = 2**63  # steps and indexes beyond this are not numbers a trainer sends

STATE_FORMAT = "trainyard.healthrules.watch/1"

COMMON_KEYS = ("kind", "action", "name")
PARAMS: dict[str, tuple[str, ...]] = {
    "non-finite": ("metric",),
    "no-progress": ("metric", "factor", "minutes", "min_seconds"),
    "log-pattern": ("pattern", "stream"),
    "throughput-drop": ("metric", "fraction"),
    "gpu-idle": ("metric", "below", "minutes"),
}


class RuleError(ValueError):
    """What is wrong with the rules, naming the rule by its 1-based position."""


# ---------------------------------------------------------------------------------------------
# Rules


@dataclass(frozen=True)
class Rule:
    """One checked rule. Parameters a kind does not take are None; `parse_rules` fills the
    defaults of those it takes, so the engine never guesses."""

    kind: str
    action: str
    name: str
    metric: str | None = None
    factor: float | None = None
    minutes: float | None = None
    min_seconds: float | None = None
    pattern: str | None = None
    stream: str | None = None
    fraction: float | None = None
    below: float | None = None
    # Compiled once per rule, not per log line, by RE2; raises UnsafeRegex for a pattern RE2
    # refuses (parse_rules says so as a RuleError first).
    regex: Pattern | None = field(init=False, default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.pattern is not None:
            object.__setattr__(self, "regex", compile_pattern(self.pattern))

    def default_name(self) -> str:
        return _DEFAULT_NAMES[self.kind](self)

    def to_json(self) -> dict[str, object]:
        """The rule as parse_rules reads it: every parameter spelled out (so a later change of a
        default does not change a stored rule), the name only when it is not the default."""
        data: dict[str, object] = {"kind": self.kind, "action": self.action}
        if self.name != self.default_name():
            data["name"] = self.name
        for key in PARAMS[self.kind]:
            value = getattr(self, key)
            if value is not None:
                data[key] = _plain(value)
        return data


def rules_to_json(rules: list[Rule]) -> list[dict[str, object]]:
    return [rule.to_json() for rule in rules]


def rule_key(rule: Rule) -> str:
    """A rule's identity in a Watch's state: its canonical JSON."""
    return json.dumps(rule.to_json(), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _plain(value: object) -> object:
    # 30.0 reads back as 30: what the user wrote, and the same float once parsed again.
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    return value


def _non_finite_name(rule: Rule) -> str:
    if rule.metric == ANY_METRIC:
        return "a metric is not finite"
    return f"{rule.metric} is not finite"


def _no_progress_name(rule: Rule) -> str:
    return "no progress" if rule.metric is None else f"no progress in {rule.metric}"


def _log_pattern_name(rule: Rule) -> str:
    where = "log" if rule.stream in (None, "any") else rule.stream
    return f"{where} matches '{_clip(rule.pattern or '', 60)}'"


def _throughput_drop_name(rule: Rule) -> str:
    percent = _fmt(100 * (rule.fraction or 0))
    return f"{rule.metric} dropped below {percent}% of its average"


def _gpu_idle_name(rule: Rule) -> str:
    return f"{rule.metric} below {_fmt(rule.below or 0)}% for {_fmt(rule.minutes or 0)} min"


_DEFAULT_NAMES = {
    "non-finite": _non_finite_name,
    "no-progress": _no_progress_name,
    "log-pattern": _log_pattern_name,
    "throughput-drop": _throughput_drop_name,
    "gpu-idle": _gpu_idle_name,
}


# ---------------------------------------------------------------------------------------------
# Parsing: whatever JSON value arrives, the answer is a list of rules or a RuleError.


@dataclass(frozen=True)
class _Bounds:
    low: float
    high: float
    low_inclusive: bool
    description: str

    def hold(self, number: int | float) -> bool:
        # int against float compares exactly in Python: a 400-digit int is simply too large.
        above_low = number >= self.low if self.low_inclusive else number > self.low
        return above_low and number <= self.high


_BOUNDS = {
    "factor": _Bounds(0, 1000, False, "a positive number up to 1000"),
    "minutes": _Bounds(0, 7 * 24 * 60, False, "a positive number of minutes up to 10080"),
    "min_seconds": _Bounds(0, 24 * 3600, True, "a number of seconds from 0 to 86400"),
    "fraction": _Bounds(0, 1, False, "a number above 0 and up to 1, e.g. 0.5 for half"),
    "below": _Bounds(0, 100, False, "a percentage above 0 and up to 100"),
}


def parse_rules(data: object) -> list[Rule]:
    """The rules in `data` (a list of rule objects); raises RuleError saying what is wrong."""
    if not isinstance(data, list):
        raise RuleError(f"health rules must be a list of rule objects, not {_json_type(data)}")
    if len(data) > MAX_RULES:
        raise RuleError(f"at most {MAX_RULES} health rules, not {len(data)}")
    rules: list[Rule] = []
    for position, item in enumerate(data, start=1):
        rule = _parse_rule(item, f"rule {position}")
        if rule in rules:
            raise RuleError(f"rule {position}: the same as rule {rules.index(rule) + 1}")
        rules.append(rule)
    return rules


def parse_stored_rules(data: object) -> tuple[list[Rule], list[str]]:
    """The rules of a job stored earlier, which checks made since may refuse (a pattern that RE2
    does not run, say): every rule that parses, and why each other one is switched off. Never
    raises: a rule refused now costs its own job that rule, not the keeper its loop."""
    try:
        return parse_rules(data), []
    except RuleError as whole:
        if not isinstance(data, list):
            return [], [str(whole)]
    rules: list[Rule] = []
    problems: list[str] = []
    for position, item in enumerate(data[:MAX_RULES], start=1):
        try:
            rule = _parse_rule(item, f"rule {position}")
        except RuleError as exc:
            problems.append(f"switched off: {exc}")
            continue
        if rule not in rules:
            rules.append(rule)
    return rules, problems


def _parse_rule(item: object, where: str) -> Rule:
    if not isinstance(item, dict):
        raise RuleError(
            f'{where}: must be an object like {{"kind": "non-finite", "action": "stop"}}, '
            f"not {_json_type(item)}"
        )
    kind = _choice(item, "kind", KINDS, where)
    action = _choice(item, "action", ACTIONS, where)
    _check_keys(item, kind, where)
    params = _PARAM_READERS[kind](item, where)
    rule = Rule(kind=kind, action=action, name="", **params)
    name = _name(item, where)
    return dataclasses.replace(rule, name=name or rule.default_name())


def _choice(item: dict[Any, Any], key: str, options: tuple[str, ...], where: str) -> str:
    value = item.get(key)
    listed = ", ".join(options)
    if value is None:
        raise RuleError(f"{where}: '{key}' is missing; one of {listed}")
    if not isinstance(value, str) or value not in options:
        hint = _did_you_mean(value, options)
        raise RuleError(f"{where}: unknown {key} {_shown(value)}{hint}; one of {listed}")
    return value


def _check_keys(item: dict[Any, Any], kind: str, where: str) -> None:
    allowed = COMMON_KEYS + PARAMS[kind]
    for key in item:
        if key not in allowed:
            shown = f"'{_clip(key, 40)}'" if isinstance(key, str) else _shown(key)
            hint = _did_you_mean(key, allowed)
            takes = ", ".join(PARAMS[kind])
            raise RuleError(f"{where}: unknown key {shown}{hint}; a {kind} rule takes {takes}")


def _did_you_mean(value: object, options: Iterable[str]) -> str:
    if not isinstance(value, str):
        return ""
    close = difflib.get_close_matches(value[:100].lower().replace("_", "-"), list(options), n=1)
    if not close:
        close = difflib.get_close_matches(value[:100], list(options), n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _number(item: dict[Any, Any], key: str, where: str, default: float | None) -> float | None:
    value = item.get(key)
    if value is None:  # absent or null: the default
        return default
    bounds = _BOUNDS[key]
    if isinstance(value, bool) or not isinstance(value, int | float) or not bounds.hold(value):
        raise RuleError(f"{where}: '{key}' must be {bounds.description}, not {_shown(value)}")
    return float(value)


def _metric(item: dict[Any, Any], where: str, default: str | None, allow_any: bool) -> str | None:
    value = item.get("metric")
    if value is None:
        return default
    if allow_any and value == ANY_METRIC:
        return value
    if not isinstance(value, str) or not METRIC_NAME.match(value):
        any_hint = ' or "*" for any metric' if allow_any else ""
        raise RuleError(
            f"{where}: 'metric' must be a metric name like \"loss\" (a letter, then up to 63 "
            f"letters, digits or _ . / -){any_hint}, not {_shown(value)}"
        )
    return value


def _pattern(item: dict[Any, Any], where: str) -> str:
    value = item.get("pattern")
    if value is None:
        raise RuleError(f"{where}: 'pattern' is missing (the regular expression to look for)")
    if not isinstance(value, str):
        raise RuleError(f"{where}: 'pattern' must be a string, not {_shown(value)}")
    try:
        compiled = compile_pattern(value)
    except UnsafeRegex as exc:
        raise RuleError(f"{where}: 'pattern' {exc}") from None
    # "error|" or "x*" match the empty string, so every line: a mistake, never a health rule.
    if compiled.search("") is not None:
        raise RuleError(f"{where}: 'pattern' matches an empty line, so it would match every line")
    return value


def _stream(item: dict[Any, Any], where: str) -> str:
    value = item.get("stream")
    if value is None:
        return "any"
    if not isinstance(value, str) or value not in STREAMS:
        raise RuleError(
            f'{where}: \'stream\' must be "stdout", "stderr" or "any", not {_shown(value)}'
        )
    return value


def _name(item: dict[Any, Any], where: str) -> str | None:
    value = item.get("name")
    if value is None:
        return None
    if (
        not isinstance(value, str)
        or not value.strip()
        or len(value) > MAX_NAME_CHARS
        or any(not char.isprintable() for char in value)
    ):
        raise RuleError(
            f"{where}: 'name' must be one line of 1 to {MAX_NAME_CHARS} characters, "
            f"not {_shown(value)}"
        )
    return value.strip()


def _non_finite_params(item: dict[Any, Any], where: str) -> dict[str, Any]:
    return {"metric": _metric(item, where, DEFAULT_NON_FINITE_METRIC, allow_any=True)}


def _no_progress_params(item: dict[Any, Any], where: str) -> dict[str, Any]:
    params = {
        "metric": _metric(item, where, None, allow_any=False),
        "factor": _number(item, "factor", where, None),
        "minutes": _number(item, "minutes", where, None),
        "min_seconds": _number(item, "min_seconds", where, DEFAULT_MIN_SECONDS),
    }
    if params["factor"] is None and params["minutes"] is None:
        raise RuleError(
            f"{where}: a no-progress rule needs 'factor', 'minutes' or both, "
            'e.g. {"factor": 10, "minutes": 30}'
        )
    return params


def _log_pattern_params(item: dict[Any, Any], where: str) -> dict[str, Any]:
    return {"pattern": _pattern(item, where), "stream": _stream(item, where)}


def _throughput_drop_params(item: dict[Any, Any], where: str) -> dict[str, Any]:
    return {
        "metric": _metric(item, where, DEFAULT_DROP_METRIC, allow_any=False),
        "fraction": _number(item, "fraction", where, DEFAULT_DROP_FRACTION),
    }


def _gpu_idle_params(item: dict[Any, Any], where: str) -> dict[str, Any]:
    return {
        "metric": _metric(item, where, DEFAULT_GPU_METRIC, allow_any=False),
        "below": _number(item, "below", where, DEFAULT_GPU_BELOW),
        "minutes": _number(item, "minutes", where, DEFAULT_GPU_MINUTES),
    }


_PARAM_READERS = {
    "non-finite": _non_finite_params,
    "no-progress": _no_progress_params,
    "log-pattern": _log_pattern_params,
    "throughput-drop": _throughput_drop_params,
    "gpu-idle": _gpu_idle_params,
}


def parse_rule(item: object, position: int = 1) -> Rule:
    """One rule on its own, as `parse_rules` reads the rule at `position`: for an editor that
    checks each rule as it is written (the list's own checks, such as duplicates, are
    `parse_rules`')."""
    return _parse_rule(item, f"rule {position}")


def check_each(data: object) -> dict[str, object]:
    """What a rule editor shows while rules are written: each rule's verdict on its own
    (`parse_rule`), then the list's (`parse_rules`: its length, duplicates), as
    {"verdicts": [{"name", "rule"} or {"error"}], "error": the list's problem or None}.
    `parse_rules` stays the judge when the job is submitted."""
    verdicts: list[dict[str, object]] = []
    if isinstance(data, list):
        for position, item in enumerate(data[:MAX_RULES], start=1):
            try:
                rule = parse_rule(item, position)
            except RuleError as exc:
                verdicts.append({"error": str(exc)})
            else:
                verdicts.append({"name": rule.name, "rule": rule.to_json()})
    error = None
    if all("error" not in v for v in verdicts):
        try:
            parse_rules(data)
        except RuleError as exc:
            error = str(exc)
    return {"verdicts": verdicts, "error": error}


# ---------------------------------------------------------------------------------------------
# Describing the kinds: what a rule editor offers, from the constants the parser applies.

KIND_HELP = {
    "non-finite": "A value of the metric is NaN or infinite.",
    "no-progress": "No new step for a while: a rank that hangs. Give factor, minutes or both.",
    "log-pattern": "A log line matches a regular expression (RE2).",
    "throughput-drop": "A value falls below a fraction of that instance's recent average.",
    "gpu-idle": "GPU utilisation stays low for a while.",
}
ACTION_HELP = {
    "warn": "shown on the job page and in the log; nothing else",
    "stop": "the job fails with the rule as its reason; never restarted",
    "restart": "the whole job restarts, using up a restart",
    "restart-exclude-node": "the whole job restarts, and later attempts avoid that node",
}
# Keyed by (kind, parameter): "minutes" means one thing to no-progress, another to gpu-idle.
PARAM_HELP = {
    ("non-finite", "metric"): 'The metric to watch; "*" for any metric.',
    ("no-progress", "metric"): "Count only steps of this metric; empty: any metric.",
    ("no-progress", "factor"): "Times the median time between steps so far.",
    ("no-progress", "minutes"): "Minutes without a new step.",
    ("no-progress", "min_seconds"): "Never fire sooner than this, whatever the factor says.",
    ("log-pattern", "pattern"): f"The regular expression to look for, at most {MAX_PATTERN_CHARS} "
    "characters; no backreferences or lookaround.",
    ("log-pattern", "stream"): "Which of the instance's output streams to read.",
    ("throughput-drop", "metric"): "The throughput metric to watch.",
    ("throughput-drop", "fraction"): "Fire below this fraction of the recent average.",
    ("gpu-idle", "metric"): "The utilisation metric the agent samples, in percent.",
    ("gpu-idle", "below"): "Utilisation below this percentage counts as idle.",
    ("gpu-idle", "minutes"): "How long every sample must stay below.",
}
# What the parser fills in when a parameter is left out (see the readers above).
PARAM_DEFAULTS: dict[str, dict[str, object]] = {
    "non-finite": {"metric": DEFAULT_NON_FINITE_METRIC},
    "no-progress": {"min_seconds": DEFAULT_MIN_SECONDS},
    "log-pattern": {"stream": "any"},
    "throughput-drop": {"metric": DEFAULT_DROP_METRIC, "fraction": DEFAULT_DROP_FRACTION},
    "gpu-idle": {
        "metric": DEFAULT_GPU_METRIC,
        "below": DEFAULT_GPU_BELOW,
        "minutes": DEFAULT_GPU_MINUTES,
    },
}
REQUIRED_PARAMS = {("log-pattern", "pattern")}


def describe_kinds() -> dict[str, Any]:
    """Every kind with its parameters (name, type, default, bounds, help), and the actions: the
    New-job form's rule editor builds its fields from this, and the parser stays the judge."""
    return {
        "kinds": [
            {
                "kind": kind,
                "help": KIND_HELP[kind],
                "params": [_describe_param(kind, name) for name in PARAMS[kind]],
            }
            for kind in KINDS
        ],
        "actions": [{"action": action, "help": ACTION_HELP[action]} for action in ACTIONS],
        "max_rules": MAX_RULES,
        "max_name_chars": MAX_NAME_CHARS,
    }


def _describe_param(kind: str, name: str) -> dict[str, Any]:
    described: dict[str, Any] = {
        "name": name,
        "default": _plain(PARAM_DEFAULTS[kind].get(name)),
        "required": (kind, name) in REQUIRED_PARAMS,
        "help": PARAM_HELP[(kind, name)],
    }
    if name in _BOUNDS:
        bounds = _BOUNDS[name]
        described.update(
            type="number",
            min=bounds.low,
            max=bounds.high,
            min_inclusive=bounds.low_inclusive,
            bounds=bounds.description,
        )
    elif name == "stream":
        described.update(type="choice", choices=list(STREAMS))
    elif name == "metric":
        described.update(type="metric", any=ANY_METRIC if kind == "non-finite" else None)
    else:
        described.update(type="text")
    return described


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _shown(value: object) -> str:
    """A short, safe rendering of a user's value for an error message."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return "a very large number"  # str() of a 5000-digit int is refused, and no help
    if value is None or isinstance(value, bool | int | float):
        return json.dumps(value)
    if isinstance(value, str):
        return json.dumps(_clip(value, 40), ensure_ascii=False)
    return _json_type(value)


# ---------------------------------------------------------------------------------------------
# Words and numbers in messages


def instance_label(role: str, index: int) -> str:
    """How the console names an instance everywhere: "master", "scheduler", "worker-1"."""
    return tag_of(role, index)


def _fmt(number: float) -> str:
    """Few digits, no exponent for everyday sizes: 0.4, 80, 95.3, 1834."""
    if not math.isfinite(number):
        return str(number)
    size = abs(number)
    if size >= 1e6 or (0 < size < 1e-3):
        return f"{number:.3g}"
    if size >= 100:
        return f"{number:.0f}"
    text = f"{number:.1f}" if size >= 10 else f"{number:.2f}" if size >= 1 else f"{number:.3f}"
    return text.rstrip("0").rstrip(".")


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{_fmt(seconds)} s"
    if seconds < 7200:
        return f"{_fmt(seconds / 60)} min"
    return f"{_fmt(seconds / 3600)} h"


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")


def _one_line(text: str) -> str:
    """A log line fit to quote in a sentence: no colour codes, no control characters."""
    return _CONTROL.sub(" ", _ANSI_ESCAPE.sub("", text)).strip()


def _rule_ref(rule: Rule) -> str:
    return f"rule “{rule.name}”: {rule.action}"


# ---------------------------------------------------------------------------------------------
# Firings and the per-instance memory of a Watch


@dataclass(frozen=True)
class Firing:
    rule: Rule
    action: str
    role: str
    index: int
    # The measured value: the non-finite value, the seconds without progress, the dropped
    # throughput, the average GPU utilisation of the idle run; None for log patterns.
    # NaN and ±inf are possible (non-finite): encode before storing as strict JSON.
    value: float | None
    message: str


@dataclass(frozen=True)
class SwitchedOff:
    """A rule that spent more than its job's matching budget and is off for the attempt; the
    instance is the one whose line it was matching then."""

    rule: Rule
    role: str
    index: int
    message: str


@dataclass
class _Progress:
    """The steps one instance made (of one metric, or of any)."""

    max_step: int | None = None
    last_ts: float | None = None  # when the latest new step arrived
    intervals: deque[float] = field(default_factory=lambda: deque(maxlen=MAX_INTERVALS))

    def observe(self, step: int, ts: float) -> None:
        if self.max_step is not None and step <= self.max_step:
            return  # another metric of a known step, or an eval of an old one: not progress
        if self.last_ts is not None:
            # The first step's wait is start-up, not a step; later waits are the pace. Points
            # that arrive out of order count as instant steps, never as negative ones.
            self.intervals.append(max(0.0, ts - self.last_ts))
        self.max_step = step
        self.last_ts = ts if self.last_ts is None else max(self.last_ts, ts)

    def median_interval(self) -> float | None:
        if len(self.intervals) < MIN_INTERVALS:
            return None
        return statistics.median(self.intervals)


@dataclass
class LowRun:
    """The GPU-idle rule, the one way both its health rule and the job page's warning judge
    it: an unbroken run of samples below `below`, which a sample at or above it ends."""

    below: float
    since: float | None = None  # the first sample of the run
    last: float = 0.0  # the latest sample of the run
    mean: float = 0.0
    count: int = 0

    def sample(self, value: float, ts: float) -> bool:
        """Take the next sample; False when it is not low, which ends the run."""
        if value >= self.below:
            self.since, self.last, self.mean, self.count = None, 0.0, 0.0, 0
            return False
        if self.since is None:
            self.since = self.last = ts
        self.last = max(self.last, ts)
        self.count += 1
        self.mean += (value - self.mean) / self.count  # incremental: no sum to overflow
        return True

    def seconds(self) -> float:
        return 0.0 if self.since is None else self.last - self.since

    def lasted(self, minutes: float) -> bool:
        return self.since is not None and self.seconds() >= minutes * 60


@dataclass
class _Instance:
    role: str
    index: int
    progress: dict[str, _Progress] = field(default_factory=dict)  # by metric, or ANY_METRIC
    recent: dict[str, deque[float]] = field(default_factory=dict)  # throughput values by metric
    low_runs: dict[Rule, LowRun] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return instance_label(self.role, self.index)


@dataclass(frozen=True)
class _Limit:
    """How long an instance may go without a step, and why, for the message."""

    seconds: float
    reason: str


def _hang_limit(rule: Rule, progress: _Progress | None) -> _Limit | None:
    limits = []
    if rule.minutes is not None:
        limits.append(_Limit(rule.minutes * 60, f"limit {_fmt(rule.minutes)} min"))
    median = progress.median_interval() if progress is not None else None
    if rule.factor is not None and median is not None:
        seconds = rule.factor * median
        reason = f"median step {_duration(median)} × {_fmt(rule.factor)} = {_duration(seconds)}"
        limits.append(_Limit(seconds, reason))
    if not limits:
        return None  # factor only, and too few steps yet to know the pace
    shortest = min(limits, key=lambda limit: limit.seconds)
    floor = DEFAULT_MIN_SECONDS if rule.min_seconds is None else rule.min_seconds
    if shortest.seconds < floor:
        # A 0.05 s/step job must not be restarted over a one-second GC pause.
        return _Limit(floor, f"{shortest.reason}, raised to the {_duration(floor)} floor")
    return shortest


def _mean(values: Iterable[float]) -> float:
    values = list(values)
    return sum(value / len(values) for value in values)  # divided first: huge values stay finite


def _is_whole(value: object) -> TypeGuard[int]:
    """An int that strict JSON writes and reads back (not a bool, not a 5000-digit one)."""
    return isinstance(value, int) and not isinstance(value, bool) and abs(value) <= MAX_WHOLE


def _known_time(ts: float | None) -> float | None:
    return None if ts is None or not math.isfinite(ts) else float(ts)


SilenceKey = tuple[Rule, str | None, int | None]


# ---------------------------------------------------------------------------------------------
# The Watch


class Watch:
    """The health of one attempt: fed its metric points and log lines, asked on ticks."""

    def __init__(
        self,
        rules: list[Rule],
        started_at: float | None,
        *,
        instances: Iterable[tuple[str, int]] = (),
        progress_roles: frozenset[str] | None = None,
        budget: "MatchBudget[Rule] | None" = None,
    ) -> None:
        """`started_at` starts every instance's no-progress clock. None (or a non-finite
        number) starts it at the first event or tick seen, which is what a Watch restored from
        a lost state does: a guess of "long ago" would declare every running job hung.
        `instances`, when known, lets `tick` catch an instance that never says a word.
        `progress_roles`, when given, are the only roles judged by no-progress rules: a
        parameter server's scheduler and servers take no steps of their own.
        `budget`, when given, meters the CPU time the log-pattern rules spend matching (the
        Watch then reads the budget's clocks); without it nothing is measured."""
        self.progress_roles = progress_roles
        self.budget = budget
        self._switched_off: set[Rule] = set()
        self._switched_off_news: list[SwitchedOff] = []
        self._batch_regexes: dict[Rule, Pattern | None] = {}
        self.rules = list(rules)
        self.started_at = _known_time(started_at)
        self._keys = {rule: rule_key(rule) for rule in self.rules}
        self._progress_metrics = {
            rule.metric or ANY_METRIC for rule in self.rules if rule.kind == "no-progress"
        }
        self._drop_metrics = {
            rule.metric for rule in self.rules if rule.kind == "throughput-drop" and rule.metric
        }
        self._instances: dict[tuple[str, int], _Instance] = {}
        self._fired: set[SilenceKey] = set()
        for role, index in instances:
            self._instance(role, index)

    # -- feeding -------------------------------------------------------------------------------

    def metric(
        self, role: str, index: int, name: str, value: float, step: int | None, ts: float
    ) -> list[Firing]:
        instance = self._instance(role, index)
        if instance is None:
            return []
        value, ts = float(value), float(ts)
        self._start_clock(ts)
        if _is_whole(step) and math.isfinite(ts):
            self._note_progress(instance, name, step, ts)
        firings = [
            firing
            for rule in self.rules
            if rule.metric in (name, ANY_METRIC)
            and (firing := self._judge_point(rule, instance, name, value, ts)) is not None
        ]
        if name in self._drop_metrics and math.isfinite(value):
            recent = instance.recent.setdefault(name, deque(maxlen=RECENT_VALUES))
            recent.append(value)  # after judging: a value is compared with those before it
        return firings

    def line(self, role: str, index: int, text: str, stream: str, ts: float) -> list[Firing]:
        return self.lines(role, index, [text], stream, ts)

    def lines(
        self, role: str, index: int, texts: Sequence[str], stream: str, ts: float
    ) -> list[Firing]:
        """What `line` says of each of `texts` (one batch of one instance's stream), in order.

        A rule is first searched once over the batch's lines joined by newlines, in multi-line
        mode, and tried line by line only if that finds something: one search per batch
        rather than one per line (in a print flood the log keeper spent most of its CPU on the
        per-line calls). Joined, a line's match is still there, so no firing is missed; the
        batch may match where no line does (a match across a newline), and the lines then
        decide. Patterns that can tell a line's start from the batch's (\\A, \\z, or
        multi-line mode turned off) are searched line by line only."""
        instance = self._instance(role, index)
        if instance is None or not texts:
            return []
        ts = float(ts)
        self._start_clock(ts)
        searched = [text[:MAX_SEARCH_CHARS] for text in texts]  # bounds the regex's work
        candidates = self._pattern_rules(instance, stream)
        if len(searched) > 1:
            joined = "\n".join(searched)
            candidates = [
                rule
                for rule in candidates
                if (batch_regex := self._batch_regex(rule)) is None
                or self._search(rule, batch_regex, joined, instance, lines=len(searched))
            ]
        firings: list[Firing] = []
        if not candidates:
            return firings
        for text, clipped in zip(texts, searched, strict=True):
            firings += self._line(instance, text, clipped, candidates)
        return firings

    def _pattern_rules(self, instance: "_Instance", stream: str) -> list[Rule]:
        return [
            rule
            for rule in self.rules
            if rule.kind == "log-pattern"
            and rule.regex is not None
            and rule.stream in ("any", stream)
            and not self._silenced(rule, instance)
            and rule not in self._switched_off
        ]

    def _batch_regex(self, rule: Rule) -> Pattern | None:
        """The rule's pattern in multi-line mode, for a whole batch; None when a batch search
        could miss what a line search finds."""
        if rule not in self._batch_regexes:
            pattern = rule.pattern or ""
            batch_regex = None
            if not _LINE_BOUND_SENSITIVE.search(pattern):
                try:
                    batch_regex = compile_pattern(f"(?m){pattern}")
                except UnsafeRegex:  # the flag made it longer than a user's pattern may be
                    pass
            self._batch_regexes[rule] = batch_regex
        return self._batch_regexes[rule]

    def _line(
        self, instance: "_Instance", text: str, searched: str, rules: list[Rule]
    ) -> list[Firing]:
        firings = []
        for rule in rules:
            if self._silenced(rule, instance) or rule in self._switched_off:
                continue  # it fired, or went over the budget, on an earlier line of the batch
            assert rule.regex is not None
            if not self._search(rule, rule.regex, searched, instance):
                continue
            quoted = _clip(_one_line(text[: QUOTED_LINE_CHARS * 2]), QUOTED_LINE_CHARS)
            message = f"{instance.label} printed '{quoted}' ({_rule_ref(rule)})"
            firings.append(self._fire(rule, instance, None, message))
        return firings

    def _search(
        self, rule: Rule, regex: Pattern, text: str, instance: "_Instance", lines: int = 1
    ) -> bool:
        """Whether `regex` finds a match in `text` (`lines` lines), charged to the job's budget
        when metered; the rule that goes over the budget is switched off (even if this text
        matched)."""
        if self.budget is None:
            return search(regex, text) is not None
        started = self.budget.cpu_clock()
        found = search(regex, text) is not None
        overrun = self.budget.charge(rule, self.budget.cpu_clock() - started, lines)
        if overrun is not None and overrun.key not in self._switched_off:
            self._switched_off.add(overrun.key)
            message = overrun.message(f"health rule '{overrun.key.name}'")
            self._switched_off_news.append(
                SwitchedOff(overrun.key, instance.role, instance.index, message)
            )
        return found

    def take_switched_off(self) -> list["SwitchedOff"]:
        """The rules switched off since the last call (each said once), for the console to
        record on the job."""
        news, self._switched_off_news = self._switched_off_news, []
        return news

    def tick(self, now: float) -> list[Firing]:
        """The rules that fire on silence (no-progress), judged at `now`."""
        now = float(now)
        if not math.isfinite(now):
            return []
        self._start_clock(now)
        firings = []
        for rule in self.rules:
            if rule.kind == "no-progress":
                firings.extend(self._judge_hang(rule, now))
        return firings

    # -- judging -------------------------------------------------------------------------------

    def _judge_point(
        self, rule: Rule, instance: _Instance, name: str, value: float, ts: float
    ) -> Firing | None:
        if rule.kind == "non-finite":
            return self._judge_non_finite(rule, instance, name, value)
        if rule.kind == "throughput-drop":
            return self._judge_drop(rule, instance, name, value)
        if rule.kind == "gpu-idle":
            return self._judge_idle(rule, instance, name, value, ts)
        return None

    def _judge_non_finite(
        self, rule: Rule, instance: _Instance, name: str, value: float
    ) -> Firing | None:
        if math.isfinite(value) or self._silenced(rule, instance):
            return None
        message = f"{name} is {value} on {instance.label} ({_rule_ref(rule)})"
        return self._fire(rule, instance, value, message)

    def _judge_drop(
        self, rule: Rule, instance: _Instance, name: str, value: float
    ) -> Firing | None:
        recent = instance.recent.get(name, ())
        if not math.isfinite(value) or len(recent) < MIN_VALUES:
            return None  # warm-up: the first values are compilation and caches, not the pace
        average = _mean(recent)
        if average <= 0:
            return None
        if value >= average:
            self._rearm(rule, instance)
        fraction = DEFAULT_DROP_FRACTION if rule.fraction is None else rule.fraction
        if value >= fraction * average or self._silenced(rule, instance):
            return None
        message = (
            f"{name} on {instance.label} fell to {_fmt(value)}, {_fmt(100 * value / average)}% "
            f"of its recent average {_fmt(average)} ({_rule_ref(rule)})"
        )
        return self._fire(rule, instance, value, message)

    def _judge_idle(
        self, rule: Rule, instance: _Instance, name: str, value: float, ts: float
    ) -> Firing | None:
        if not (math.isfinite(value) and math.isfinite(ts)):
            return None
        below = DEFAULT_GPU_BELOW if rule.below is None else rule.below
        minutes = DEFAULT_GPU_MINUTES if rule.minutes is None else rule.minutes
        run = instance.low_runs.setdefault(rule, LowRun(below))
        if not run.sample(value, ts):
            self._rearm(rule, instance)  # the run is broken: the next one starts afresh
            return None
        if not run.lasted(minutes) or self._silenced(rule, instance):
            return None
        message = (
            f"{name} on {instance.label} stayed below {_fmt(below)}% for "
            f"{_duration(run.seconds())} (average {_fmt(run.mean)}%; {_rule_ref(rule)})"
        )
        return self._fire(rule, instance, run.mean, message)

    def _judge_hang(self, rule: Rule, now: float) -> list[Firing]:
        hung: list[tuple[float, _Instance, _Limit, bool]] = []
        for instance in self._instances.values():
            if self.progress_roles is not None and instance.role not in self.progress_roles:
                continue
            progress = instance.progress.get(rule.metric or ANY_METRIC)
            stepped = progress is not None and progress.last_ts is not None
            since = progress.last_ts if progress is not None and stepped else self.started_at
            limit = _hang_limit(rule, progress)
            if since is None or limit is None or self._silenced(rule, instance):
                continue
            waited = now - since
            if waited >= limit.seconds:
                hung.append((waited, instance, limit, stepped))
        # The instance silent the longest is the likeliest culprit (the others of a stalled DDP
        # job logged a step more): it is named first, and alone for an attempt-ending action.
        hung.sort(key=lambda entry: -entry[0])
        firings = []
        for waited, instance, limit, stepped in hung:
            if self._silenced(rule, instance):
                continue
            what = "no new step on" if stepped else "no step yet on"
            message = (
                f"{what} {instance.label} for {_duration(waited)} "
                f"({limit.reason}; {_rule_ref(rule)})"
            )
            firings.append(self._fire(rule, instance, waited, message))
        return firings

    # -- memory --------------------------------------------------------------------------------

    def _instance(self, role: str, index: int) -> _Instance | None:
        key = (role, index)
        instance = self._instances.get(key)
        if instance is None and len(self._instances) < MAX_INSTANCES:
            instance = self._instances[key] = _Instance(role, index)
        return instance

    def _start_clock(self, ts: float) -> None:
        if self.started_at is None and math.isfinite(ts):
            self.started_at = ts

    def _note_progress(self, instance: _Instance, name: str, step: int, ts: float) -> None:
        for metric in self._progress_metrics:
            if metric in (ANY_METRIC, name):
                instance.progress.setdefault(metric, _Progress()).observe(step, ts)

    def _silence_key(self, rule: Rule, instance: _Instance) -> SilenceKey:
        if rule.action in ENDING_ACTIONS:
            return (rule, None, None)  # an attempt ends once, whichever instance asked
        return (rule, instance.role, instance.index)

    def _silenced(self, rule: Rule, instance: _Instance) -> bool:
        return self._silence_key(rule, instance) in self._fired

    def _rearm(self, rule: Rule, instance: _Instance) -> None:
        if rule.action == "warn" and rule.kind in REARMING_KINDS:
            self._fired.discard(self._silence_key(rule, instance))

    def _fire(self, rule: Rule, instance: _Instance, value: float | None, message: str) -> Firing:
        self._fired.add(self._silence_key(rule, instance))
        return Firing(rule, rule.action, instance.role, instance.index, value, message)
