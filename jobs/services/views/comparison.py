"""Comparing runs: 2 to 8 jobs side by side, as the compare page, `GET /api/v1/compare` and
`trainyard compare` show them.

One answer for all three: the jobs' configuration as rows of text, one value per job, each row
marked where the values differ (decided here, so that the page and the CLI mark the same rows);
the figures the job page shows (training_report), plus each curve's final and best value; and
the metric names the jobs share, one chart each, with where to read every job's points.

Who sees what is the job page's rule (jobs.access): a job the viewer may not see is refused
like one that does not exist, and nothing of it is read. Variables are shown as the viewer sees
them (secret-looking values of another user's job masked), and whether a row differs is decided
on those shown values: a mask never tells whether two secrets are equal.
"""

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import AnonymousUser, User
from django.db.models import Prefetch
from django.urls import reverse

from jobs import logstream
from jobs.access import visible_jobs
from jobs.models import Job, JobRole
from jobs.money import format_price
from jobs.services import figures, retention
from jobs.services.views import durations, efficiency, training_report
from jobs.time_limit_text import in_words
from workers.metricparse import DECLARATIONS, is_system_metric

MIN_JOBS = 2
MAX_JOBS = 8

# Charted first, in this order, when every job has them (the job page's own charts); other
# names the jobs share follow in name order (see compared()).
CHART_FIRST = ("loss", "eval_accuracy", "lr", "samples_per_sec")
# The direction in which a curve gets better; curves not named here have no "best".
LOWER_IS_BETTER = frozenset({"loss"})
HIGHER_IS_BETTER = frozenset({"eval_accuracy"})

NOT_SET = "—"


class CompareError(Exception):
    """The request names no usable set of jobs: {"jobs": [message, ...]}. `status` is 404 when
    the only trouble is ids the viewer cannot see (or that do not exist), else 400."""

    def __init__(self, messages: list[str], status: int = 400) -> None:
        super().__init__(" ".join(messages))
        self.errors = {"jobs": messages}
        self.status = status


def parse_ids(raw: str | None) -> list[int]:
    """ "12,15,19" as [12, 15, 19], in the order given: 2 to 8 different job numbers."""
    parts = [p.strip() for p in (raw or "").split(",") if p.strip()]
    bad = [p for p in parts if not _job_number(p)]
    if bad:
        shown = ", ".join(repr(p[:20]) for p in bad[:3])
        raise CompareError([f"Job numbers are whole numbers, e.g. jobs=12,15; not {shown}."])
    ids = [int(p) for p in parts]
    if len(set(ids)) != len(ids):
        raise CompareError(["Name each job once."])
    if not MIN_JOBS <= len(ids) <= MAX_JOBS:
        raise CompareError([f"Pick {MIN_JOBS} to {MAX_JOBS} jobs to compare, not {len(ids)}."])
    return ids


def _job_number(text: str) -> bool:
    # Digits first and at most 19 of them: int() of thousands of digits raises, and a number
    # past 2**63 - 1 overflows the database driver.
    return text.isascii() and text.isdigit() and len(text) <= 19 and 0 < int(text) < 2**63


def jobs_for(viewer: User | AnonymousUser, ids: Sequence[int]) -> list[Job]:
    """The jobs, in the order asked, if the viewer may see every one (jobs.access)."""
    found = {
        job.pk: job
        for job in visible_jobs(viewer)
        .filter(pk__in=ids)
        .prefetch_related(Prefetch("roles", queryset=JobRole.objects.select_related("package")))
    }
    # The same words as a job page for another user's job: ids of others stay private.
    missing = [f"No such job: {pk}." for pk in ids if pk not in found]
    if missing:
        raise CompareError(missing, status=404)
    return [found[pk] for pk in ids]


# --- configuration ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    key: str  # stable, for pages and scripts: "program.args", "role.worker", "env.SEED"
    label: str  # what a reader sees: "Arguments", "worker", "SEED"
    group: str  # the rows' heading: "Job", "Program", "Roles", "Variables", "Policies"
    values: tuple[str, ...]  # one per job, in the jobs' order

    @property
    def differs(self) -> bool:
        return len(set(self.values)) > 1

    def as_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "label": self.label,
            "group": self.group,
            "values": list(self.values),
            "differs": self.differs,
        }


def differing(rows: Iterable[Row]) -> list[Row]:
    return [row for row in rows if row.differs]


