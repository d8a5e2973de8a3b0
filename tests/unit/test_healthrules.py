"""Health rules: parsing says exactly what is wrong whatever JSON arrives, and a Watch fires when,
and only when, a rule's condition holds. Pure: no Django, no clock, no sleeps."""

import json
import math
import random
from collections.abc import Sequence

import pytest

from jobs.healthrules import (
    ACTIONS,
    KINDS,
    MAX_RULES,
    Firing,
    Rule,
    RuleError,
    Watch,
    instance_label,
    parse_rules,
    rules_to_json,
)

NAN = float("nan")
INF = float("inf")


def one_rule(**data: object) -> Rule:
    (rule,) = parse_rules([data])
    return rule


def messages(firings: list[Firing]) -> list[str]:
    return [firing.message for firing in firings]


def step_every(
    watch: Watch, seconds: float, steps: int, role: str = "master", index: int = 0
) -> float:
    """`steps` loss points at steps 0, 1, 2… one every `seconds` from ts 0; the last ts."""
    for step in range(steps):
        assert watch.metric(role, index, "loss", 1.0, step, step * seconds) == []
    return (steps - 1) * seconds


# ---------------------------------------------------------------------------------------------
# The contract


def test_the_names_of_kinds_and_actions_are_the_contract() -> None:
    assert KINDS == ("non-finite", "no-progress", "log-pattern", "throughput-drop", "gpu-idle")
    assert ACTIONS == ("warn", "stop", "restart", "restart-exclude-node")
    assert issubclass(RuleError, ValueError)


@pytest.mark.parametrize(
    ("role", "index", "label"),
    [
        ("master", 0, "master"),
        ("scheduler", 0, "scheduler"),
        ("worker", 1, "worker-1"),
        ("server", 0, "server-0"),
    ],
)
def test_instances_are_named_as_everywhere_in_the_console(
    role: str, index: int, label: str
) -> None:
    assert instance_label(role, index) == label


# ---------------------------------------------------------------------------------------------
# Parsing: defaults, default names, the JSON round trip


@pytest.mark.parametrize(
    ("written", "name", "spelled_out"),
    [
        (
            {"kind": "non-finite", "action": "stop"},
            "loss is not finite",
            {"kind": "non-finite", "action": "stop", "metric": "loss"},
        ),
        (
            {"kind": "non-finite", "metric": "*", "action": "warn"},
            "a metric is not finite",
            {"kind": "non-finite", "action": "warn", "metric": "*"},
        ),
        (
            {"kind": "no-progress", "factor": 10, "minutes": 30, "action": "restart"},
            "no progress",
            {
                "kind": "no-progress",
                "action": "restart",
                "factor": 10,
                "minutes": 30,
                "min_seconds": 30,
            },
        ),
        (
            {"kind": "no-progress", "minutes": 2.5, "metric": "loss", "action": "warn"},
            "no progress in loss",
            {
                "kind": "no-progress",
                "action": "warn",
                "metric": "loss",
                "minutes": 2.5,
                "min_seconds": 30,
            },
        ),
        (
            {"kind": "log-pattern", "pattern": "CUDA out of memory", "action": "stop"},
            "log matches 'CUDA out of memory'",
            {
                "kind": "log-pattern",
                "action": "stop",
                "pattern": "CUDA out of memory",
                "stream": "any",
            },
        ),
        (
            {"kind": "log-pattern", "pattern": "Traceback", "stream": "stderr", "action": "warn"},
            "stderr matches 'Traceback'",
            {"kind": "log-pattern", "action": "warn", "pattern": "Traceback", "stream": "stderr"},
        ),
        (
            {
                "kind": "throughput-drop",
                "metric": "samples_per_sec",
                "fraction": 0.5,
                "action": "warn",
            },
            "samples_per_sec dropped below 50% of its average",
            {
                "kind": "throughput-drop",
                "action": "warn",
                "metric": "samples_per_sec",
                "fraction": 0.5,
            },
        ),
        (
            {"kind": "throughput-drop", "action": "warn"},
            "samples_per_sec dropped below 50% of its average",
            {
                "kind": "throughput-drop",
                "action": "warn",
                "metric": "samples_per_sec",
                "fraction": 0.5,
            },
        ),
        (
            {"kind": "gpu-idle", "metric": "gpu_util", "below": 80, "minutes": 1, "action": "warn"},
            "gpu_util below 80% for 1 min",
            {"kind": "gpu-idle", "action": "warn", "metric": "gpu_util", "below": 80, "minutes": 1},
        ),
        (
            {"kind": "gpu-idle", "action": "restart-exclude-node"},
            "gpu_util_percent below 80% for 1 min",
            {
                "kind": "gpu-idle",
                "action": "restart-exclude-node",
                "metric": "gpu_util_percent",
                "below": 80,
                "minutes": 1,
            },
        ),
    ],
)
def test_a_rule_gets_its_defaults_and_a_readable_name(
    written: dict[str, object], name: str, spelled_out: dict[str, object]
) -> None:
    rule = one_rule(**written)
    assert rule.name == name
    assert rule.to_json() == spelled_out
    assert parse_rules([spelled_out]) == [rule]


