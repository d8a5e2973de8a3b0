"""Turning what trainers report into metric points: the JSON-lines protocol, and regex metric
definitions over log lines.

A trainer's metrics are its own, untrusted input: whatever it writes, the agent never crashes.
A bad line becomes a problem message (shown in the job's log as an agent note) and no point.
A point goes to the job's log stream as one compact JSON object:
    {"name": "loss", "value": 0.25, "step": 120, "epoch": 1.5, "ts": 1732230000.1}
(step and epoch only when known). A value that is not finite is null there, with what it was
beside it, so that the line stays strict JSON and no chart or database mistakes it for a number:
    {"name": "loss", "value": null, "nonfinite": "nan", "step": 130, "ts": 1732230001.4}
("nan", "inf" or "-inf"). Trainers write such a value as one of those three strings.
"""

import json
import math
import re
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from workers.userregex import (
    MAX_PATTERN_CHARS,
    MatchBudget,
    Pattern,
    UnsafeRegex,
    compile_pattern,
    search,
)

# Names the console draws in their own charts and uses in its figures.
TRAINING_METRICS = ("loss", "lr", "eval_accuracy", "eval_loss", "samples_per_sec")
# What the agent samples itself, per instance.
SYSTEM_METRICS = ("cpu_percent", "memory_mb", "gpu_util_percent", "gpu_memory_mb")
# Declarations of the run's length.
DECLARATIONS = ("total_steps", "total_epochs")
KNOWN_METRICS = frozenset(TRAINING_METRICS + SYSTEM_METRICS + DECLARATIONS)
# An instance with several GPUs: each GPU's own figures too (gpu3_util_percent, gpu3_memory_mb).
PER_GPU_METRIC = re.compile(r"^gpu\d+_(util_percent|memory_mb)$")


def is_system_metric(name: str) -> bool:
    """Sampled by the agent, not reported by the trainer."""
    return name in SYSTEM_METRICS or PER_GPU_METRIC.match(name) is not None


NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_./-]{0,63}$")
RESERVED_KEYS = frozenset(("name", "value", "step", "epoch", "ts"))
MAX_LINE_CHARS = 16 * 1024
MAX_VALUES_PER_LINE = 64
MAX_STEP = 2**53  # beyond this a JSON number is no longer an exact step in a browser
# The strings that stand for a value that is not finite, on a trainer's line and in a point.
NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
# What a regex metric's value group may capture for one (Python's float() alone would also
# take "1e999" and the like, which stay refused).
_NONFINITE_TEXT = re.compile(r"[+-]?(?:nan|inf|infinity)", re.IGNORECASE)