def configuration_rows(jobs: Sequence[Job], viewer: User | AnonymousUser) -> list[Row]:
    """The jobs' configuration as rows of text, one value per job. A role, a variable or a
    kvstore mode that only some jobs have reads NOT_SET in the others."""

    def row(key: str, label: str, group: str, value_of: Any) -> Row:
        return Row(key, label, group, tuple(str(value_of(job)) for job in jobs))

    rows = [
        row("owner", "Owner", "Job", lambda j: j.owner.get_username()),
        row("state", "State", "Job", lambda j: j.state),
        row("image", "Image", "Program", lambda j: j.image.name),
        row("program.script", "Program", "Program", lambda j: j.script),
        row("program.args", "Arguments", "Program", lambda j: _args_text(j.args)),
        row("program.snapshot", "Code snapshot", "Program", _snapshot_text),
    ]
    if any(job.kvstore for job in jobs):
        rows.append(row("kvstore", "kvstore", "Program", lambda j: j.kvstore or NOT_SET))
    roles = {j.pk: {r.role: r for r in j.roles.all()} for j in jobs}
    for name in _role_order({role for by_role in roles.values() for role in by_role}):
        rows.append(
            row(f"role.{name}", name, "Roles", lambda j, n=name: _role_text(roles[j.pk].get(n)))
        )
    rows.append(row("totals", "Totals", "Roles", _totals_text))
    seen = {job.pk: job.env_seen_by(viewer) for job in jobs}
    for name in sorted({name for env in seen.values() for name in env}):
        rows.append(
            row(f"env.{name}", name, "Variables", lambda j, n=name: seen[j.pk].get(n, NOT_SET))
        )
    rows += [
        row("restart", "On failure", "Policies", _restart_text),
        row("time_limit", "Time limit", "Policies", _time_limit_text),
        row("health_rules", "Health rules", "Policies", lambda j: _rules_text(j.health_rules)),
        row(
            "metrics", "Metric patterns", "Policies", lambda j: _json_or_none(j.metric_definitions)
        ),
        row("log_limits", "Log limits", "Policies", _log_limits_text),
        row("retention", "Retention", "Policies", _retention_text),
        row("baseline", "Baseline", "Policies", _baseline_text),
    ]
    # What each used of what it held, as its page shows it (the cost figures, below, stay on
    # what was held).
    uses = {job.pk: efficiency.of_job(job) for job in jobs}
    rows += [
        row("use.cpu", "CPU efficiency", "Use", lambda j: _cpu_use_text(uses[j.pk])),
        row("use.memory", "Memory peak", "Use", lambda j: _memory_use_text(uses[j.pk])),
    ]
    return rows


def _cpu_use_text(use: efficiency.JobUse | None) -> str:
    if use is None:
        return "not measured"
    cores = "1 core" if use.cores_asked == 1 else f"{use.cores_asked} cores"
    return f"{use.cpu_efficiency * 100:.0f} % ({use.cores_used:.1f} of {cores} on average)"


def _memory_use_text(use: efficiency.JobUse | None) -> str:
    if use is None:
        return "not measured"
    return f"{use.memory_peak_gb:.1f} of {use.memory_asked_gb:g} GB"


def _args_text(args: Sequence[str]) -> str:
    # JSON quoting where a shell would need some, so that ["a b"] and ["a", "b"] differ.
    return " ".join(_quoted(a) for a in args) or "(none)"


def _quoted(arg: str) -> str:
    plain = arg and not any(c.isspace() or c in "\"'" for c in arg)
    return arg if plain else json.dumps(arg)


def _snapshot_text(job: Job) -> str:
    sha = job.program.get("snapshot")
    return str(sha) if sha else "(the console's code)"


ROLE_ORDER = ("scheduler", "master", "server", "worker")


def _role_order(names: Iterable[str]) -> list[str]:
    known = [r for r in ROLE_ORDER if r in names]
    return known + sorted(set(names) - set(ROLE_ORDER))


def _role_text(role: JobRole | None) -> str:
    return f"{role.package.name} × {role.instances}" if role is not None else NOT_SET


def _totals_text(job: Job) -> str:
    return (
        f"{job.cpu_total} CPU cores, {job.gpus_total} GPUs, {job.memory_gb_total} GB, "
        f"{format_price(job.price_per_hour)} per hour"
    )


def _time_limit_text(job: Job) -> str:
    return in_words(job.time_limit) if job.time_limit else "none"


def _restart_text(job: Job) -> str:
    if job.restart_policy != "on-failure":
        return "fail (no restart)"
    text = f"restart up to {job.max_restarts} times"
    if job.restart_backoff_seconds:
        text += f", {job.restart_backoff_seconds} s apart"
    if job.exclude_failed_node:
        text += ", away from the failed node"
    return text