def test_a_given_name_is_kept_and_written_back() -> None:
    rule = one_rule(kind="log-pattern", pattern="NCCL error", action="restart", name="  NCCL  ")
    assert rule.name == "NCCL"
    assert rule.to_json()["name"] == "NCCL"
    # A null is as good as leaving a parameter out.
    assert one_rule(kind="gpu-idle", action="warn", name=None, below=None).below == 80


def test_rules_survive_a_strict_json_round_trip() -> None:
    rules = parse_rules(
        [
            {"kind": "non-finite", "metric": "loss", "action": "stop"},
            {
                "kind": "no-progress",
                "factor": 10,
                "minutes": 30,
                "min_seconds": 5,
                "action": "restart",
            },
            {
                "kind": "log-pattern",
                "pattern": r"(?i)nccl (error|timeout)",
                "stream": "stderr",
                "action": "restart-exclude-node",
                "name": "NCCL trouble",
            },
            {"kind": "throughput-drop", "fraction": 0.25, "action": "warn"},
            {"kind": "gpu-idle", "below": 50.5, "minutes": 0.5, "action": "warn"},
        ]
    )
    written = json.dumps(rules_to_json(rules), allow_nan=False)
    assert parse_rules(json.loads(written)) == rules
    assert json.loads(written)[1]["factor"] == 10  # whole numbers read as the user wrote them
    assert parse_rules([]) == []


# ---------------------------------------------------------------------------------------------
# Parsing: the messages users see for the common mistakes

