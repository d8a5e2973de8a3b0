"""Everything the job page and `GET /api/v1/jobs/ID/metrics/summary` show about a run's
training: throughput, speedup against its baseline, cost, samples per dollar, the curve verdict,
progress, GPU health, and how throughput scaled over the runs of the same program."""

import time
from typing import Any

from django.contrib.auth.models import User
from django.db.models import prefetch_related_objects

from jobs import logstream
from jobs.access import visible_jobs
from jobs.models import Job, MetricPoint
from jobs.services import baselines, figures
from workers.metricparse import is_system_metric

# Runs of the same program compared in the scaling table, newest first.
SCALING_RUNS = 20


def elapsed_seconds(job: Job, now: float | None = None) -> float:
    if job.started is None:
        return 0.0
    end = job.finished.timestamp() if job.finished else (now or time.time())
    return max(0.0, end - job.started.timestamp())


def _throughput_of(job_ids: list[int]) -> dict[int, figures.Throughput]:
    points: dict[int, list[dict[str, Any]]] = {}
    rows = MetricPoint.objects.filter(job_id__in=job_ids, name="samples_per_sec").values(
        "job_id", "name", "value", "role", "index"
    )
    for row in rows:
        points.setdefault(row["job_id"], []).append(dict(row))
    found = {}
    for job_id, job_points in points.items():
        tp = figures.throughput(job_points)
        if tp is not None:
            found[job_id] = tp
    return found


def report(
    user: User,
    job: Job,
    points: list[dict[str, Any]] | None = None,
    with_scaling: bool = True,
) -> dict[str, Any]:
    """`points`, the job's metric points where the caller has read them already.
    `with_scaling=False` leaves out the scaling table ("scaling": None), which reads the metric
    points of the user's other runs of the program: for callers that do not show it."""
    if points is None:
        points, _ = logstream.metric_points(job.pk)
    now = time.time()
    elapsed = elapsed_seconds(job, now)
    price = float(job.price_per_hour)
    tp = figures.throughput(points)
    slow_gpus = figures.low_gpu_utilisation(points, now)
    out: dict[str, Any] = {
        "workers": baselines.worker_count(job),
        "elapsed_seconds": elapsed,
        "price_per_hour": price,
        "cost_so_far": figures.cost(price, elapsed),
        "throughput": None,
        "samples_per_dollar": None,
        "gpu": "none" if job.gpus_total == 0 else "present",
        "low_gpu_utilisation": slow_gpus,
        "low_gpu_warning": figures.low_gpu_warning(slow_gpus),
        # Whether the trainer has reported anything yet (the agent's own samples aside): the
        # page shows no figure until it has.
        "reported": any(not is_system_metric(p["name"]) for p in points),
        "progress": None,
        "baseline": None,
        "scaling": _scaling(user, job) if with_scaling else None,
    }
    if tp is not None:
        out["throughput"] = {
            "global_sps": tp.global_sps,
            "per_worker_sps": tp.per_worker_sps,
            "workers_reporting": tp.workers,
        }
        out["samples_per_dollar"] = figures.samples_per_dollar(tp.global_sps, price)
    progress = figures.progress(points, succeeded=job.state == Job.State.SUCCEEDED)
    if progress is not None:
        out["progress"] = {
            "fraction": progress.fraction,
            "eta_seconds": progress.eta_seconds if job.is_active else None,
            "by": progress.by,
            "reached": progress.reached,
            "total": progress.total,
            "done": progress.done,
        }
    if job.baseline_id is not None:
        out["baseline"] = _against_baseline(job, points, tp)
    return out


def _against_baseline(
    job: Job, points: list[dict[str, Any]], tp: figures.Throughput | None
) -> dict[str, Any]:
    baseline = job.baseline
    assert baseline is not None
    base_points, _ = logstream.metric_points(baseline.pk)
    result: dict[str, Any] = {
        "id": baseline.pk,
        "name": baseline.name,
        "verdict": figures.compare_with_baseline(
            points,
            base_points,
            different=baselines.curves_differ_by_design(job, baseline),
            starts=_starts(job, baseline),
        ).as_dict(),
        "speedup": None,
        "why_no_speedup": baselines.why_not_a_speedup_baseline(job, baseline),
    }
    base_tp = figures.throughput(base_points)
    if tp is None or base_tp is None:
        result["why_no_speedup"] = result["why_no_speedup"] or "no samples_per_sec reported yet"
    if result["why_no_speedup"] is None and tp is not None and base_tp is not None:
        sc = figures.scaling(tp, base_tp)
        own = figures.samples_per_dollar(tp.global_sps, float(job.price_per_hour))
        theirs = figures.samples_per_dollar(base_tp.global_sps, float(baseline.price_per_hour))
        result["speedup"] = {
            "baseline_sps": base_tp.global_sps,
            "speedup": sc.speedup,
            "global_speedup": sc.global_speedup,
            "efficiency": sc.efficiency,
            "samples_per_dollar_ratio": own / theirs if own and theirs else None,
        }
    return result


def _starts(job: Job, baseline: Job) -> figures.Starts | None:
    if job.started is None or baseline.started is None:
        return None
    return figures.Starts(job.started.timestamp(), baseline.started.timestamp())


def _scaling(user: User, job: Job) -> dict[str, Any]:
    """How global throughput changed with the trainer count over the user's runs of the same
    program (same image, script and package), with a hint on how many trainers to use."""
    # Roles fetched in two queries, not two per candidate: this runs on every page refresh.
    prefetch_related_objects([job], "roles")
    candidates = [
        other
        for other in visible_jobs(user)
        .filter(image_id=job.image_id, owner_id=job.owner_id)
        .exclude(state__in=[Job.State.FAILED, Job.State.CANCELLED])
        .prefetch_related("roles")
        .order_by("-created")[: SCALING_RUNS * 3]
        if other.pk == job.pk or baselines.same_program(job, other)
    ][:SCALING_RUNS]
    measured = _throughput_of([c.pk for c in candidates])
    runs = [(c.pk, measured[c.pk], float(c.price_per_hour)) for c in candidates if c.pk in measured]
    singles = [tp for _, tp, _ in runs if tp.workers == 1]
    single = max(singles, key=lambda t: t.global_sps) if singles else None
    rows, hint = figures.scaling_rows(runs, single)
    return {
        "rows": [row.__dict__ for row in rows],
        "hint": hint,
        "has_single_worker_run": single is not None,
    }