def _rules_text(rules: list[dict[str, Any]]) -> str:
    """One line per rule: its kind, every parameter, and its action; 'none' without rules."""
    lines = []
    for rule in rules:
        params = " ".join(
            f"{key}={json.dumps(value, ensure_ascii=False)}"
            for key, value in sorted(rule.items())
            if key not in ("kind", "action")
        )
        lines.append(f"{rule.get('kind')} {params} → {rule.get('action')}".replace("  ", " "))
    return "\n".join(lines) or "none"


def _baseline_text(job: Job) -> str:
    return f"#{job.baseline_id}" if job.baseline_id else NOT_SET


def _json_or_none(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False) if value else "none"


def _log_limits_text(job: Job) -> str:
    return (
        f"{job.log_lines_per_second} lines/s, {job.metric_points_per_second} points/s, "
        f"{job.log_max_mb} MB"
    )


def _retention_text(job: Job) -> str:
    if job.keep:
        return "kept"
    days = retention.retention_days(job)
    return "forever" if days == 0 else f"{days} days after it ends"


# --- figures and curves ---------------------------------------------------------------------


def figures_of(viewer: User, job: Job, points: list[dict[str, Any]]) -> dict[str, Any]:
    """What the job page's figure cards show (training_report), the run's duration, and each
    compared curve's final and best value."""
    # Not the scaling table: the compare page does not show it, and it reads other runs' points.
    report = training_report.report(viewer, job, points=points, with_scaling=False)
    throughput = report["throughput"]
    against = report["baseline"]
    speedup = against["speedup"] if against else None
    finals = {}
    for name in sorted(n for n in {p["name"] for p in points} if compared(n)):
        finals[name] = {
            "final": figures.final_value(points, name),
            "best": _best(points, name),
        }
    return {
        "duration_seconds": durations.run_seconds(job),
        "cost": report["cost_so_far"],
        "price_per_hour": report["price_per_hour"],
        "global_sps": throughput["global_sps"] if throughput else None,
        "per_worker_sps": throughput["per_worker_sps"] if throughput else None,
        "samples_per_dollar": report["samples_per_dollar"],
        "baseline": against["id"] if against else None,
        "speedup": speedup["speedup"] if speedup else None,
        "global_speedup": speedup["global_speedup"] if speedup else None,
        "efficiency": speedup["efficiency"] if speedup else None,
        "progress": report["progress"]["fraction"] if report["progress"] else None,
        "curves": finals,
    }


def _best(points: Iterable[dict[str, Any]], name: str) -> float | None:
    """The best value of the curve (the mean over processes at each step or epoch), for the
    curves that have a direction; None for the others."""
    if name not in LOWER_IS_BETTER | HIGHER_IS_BETTER:
        return None
    points = list(points)
    axis = (
        "step" if any(p.get("step") is not None for p in figures.named(points, name)) else "epoch"
    )
    values = [y for _, y in figures.curve(points, name, axis)]
    if not values:
        return None
    return min(values) if name in LOWER_IS_BETTER else max(values)


def compared(name: str) -> bool:
    """Whether a metric is a curve of the training: the agent's samples (CPU, memory, GPU) say
    how a machine was used, and the declared totals are no curves."""
    return not is_system_metric(name) and name not in DECLARATIONS


def shared_charts(names_per_job: Sequence[set[str]]) -> list[str]:
    """The metric names every job has, one chart each: the job page's charts first."""
    shared = (
        {n for n in set.intersection(*names_per_job) if compared(n)} if names_per_job else set()
    )
    return [n for n in CHART_FIRST if n in shared] + sorted(shared - set(CHART_FIRST))


# --- the whole answer -----------------------------------------------------------------------


def compare(viewer: User, raw_ids: str | None) -> dict[str, Any]:
    """The comparison of the jobs named in `raw_ids` ("12,15,19"); CompareError if they are
    not 2 to 8 jobs the viewer may see."""
    jobs = jobs_for(viewer, parse_ids(raw_ids))
    points = {job.pk: logstream.metric_points(job.pk)[0] for job in jobs}
    names = [{p["name"] for p in points[job.pk]} for job in jobs]
    return {
        "jobs": [
            {
                "id": job.pk,
                "name": job.name,
                "state": job.state,
                # Where the compare page's "time since start" counts from, as the job page's.
                "started": job.started.isoformat() if job.started else None,
                "page": reverse("job_detail", args=[job.pk]),
                "metrics": reverse("api-v1:api_job_metrics", args=[job.pk]),
                "metric_names": sorted(job_names),
                "figures": figures_of(viewer, job, points[job.pk]),
            }
            for job, job_names in zip(jobs, names, strict=True)
        ],
        "charts": shared_charts(names),
        "rows": [row.as_dict() for row in configuration_rows(jobs, viewer)],
    }