KINDS_LISTED = "one of non-finite, no-progress, log-pattern, throughput-drop, gpu-idle"
ACTIONS_LISTED = "one of warn, stop, restart, restart-exclude-node"
HANG = {"kind": "no-progress", "action": "restart"}
OOM = {"kind": "log-pattern", "pattern": "CUDA out of memory", "action": "stop"}
DROP = {"kind": "throughput-drop", "action": "warn"}
IDLE = {"kind": "gpu-idle", "action": "warn"}
NON_FINITE = {"kind": "non-finite", "action": "stop"}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"kind": "non-finite"}, "health rules must be a list of rule objects, not an object"),
        ("[]", "health rules must be a list of rule objects, not a string"),
        (None, "health rules must be a list of rule objects, not null"),
        ([NON_FINITE] * 21, "at most 20 health rules, not 21"),
        (
            [["non-finite", "stop"]],
            'rule 1: must be an object like {"kind": "non-finite", "action": "stop"}, not a list',
        ),
        ([{"action": "stop"}], f"rule 1: 'kind' is missing; {KINDS_LISTED}"),
        (
            [{"kind": "non_finite", "action": "stop"}],
            f"rule 1: unknown kind \"non_finite\" (did you mean 'non-finite'?); {KINDS_LISTED}",
        ),
        ([{"kind": 3, "action": "stop"}], f"rule 1: unknown kind 3; {KINDS_LISTED}"),
        ([{"kind": "non-finite"}], f"rule 1: 'action' is missing; {ACTIONS_LISTED}"),
        (
            [NON_FINITE, {"kind": "non-finite", "action": "kill"}],
            f'rule 2: unknown action "kill"; {ACTIONS_LISTED}',
        ),
        (
            [{"kind": "gpu-idle", "action": "restart_exclude_node"}],
            'rule 1: unknown action "restart_exclude_node" (did you mean '
            f"'restart-exclude-node'?); {ACTIONS_LISTED}",
        ),
        (
            [{**HANG, "minute": 30}],
            "rule 1: unknown key 'minute' (did you mean 'minutes'?); a no-progress rule takes "
            "metric, factor, minutes, min_seconds",
        ),
        (
            [{**NON_FINITE, "pattern": "nan"}],
            "rule 1: unknown key 'pattern'; a non-finite rule takes metric",
        ),
        (
            [NON_FINITE, {**HANG, "factor": True}],
            "rule 2: 'factor' must be a positive number up to 1000, not true",
        ),
        (
            [{**HANG, "factor": "10"}],
            "rule 1: 'factor' must be a positive number up to 1000, not \"10\"",
        ),
        ([{**HANG, "factor": 0}], "rule 1: 'factor' must be a positive number up to 1000, not 0"),
        (
            [{**HANG, "factor": -2.5}],
            "rule 1: 'factor' must be a positive number up to 1000, not -2.5",
        ),
        (
            [{**HANG, "factor": NAN}],
            "rule 1: 'factor' must be a positive number up to 1000, not NaN",
        ),
        (
            [{**HANG, "factor": INF}],
            "rule 1: 'factor' must be a positive number up to 1000, not Infinity",
        ),
        (
            [{**HANG, "factor": 1001}],
            "rule 1: 'factor' must be a positive number up to 1000, not 1001",
        ),
        (
            [{**HANG, "factor": 10**400}],
            "rule 1: 'factor' must be a positive number up to 1000, not a very large number",
        ),
        (
            [{**HANG, "factor": [10]}],
            "rule 1: 'factor' must be a positive number up to 1000, not a list",
        ),
        (
            [{**HANG, "minutes": 0}],
            "rule 1: 'minutes' must be a positive number of minutes up to 10080, not 0",
        ),
        (
            [HANG],
            "rule 1: a no-progress rule needs 'factor', 'minutes' or both, "
            'e.g. {"factor": 10, "minutes": 30}',
        ),
        (
            [{**HANG, "minutes": 5, "min_seconds": -1}],
            "rule 1: 'min_seconds' must be a number of seconds from 0 to 86400, not -1",
        ),
        (
            [{**DROP, "fraction": 1.5}],
            "rule 1: 'fraction' must be a number above 0 and up to 1, e.g. 0.5 for half, not 1.5",
        ),
        (
            [{**DROP, "fraction": 50}],
            "rule 1: 'fraction' must be a number above 0 and up to 1, e.g. 0.5 for half, not 50",
        ),
        (
            [{**IDLE, "below": 0}],
            "rule 1: 'below' must be a percentage above 0 and up to 100, not 0",
        ),
        (
            [{**IDLE, "below": 101}],
            "rule 1: 'below' must be a percentage above 0 and up to 100, not 101",
        ),
        (
            [{**OOM, "pattern": "CUDA out of (memory"}],
            "rule 1: 'pattern' is not a valid regular expression for RE2: missing ): "
            "CUDA out of (memory",
        ),
        ([{**OOM, "pattern": "x" * 501}], "rule 1: 'pattern' is 501 characters long; at most 500"),
        (
            [{**OOM, "pattern": "error|"}],
            "rule 1: 'pattern' matches an empty line, so it would match every line",
        ),
        (
            [{**OOM, "pattern": ""}],
            "rule 1: 'pattern' matches an empty line, so it would match every line",
        ),
        ([{**OOM, "pattern": 7}], "rule 1: 'pattern' must be a string, not 7"),
        (
            [{"kind": "log-pattern", "action": "stop"}],
            "rule 1: 'pattern' is missing (the regular expression to look for)",
        ),
        (
            [{**OOM, "stream": "both"}],
            'rule 1: \'stream\' must be "stdout", "stderr" or "any", not "both"',
        ),
        (
            [{**DROP, "metric": "*"}],
            "rule 1: 'metric' must be a metric name like \"loss\" (a letter, then up to 63 "
            'letters, digits or _ . / -), not "*"',
        ),
        (
            [{**NON_FINITE, "metric": "my loss"}],
            "rule 1: 'metric' must be a metric name like \"loss\" (a letter, then up to 63 "
            'letters, digits or _ . / -) or "*" for any metric, not "my loss"',
        ),
        ([{**OOM, "name": ""}], "rule 1: 'name' must be one line of 1 to 100 characters, not \"\""),
        ([{**OOM, "name": 7}], "rule 1: 'name' must be one line of 1 to 100 characters, not 7"),
        (
            [{**OOM, "name": "two\nlines"}],
            "rule 1: 'name' must be one line of 1 to 100 characters, not \"two\\nlines\"",
        ),
        (
            [{**OOM, "name": "n" * 101}],
            f"rule 1: 'name' must be one line of 1 to 100 characters, not \"{'n' * 39}…\"",
        ),
        ([OOM, NON_FINITE, dict(OOM)], "rule 3: the same as rule 1"),
    ],
)
def test_a_mistake_is_reported_with_the_rule_and_what_is_wrong(data: object, message: str) -> None:
    with pytest.raises(RuleError) as raised:
        parse_rules(data)
    assert str(raised.value) == message


def test_as_many_rules_as_allowed_are_fine() -> None:
    rules = [{**NON_FINITE, "metric": f"m{i}"} for i in range(MAX_RULES)]
    assert len(parse_rules(rules)) == MAX_RULES


def test_pathological_patterns_are_refused_not_raised() -> None:
    nested = "(" * 240 + "x" + ")" * 240
    try:
        parse_rules([{**OOM, "pattern": nested}])
    except RuleError:
        pass  # refused with a message is as good as accepted: no other exception
    with pytest.raises(RuleError) as raised:
        parse_rules([{**OOM, "pattern": "x{1001}"}])
    assert str(raised.value) == (
        "rule 1: 'pattern' uses counted repetition beyond {1000} (nested counts multiply), "
        "which Trainyard does not run: patterns run on RE2, which matches in time linear in "
        "the line (invalid repetition size: {1001})"
    )