class BadMetric(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Point:
    name: str
    value: float
    step: int | None
    epoch: float | None
    ts: float

    def to_json(self) -> str:
        data: dict[str, Any] = {"name": self.name, "value": self.value}
        if not math.isfinite(self.value):
            data["value"] = None
            data["nonfinite"] = nonfinite_name(self.value)
        if self.step is not None:
            data["step"] = self.step
        if self.epoch is not None:
            data["epoch"] = self.epoch
        data["ts"] = round(self.ts, 3)
        return json.dumps(data, separators=(",", ":"), allow_nan=False)


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadMetric(f"{what} must be a number, not {json.dumps(value)[:40]}")
    try:
        number = float(value)
    except OverflowError:
        raise BadMetric(f"{what} is too large for a 64-bit float") from None
    if not math.isfinite(number):
        raise BadMetric(f"{what} must be finite, not {value}")
    return number


def nonfinite_name(value: float) -> str:
    """How a point writes a value that is not finite: "nan", "inf" or "-inf"."""
    if math.isnan(value):
        return "nan"
    return "inf" if value > 0 else "-inf"


def _value(value: Any, name: str, what: str) -> float:
    """Metric `name`'s value: a finite number, or one of the strings "nan", "inf", "-inf" (the
    declarations of the run's length must be finite)."""
    if isinstance(value, str) and value in NONFINITE and name not in DECLARATIONS:
        return NONFINITE[value]
    return _number(value, what)


def _step(value: Any) -> int | None:
    if value is None:
        return None
    number = _number(value, "step")
    if number < 0 or number != int(number) or number > MAX_STEP:
        raise BadMetric(f"step must be a whole number from 0 to 2**53, not {value}")
    return int(number)


def _name(name: Any) -> str:
    if not isinstance(name, str) or not NAME.match(name):
        raise BadMetric(
            f"metric name {json.dumps(name)[:40]} is not allowed: a letter, then up to 63 "
            "letters, digits or _ . / -"
        )
    return name


def parse_line(text: str, now: float | None = None) -> list[Point]:
    """The points of one protocol line; raises BadMetric saying what is wrong with it."""
    if len(text) > MAX_LINE_CHARS:
        raise BadMetric(f"line of {len(text)} characters is longer than {MAX_LINE_CHARS}")
    try:
        data = json.loads(text, parse_constant=lambda c: c)  # NaN/Infinity stay strings: refused
    except json.JSONDecodeError as exc:
        raise BadMetric(f"not JSON ({exc.msg} at column {exc.colno})") from None
    except ValueError as exc:  # e.g. an integer with too many digits
        raise BadMetric(f"not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise BadMetric("a line must be a JSON object")
    if "ts" in data:
        ts = _number(data["ts"], "ts")
    else:
        ts = time.time() if now is None else now
    step = _step(data.get("step"))
    epoch = _number(data["epoch"], "epoch") if data.get("epoch") is not None else None
    if "name" in data:
        unexpected = set(data) - RESERVED_KEYS
        if unexpected:
            raise BadMetric(f"unexpected keys {sorted(unexpected)} beside name/value")
        if "value" not in data:
            raise BadMetric("name without value")
        name = _name(data["name"])
        return [Point(name, _value(data["value"], name, "value"), step, epoch, ts)]
    values = {k: v for k, v in data.items() if k not in RESERVED_KEYS}
    if not values:
        raise BadMetric("no metric in the line")
    if len(values) > MAX_VALUES_PER_LINE:
        raise BadMetric(f"more than {MAX_VALUES_PER_LINE} metrics in one line")
    return [Point(_name(k), _value(v, k, k), step, epoch, ts) for k, v in values.items()]


@dataclass(frozen=True)
class RegexMetric:
    """A metric read off log lines: `regex`'s group "value" (or its first group) is the value,
    its group "step", if it has one, the step. The regex runs on RE2 (workers/userregex.py)."""

    name: str
    pattern: Pattern

    @classmethod
    def compile(cls, name: str, regex: str) -> "RegexMetric":
        _name(name)
        try:
            pattern = compile_pattern(regex)
        except UnsafeRegex as exc:
            raise BadMetric(f"regex of {name!r} {exc}") from None
        if pattern.groups < 1:
            raise BadMetric(f"regex of {name!r} needs a group around the value, e.g. ([0-9.]+)")
        return cls(name, pattern)

    def point(self, line: str, ts: float) -> Point | None:
        """The point in `line`, if the regex matches it and captures a number."""
        match = search(self.pattern, line)
        if match is None:
            return None
        groups = self.pattern.groupindex
        try:
            raw = match.group("value") if "value" in groups else match.group(1)
            value = _regex_value(raw, self.name)
            step = _step(int(match.group("step"))) if "step" in groups else None
        except (BadMetric, TypeError, ValueError):
            return None
        return Point(self.name, value, step, None, ts)


def scan_lines(definitions: Sequence[RegexMetric], lines: Sequence[str], ts: float) -> list[Point]:
    """Points from log lines that match regex definitions (values that aren't numbers are
    skipped: a definition is a best effort over free text). A value captured as nan, inf, -inf
    or Infinity (any case) is a point that is not finite."""
    return [
        point
        for line in lines
        for definition in definitions
        if (point := definition.point(line, ts)) is not None
    ]


class RegexScanner:
    """One replica's regex metrics, matched under its job's MatchBudget on this agent.

    A definition whose regex goes over the budget is switched off for the rest of the replica's
    run, and `scan` returns a note saying so (the supervisor puts it in the instance's log), so
    an expensive pattern costs its own job its metric, and nobody else anything. The stdout and
    stderr readers of a replica both scan: the lock keeps the budget's books, not the matching
    (RE2 releases the GIL while it matches)."""

    def __init__(
        self, definitions: Sequence[RegexMetric], budget: MatchBudget[int] | None = None
    ) -> None:
        # By position: two definitions may share a name.
        self.active = dict(enumerate(definitions))
        self.budget: MatchBudget[int] = budget if budget is not None else MatchBudget()
        self._lock = threading.Lock()

    def scan(self, lines: Sequence[str], ts: float) -> tuple[list[Point], list[str]]:
        """The points in `lines`, and the notes of definitions switched off meanwhile."""
        found: list[tuple[int, int, Point]] = []
        notes: list[str] = []
        clock = self.budget.cpu_clock
        for order, definition in list(self.active.items()):
            started = clock()
            for number, line in enumerate(lines):
                point = definition.point(line, ts)
                if point is not None:
                    found.append((number, order, point))
            with self._lock:
                overrun = self.budget.charge(order, clock() - started, len(lines))
                off = self.active.pop(overrun.key, None) if overrun is not None else None
            if overrun is not None and off is not None:
                notes.append(overrun.message(f"metric {off.name!r}"))
        found.sort(key=lambda entry: entry[:2])  # in the order of the lines, as scan_lines
        return [point for _, _, point in found], notes


def _regex_value(raw: str, name: str) -> float:
    number = float(raw)
    if (
        not math.isfinite(number)
        and name not in DECLARATIONS
        and _NONFINITE_TEXT.fullmatch(raw.strip())
    ):
        return number
    return _number(number, name)


MAX_DEFINITIONS = 20
MAX_REGEX_CHARS = MAX_PATTERN_CHARS


def check_definitions(raw: Any) -> list[dict[str, str]]:
    """[{"name": ..., "regex": ...}] with names the protocol accepts and regexes that compile
    and have a group around the value; raises BadMetric saying what is wrong. The console
    checks a job's and an image's definitions with this before an agent ever sees them."""
    if raw is None:
        return []
    if not isinstance(raw, list) or len(raw) > MAX_DEFINITIONS:
        raise BadMetric(f"a list of at most {MAX_DEFINITIONS} {{name, regex}} objects")
    definitions = []
    for item in raw:
        if not isinstance(item, dict) or set(item) != {"name", "regex"}:
            raise BadMetric('each definition is {"name": ..., "regex": ...}')
        if not isinstance(item["regex"], str) or len(item["regex"]) > MAX_REGEX_CHARS:
            raise BadMetric(f"a regex is a string of at most {MAX_REGEX_CHARS} characters")
        RegexMetric.compile(item["name"], item["regex"])
        definitions.append({"name": item["name"], "regex": item["regex"]})
    return definitions


def compile_definitions(raw: Sequence[dict[str, str]]) -> tuple[list[RegexMetric], list[str]]:
    """The definitions that compile, and why each other one is left out: a definition stored
    before the console checked regexes with RE2 (a backreference, say) switches off alone."""
    definitions, problems = [], []
    for item in raw:
        try:
            definitions.append(RegexMetric.compile(item["name"], item["regex"]))
        except (BadMetric, KeyError, TypeError) as exc:
            problems.append(f"metric definition {_shown(item)} switched off: {exc}")
    return definitions, problems


def _shown(item: object) -> str:
    name = item.get("name") if isinstance(item, dict) else None
    return repr(name) if isinstance(name, str) else json.dumps(item, default=str)[:60]