ODD_VALUES: list[object] = [
    None,
    True,
    False,
    0,
    -1,
    1,
    0.5,
    1e308,
    -1e308,
    NAN,
    INF,
    -INF,
    10**400,
    -(10**400),
    "",
    "x",
    "*",
    "loss",
    "(",
    "stop",
    "non-finite",
    "\x00",
    "\ud800",
    "ñ" * 600,
    [],
    [1],
    [[[]]],
    {},
    {"kind": "non-finite"},
    {1: 2},
    (1, 2),
    {"a"},
    b"bytes",
    object(),
]
KEYS = [
    "kind",
    "action",
    "name",
    "metric",
    "factor",
    "minutes",
    "min_seconds",
    "pattern",
    "stream",
    "fraction",
    "below",
    "extra",
    1,
    None,
]


def odd_rule(rng: random.Random) -> object:
    if rng.random() < 0.1:
        return rng.choice(ODD_VALUES)
    item: dict[object, object] = {
        "kind": rng.choice([*KINDS, *KINDS, rng.choice(ODD_VALUES)]),
        "action": rng.choice([*ACTIONS, rng.choice(ODD_VALUES)]),
    }
    for _ in range(rng.randrange(4)):
        item[rng.choice(KEYS)] = rng.choice([*ODD_VALUES, 10, 30, 0.5, 80, "Traceback"])
    return item


def deeply_nested(depth: int) -> object:
    value: object = []
    for _ in range(depth):
        value = [value]
    return value


def test_whatever_json_arrives_the_answer_is_rules_or_a_rule_error() -> None:
    rng = random.Random(20240607)
    candidates: list[object] = [*ODD_VALUES, deeply_nested(50_000), [deeply_nested(50_000)]]
    candidates += [[odd_rule(rng) for _ in range(rng.randrange(5))] for _ in range(3000)]
    candidates += [[odd_rule(rng)] * 25]
    accepted = 0
    for data in candidates:
        try:
            rules = parse_rules(data)
        except RuleError as error:
            assert str(error)
            continue
        accepted += 1
        assert all(isinstance(rule, Rule) for rule in rules)
        assert parse_rules(json.loads(json.dumps(rules_to_json(rules), allow_nan=False))) == rules
    assert accepted > 100  # the fuzz reaches valid rules too, not only the first check


# ---------------------------------------------------------------------------------------------
# non-finite


@pytest.mark.parametrize(("value", "shown"), [(NAN, "nan"), (INF, "inf"), (-INF, "-inf")])
def test_a_non_finite_loss_fires_with_the_value(value: float, shown: str) -> None:
    watch = Watch([one_rule(kind="non-finite", metric="loss", action="stop")], started_at=0.0)
    assert watch.metric("worker", 1, "loss", 2.5, 1, 1.0) == []
    assert watch.metric("worker", 1, "grad_norm", value, 1, 1.0) == []  # not the rule's metric
    (firing,) = watch.metric("worker", 1, "loss", value, 2, 2.0)
    assert firing.message == f"loss is {shown} on worker-1 (rule “loss is not finite”: stop)"
    assert (firing.action, firing.role, firing.index) == ("stop", "worker", 1)
    assert firing.value is not None and not math.isfinite(firing.value)
    assert str(firing.value) == shown


def test_an_attempt_ending_rule_fires_once_per_watch_naming_the_first_instance() -> None:
    rule = one_rule(kind="non-finite", action="stop")
    watch = Watch([rule], started_at=0.0)
    assert len(watch.metric("worker", 0, "loss", NAN, 5, 1.0)) == 1
    assert watch.metric("worker", 0, "loss", NAN, 6, 2.0) == []
    assert watch.metric("worker", 1, "loss", NAN, 6, 2.0) == []  # every rank: one stop


def test_a_warning_fires_once_per_instance_and_any_metric_means_any() -> None:
    watch = Watch([one_rule(kind="non-finite", metric="*", action="warn")], started_at=0.0)
    (first,) = watch.metric("worker", 0, "grad_norm", INF, 5, 1.0)
    assert first.message == "grad_norm is inf on worker-0 (rule “a metric is not finite”: warn)"
    assert watch.metric("worker", 0, "loss", NAN, 5, 1.0) == []
    assert [f.role for f in watch.metric("master", 0, "loss", NAN, 5, 1.0)] == ["master"]


@pytest.mark.parametrize("action", ACTIONS)
def test_every_action_is_carried_by_its_firing(action: str) -> None:
    watch = Watch([one_rule(kind="non-finite", action=action)], started_at=0.0)
    (firing,) = watch.metric("master", 0, "loss", NAN, None, 1.0)
    assert firing.action == firing.rule.action == action


# ---------------------------------------------------------------------------------------------
# no-progress


def test_a_hang_fires_after_factor_times_the_median_step_and_not_before() -> None:
    rule = one_rule(kind="no-progress", factor=10, min_seconds=0, action="restart")
    watch = Watch([rule], started_at=0.0)
    last = step_every(watch, seconds=1.0, steps=11)
    assert watch.tick(last + 9.99) == []
    (firing,) = watch.tick(last + 10)
    assert firing.message == (
        "no new step on master for 10 s (median step 1 s × 10 = 10 s; rule “no progress”: restart)"
    )
    assert firing.value == 10.0
    assert watch.tick(last + 100) == []  # once


def test_the_floor_keeps_a_fast_job_from_firing_on_a_short_pause() -> None:
    watch = Watch([one_rule(kind="no-progress", factor=10, action="restart")], started_at=0.0)
    last = step_every(watch, seconds=0.25, steps=100)
    assert watch.tick(last + 3.0) == []  # a GC pause of 12 median steps, far under 30 s
    assert watch.tick(last + 29.99) == []
    (firing,) = watch.tick(last + 30)
    assert firing.message == (
        "no new step on master for 30 s (median step 0.25 s × 10 = 2.5 s, raised to the 30 s "
        "floor; rule “no progress”: restart)"
    )


def test_factor_alone_waits_for_enough_steps_to_know_the_pace() -> None:
    watch = Watch([one_rule(kind="no-progress", factor=10, min_seconds=0, action="warn")], 0.0)
    last = step_every(watch, seconds=1.0, steps=3)  # two intervals: no median yet
    assert watch.tick(last + 10_000) == []
    watch.metric("master", 0, "loss", 1.0, 3, 3.0)  # a third interval
    assert watch.tick(12.99) == []
    assert len(watch.tick(13.0)) == 1


def test_the_time_before_the_first_step_is_start_up_not_a_step() -> None:
    watch = Watch([one_rule(kind="no-progress", factor=10, min_seconds=0, action="warn")], 0.0)
    for step, ts in enumerate([600.0, 601.0, 602.0]):  # ten minutes of start-up, two steps
        watch.metric("master", 0, "loss", 1.0, step, ts)
    assert watch.tick(612.0) == []  # two intervals, not three: the start-up is not one
    watch.metric("master", 0, "loss", 1.0, 3, 603.0)
    (firing,) = watch.tick(613.0)
    assert "median step 1 s × 10 = 10 s" in firing.message


def test_minutes_catch_a_job_that_never_makes_its_first_step() -> None:
    rule = one_rule(kind="no-progress", minutes=30, action="restart")
    watch = Watch([rule], started_at=100.0, instances=[("master", 0), ("worker", 1)])
    assert watch.tick(100 + 30 * 60 - 0.01) == []
    (firing,) = watch.tick(100 + 30 * 60)
    assert firing.message == (
        "no step yet on master for 30 min (limit 30 min; rule “no progress”: restart)"
    )
    assert firing.value == 1800.0


def test_an_instance_known_from_its_log_lines_is_watched_from_the_start() -> None:
    watch = Watch([one_rule(kind="no-progress", minutes=1, action="warn")], started_at=0.0)
    assert watch.tick(10_000) == []  # nobody known yet: nobody to name
    watch.line("worker", 2, "loading the dataset…", "stdout", 5.0)
    (firing,) = watch.tick(10_000)
    assert firing.role == "worker" and firing.index == 2
    assert firing.message.startswith("no step yet on worker-2 for 2.78 h (limit 1 min;")


def test_the_shorter_of_factor_and_minutes_applies() -> None:
    slow = one_rule(kind="no-progress", factor=10, minutes=5, action="warn")
    watch = Watch([slow], started_at=0.0)
    last = step_every(watch, seconds=60.0, steps=5)  # 10 × 60 s = 10 min > 5 min
    assert watch.tick(last + 299) == []
    assert "(limit 5 min;" in messages(watch.tick(last + 300))[0]

    fast = one_rule(kind="no-progress", factor=10, minutes=30, min_seconds=0, action="warn")
    watch = Watch([fast], started_at=0.0)
    last = step_every(watch, seconds=1.0, steps=5)
    assert "(median step 1 s × 10 = 10 s;" in messages(watch.tick(last + 10))[0]


def test_only_larger_steps_are_progress_and_points_without_step_are_ignored() -> None:
    watch = Watch([one_rule(kind="no-progress", factor=10, min_seconds=0, action="warn")], 0.0)
    last = step_every(watch, seconds=1.0, steps=11)
    watch.metric("master", 0, "lr", 0.1, 10, last + 5)  # the same step again
    watch.metric("master", 0, "loss", 0.9, 3, last + 6)  # an older step
    watch.metric("master", 0, "cpu_percent", 50.0, None, last + 7)  # a system sample
    assert len(watch.tick(last + 10)) == 1


def test_a_rule_on_one_metric_counts_only_that_metric_s_steps() -> None:
    any_metric = one_rule(kind="no-progress", factor=10, min_seconds=0, action="warn")
    loss_only = one_rule(kind="no-progress", factor=10, min_seconds=0, metric="loss", action="warn")
    watch = Watch([any_metric, loss_only], started_at=0.0)
    step_every(watch, seconds=1.0, steps=11)  # loss up to step 10 at ts 10
    watch.metric("master", 0, "eval_accuracy", 0.9, 20, 15.0)
    (firing,) = watch.tick(20.0)
    assert firing.rule == loss_only
    assert firing.message == (
        "no new step on master for 10 s (median step 1 s × 10 = 10 s; "
        "rule “no progress in loss”: warn)"
    )


def test_a_stalled_ddp_job_names_the_rank_silent_longest_and_restarts_once() -> None:
    rule = one_rule(kind="no-progress", factor=10, min_seconds=0, action="restart")
    watch = Watch([rule], started_at=0.0)
    for step in range(11):
        watch.metric("master", 0, "loss", 1.0, step, float(step))
        if step <= 5:
            watch.metric("worker", 1, "loss", 1.0, step, float(step))
    (firing,) = watch.tick(40.0)
    assert (firing.role, firing.index, firing.value) == ("worker", 1, 35.0)
    assert watch.tick(50.0) == []


def test_a_hang_warning_names_every_stalled_instance_once() -> None:
    watch = Watch([one_rule(kind="no-progress", minutes=1, action="warn")], started_at=0.0)
    watch.metric("master", 0, "loss", 1.0, 1, 30.0)
    watch.metric("worker", 1, "loss", 1.0, 1, 10.0)
    assert [(f.role, f.value) for f in watch.tick(100.0)] == [("worker", 90.0), ("master", 70.0)]
    assert watch.tick(200.0) == []


@pytest.mark.parametrize("now", [50.0, 10.0, -5.0, NAN, INF, -INF])
def test_a_tick_from_the_past_or_of_no_time_is_harmless(now: float) -> None:
    watch = Watch(
        [one_rule(kind="no-progress", minutes=1, action="warn")], 100.0, instances=[("master", 0)]
    )
    watch.metric("master", 0, "loss", 1.0, 1, 120.0)
    assert watch.tick(now) == []
    assert len(watch.tick(180.0)) == 1


def test_metric_points_and_lines_never_report_a_hang_themselves() -> None:
    watch = Watch([one_rule(kind="no-progress", minutes=1, action="warn")], started_at=0.0)
    assert watch.metric("master", 0, "loss", 1.0, None, 10_000.0) == []
    assert watch.line("master", 0, "still here", "stdout", 10_000.0) == []


# ---------------------------------------------------------------------------------------------
# log-pattern


def test_a_log_line_that_matches_fires_and_quotes_the_line() -> None:
    watch = Watch([one_rule(**OOM)], started_at=0.0)
    assert watch.line("worker", 0, "epoch 1 done", "stdout", 1.0) == []
    line = "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
    (firing,) = watch.line("worker", 0, line, "stderr", 2.0)
    assert firing.message == (
        "worker-0 printed 'RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB' "
        "(rule “log matches 'CUDA out of memory'”: stop)"
    )
    assert firing.value is None and firing.action == "stop"
    assert watch.line("worker", 1, line, "stderr", 3.0) == []  # the attempt is already ending


def test_patterns_are_case_sensitive_unless_they_say_otherwise() -> None:
    strict = one_rule(kind="log-pattern", pattern="NCCL error", action="warn")
    relaxed = one_rule(kind="log-pattern", pattern="(?i)nccl error", action="warn")
    watch = Watch([strict, relaxed], started_at=0.0)
    assert [f.rule for f in watch.line("master", 0, "nccl ERROR 5", "stderr", 1.0)] == [relaxed]
    assert [f.rule for f in watch.line("master", 0, "NCCL error 5", "stderr", 1.0)] == [strict]


def test_a_pattern_for_one_stream_ignores_the_other() -> None:
    rule = one_rule(kind="log-pattern", pattern="Traceback", stream="stderr", action="warn")
    watch = Watch([rule], started_at=0.0)
    assert watch.line("master", 0, "Traceback (most recent call last):", "stdout", 1.0) == []
    assert len(watch.line("master", 0, "Traceback (most recent call last):", "stderr", 1.0)) == 1


def test_a_warning_pattern_fires_once_per_instance() -> None:
    rule = one_rule(kind="log-pattern", pattern="retrying", action="warn")
    watch = Watch([rule], started_at=0.0)
    assert len(watch.line("worker", 0, "retrying 1", "stdout", 1.0)) == 1
    assert watch.line("worker", 0, "retrying 2", "stdout", 2.0) == []
    assert len(watch.line("worker", 1, "retrying 1", "stdout", 2.0)) == 1


def test_the_quoted_line_is_trimmed_and_cleaned() -> None:
    watch = Watch([one_rule(kind="log-pattern", pattern="ERROR", action="warn")], 0.0)
    (coloured,) = watch.line("master", 0, "\x1b[31mERROR\x1b[0m\tdisk\r\n", "stderr", 1.0)
    assert coloured.message.startswith("master printed 'ERROR disk' (rule")
    watch = Watch([one_rule(kind="log-pattern", pattern="ERROR", action="warn")], 0.0)
    (long,) = watch.line("master", 0, "ERROR " + "x" * 1000, "stderr", 1.0)
    quoted = long.message.split("'")[1]
    assert len(quoted) == 200 and quoted.endswith("…")


BATCH_PATTERNS = [
    "CUDA out of memory",
    "^Traceback",
    r"done$",
    r"^\s+$",  # joined, it also takes the newlines between empty lines
    r"\Aepoch",  # \A: a line's start, not the batch's
    r"(?-m)^loss",  # multi-line mode turned off
    r"(?s)error.*fatal",  # `.` takes the newline: the batch matches across two lines
    r"step \d+\nstep",  # a newline no line has
    r"(?i)\bnan\b",
    r"[^a-z ]{3}",
]
BATCH_LINES = [
    "epoch 1 done",
    "",
    "",
    "   ",
    "Traceback (most recent call last):",
    "an error, then",
    "a fatal one",
    "step 12",
    "step 13",
    "loss NaN at epoch 2",
    "x" * 20_000 + " CUDA out of memory",  # past the searched part of a line
    "  RuntimeError: CUDA out of memory",
    "loss 0.1 ===",
]


@pytest.mark.parametrize("pattern", BATCH_PATTERNS)
def test_a_batch_of_lines_fires_exactly_as_its_lines_one_by_one(pattern: str) -> None:
    rule = one_rule(kind="log-pattern", pattern=pattern, action="warn")
    for first in range(len(BATCH_LINES)):
        lines = BATCH_LINES[first:] + BATCH_LINES[:first]
        one_by_one = Watch([rule], started_at=0.0)
        expected = [
            f.message for text in lines for f in one_by_one.line("master", 0, text, "stdout", 1.0)
        ]
        batched = Watch([rule], started_at=0.0)
        assert messages(batched.lines("master", 0, lines, "stdout", 1.0)) == expected


def test_a_batch_no_rule_matches_is_searched_once_per_rule_not_once_per_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from jobs import healthrules

    searched: list[int] = []
    real = healthrules.search

    def counting(regex: object, text: str) -> object:
        searched.append(text.count("\n") + 1)
        return real(regex, text)

    monkeypatch.setattr(healthrules, "search", counting)
    rules = [one_rule(**OOM), one_rule(kind="log-pattern", pattern="NCCL error", action="warn")]
    watch = Watch(rules, started_at=0.0)
    lines = [f"step {n} loss=0.{n:03d}" for n in range(1000)]
    assert watch.lines("master", 0, lines, "stdout", 1.0) == []
    assert searched == [1000, 1000]
    # A batch with a match is then searched line by line, by the rule that matched only.
    searched.clear()
    lines[500] = "RuntimeError: CUDA out of memory"
    (firing,) = watch.lines("master", 0, lines, "stderr", 2.0)
    assert (
        firing.rule == rules[0] and "printed 'RuntimeError: CUDA out of memory'" in firing.message
    )
    assert searched == [1000, 1000] + [1] * 501  # the rule fired on line 501: it stops there


def test_metric_rules_ignore_lines_and_pattern_rules_ignore_metrics() -> None:
    watch = Watch([one_rule(kind="non-finite", action="stop"), one_rule(**OOM)], 0.0)
    assert watch.line("master", 0, "loss is nan", "stdout", 1.0) == []
    assert [f.rule.kind for f in watch.metric("master", 0, "loss", NAN, 1, 1.0)] == ["non-finite"]


# ---------------------------------------------------------------------------------------------
# throughput-drop


def throughput(
    watch: Watch, values: Sequence[float], role: str = "worker", index: int = 1
) -> list[Firing]:
    firings = []
    for step, value in enumerate(values):
        firings += watch.metric(role, index, "samples_per_sec", value, step, float(step))
    return firings


def test_a_drop_needs_five_values_before_it_may_fire() -> None:
    watch = Watch([one_rule(**DROP)], started_at=0.0)
    assert throughput(watch, [100, 100, 100, 100, 10]) == []


def test_a_drop_below_the_fraction_of_the_average_fires() -> None:
    watch = Watch([one_rule(**DROP)], started_at=0.0)
    assert throughput(watch, [100, 100, 100, 100, 100, 50]) == []  # exactly half: not below
    (firing,) = throughput(watch, [40])
    assert firing.message == (
        "samples_per_sec on worker-1 fell to 40, 43.6% of its recent average 91.7 "
        "(rule “samples_per_sec dropped below 50% of its average”: warn)"
    )
    assert firing.value == 40


def test_the_average_is_of_the_last_twenty_values() -> None:
    watch = Watch([one_rule(**DROP)], started_at=0.0)
    firings = throughput(watch, [1000] * 10 + [100] * 21)
    assert [f.value for f in firings] == [100]  # the step down itself, once; then re-armed
    # The mean of everything would be 390; of the last twenty values it is 100.
    assert throughput(watch, [60]) == []
    assert [f.value for f in throughput(watch, [40])] == [40]


def test_a_warning_re_arms_once_the_value_is_back_at_its_average() -> None:
    watch = Watch([one_rule(**DROP)], started_at=0.0)
    assert [f.value for f in throughput(watch, [100] * 5 + [40, 40])] == [40]
    assert throughput(watch, [100]) == []  # recovered to the average: armed again
    assert [f.value for f in throughput(watch, [30])] == [30]
    # Hovering just under the average is no recovery: no second warning for the same trouble.
    hovering = Watch([one_rule(**DROP)], started_at=0.0)
    assert [f.value for f in throughput(hovering, [100] * 5 + [40, 85, 30])] == [40]


def test_an_attempt_ending_drop_rule_does_not_re_arm() -> None:
    watch = Watch([one_rule(**{**DROP, "action": "stop"})], started_at=0.0)
    assert len(throughput(watch, [100] * 5 + [40, 100, 100, 30])) == 1


def test_each_instance_has_its_own_average_and_odd_values_are_skipped() -> None:
    watch = Watch([one_rule(**DROP)], started_at=0.0)
    throughput(watch, [100] * 5, role="worker", index=0)
    assert throughput(watch, [40] * 6, role="worker", index=1) == []  # its own pace
    assert throughput(watch, [NAN, INF], role="worker", index=0) == []
    assert len(throughput(watch, [40], role="worker", index=0)) == 1  # the average stayed 100
    zero = Watch([one_rule(**DROP)], started_at=0.0)
    assert throughput(zero, [0, 0, 0, 0, 0, -5]) == []  # no positive average, no drop


# ---------------------------------------------------------------------------------------------
# gpu-idle


GPU_IDLE = {"kind": "gpu-idle", "metric": "gpu_util", "below": 80, "minutes": 1, "action": "warn"}


def gpu(watch: Watch, samples: list[tuple[float, float]], index: int = 0) -> list[Firing]:
    firings = []
    for ts, value in samples:
        firings += watch.metric("worker", index, "gpu_util", value, None, ts)
    return firings


def test_gpu_idle_fires_only_after_the_full_duration() -> None:
    watch = Watch([one_rule(**GPU_IDLE)], started_at=0.0)
    assert gpu(watch, [(float(ts), 20.0) for ts in range(0, 60, 10)]) == []
    assert watch.tick(1000.0) == []  # judged on the samples, not on the clock
    (firing,) = gpu(watch, [(60.0, 20.0)])
    assert firing.message == (
        "gpu_util on worker-0 stayed below 80% for 60 s (average 20%; "
        "rule “gpu_util below 80% for 1 min”: warn)"
    )
    assert firing.value == 20.0


def test_a_busy_sample_breaks_the_idle_run() -> None:
    watch = Watch([one_rule(**GPU_IDLE)], started_at=0.0)
    assert gpu(watch, [(0.0, 10.0), (30.0, 30.0), (55.0, 80.0)]) == []  # 80 is not below 80
    assert gpu(watch, [(60.0, 10.0), (110.0, 10.0)]) == []
    (firing,) = gpu(watch, [(120.0, 40.0)])
    assert firing.value == pytest.approx(20.0)  # the run's own average, from 60 s on


def test_gpu_idle_re_arms_a_warning_after_the_gpu_was_busy_again() -> None:
    watch = Watch([one_rule(**GPU_IDLE)], started_at=0.0)
    samples = [(float(ts), 5.0) for ts in range(0, 80, 10)] + [(80.0, 95.0)]
    assert len(gpu(watch, samples)) == 1
    assert [f.value for f in gpu(watch, [(float(ts), 7.0) for ts in range(90, 160, 10)])] == [7.0]

    ending = Watch([one_rule(**{**GPU_IDLE, "action": "restart-exclude-node"})], started_at=0.0)
    samples += [(float(ts), 7.0) for ts in range(90, 160, 10)]
    assert [f.action for f in gpu(ending, samples)] == ["restart-exclude-node"]


def test_a_job_without_gpu_samples_never_fires_gpu_idle() -> None:
    watch = Watch([one_rule(**GPU_IDLE)], started_at=0.0, instances=[("worker", 0)])
    watch.metric("worker", 0, "cpu_percent", 3.0, None, 500.0)
    assert watch.tick(10_000.0) == []


def test_each_instance_has_its_own_idle_run() -> None:
    watch = Watch([one_rule(**GPU_IDLE)], started_at=0.0)
    gpu(watch, [(0.0, 10.0)], index=0)
    assert gpu(watch, [(60.0, 10.0)], index=1) == []
    assert [f.index for f in gpu(watch, [(60.0, 10.0)], index=0)] == [0]
