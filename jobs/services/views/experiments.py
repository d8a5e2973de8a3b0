"""An experiment as its page and the API show it (jobs/schemas.py ExperimentOut mirrors it):
its settings, its budget used and left, the best trial so far, and (detail) every trial with
its job, objective, hours, cost and samples per dollar."""

from collections import defaultdict
from typing import Any

from django.utils import timezone

from jobs.models import Experiment, JobAttempt, Trial
from jobs.services import figures
from jobs.services.experiments import budget
from jobs.services.views import training_report


def _iso(moment: Any) -> str | None:
    return moment.isoformat() if moment is not None else None


def best_trial(experiment: Experiment, trials: list[Trial]) -> dict[str, Any] | None:
    """The completed trial with the best objective (its last value), or None yet."""
    done = [t for t in trials if t.state == Trial.State.COMPLETED and t.objective_last is not None]
    if not done:
        return None
    maximize = experiment.objective_goal == Experiment.Goal.MAXIMIZE
    sign = 1.0 if maximize else -1.0
    best = max(done, key=lambda t: sign * float(t.objective_last or 0.0))
    return {
        "trial": best.number,
        "job": best.job_id,
        "value": best.objective_last,
        "params": best.params,
    }


def experiment_summary(experiment: Experiment) -> dict[str, Any]:
    trials = list(experiment.trials.all())
    return _summary(experiment, trials, budget.used_of(experiment))


def _summary(experiment: Experiment, trials: list[Trial], used: budget.Used) -> dict[str, Any]:
    return {
        "id": experiment.pk,
        "name": experiment.name,
        "owner": experiment.owner.get_username(),
        "state": experiment.state,
        "reason": experiment.reason,
        "created": _iso(experiment.created),
        "ended": _iso(experiment.ended),
        "space": experiment.space,
        "objective": {
            "metric": experiment.objective_metric,
            "goal": experiment.objective_goal,
            "unit": experiment.objective_unit,
        },
        "searcher": experiment.searcher,
        "pruner": experiment.pruner,
        "budget": {
            "trials": experiment.max_trials,
            "parallel": experiment.parallel_trials,
            "core_hours": experiment.max_core_hours,
            "gpu_hours": experiment.max_gpu_hours,
        },
        "used": {
            "trials": used.trials,
            "running": used.running,
            "core_hours": used.core_hours,
            "gpu_hours": used.gpu_hours,
        },
        "best": best_trial(experiment, trials),
    }


def _held_seconds(job_ids: list[int]) -> dict[int, float]:
    """Seconds each job's attempts held their packages (started to finished, or now)."""
    now = timezone.now()
    held: dict[int, float] = defaultdict(float)
    rows = (
        JobAttempt.objects.filter(job_id__in=job_ids, started__isnull=False)
        .order_by()
        .values_list("job_id", "started", "finished")
    )
    for job_id, started, finished in rows:
        assert started is not None  # filtered so
        held[job_id] += budget.attempt_hours(started, finished, now) * 3600.0
    return held


def trial_rows(trials: list[Trial]) -> list[dict[str, Any]]:
    job_ids = [t.job_id for t in trials if t.job_id is not None]
    held = _held_seconds(job_ids)
    throughput = training_report._throughput_of(job_ids)
    rows = []
    for trial in trials:
        job = trial.job
        seconds = held.get(trial.job_id, 0.0) if trial.job_id else 0.0
        price = float(job.price_per_hour) if job is not None else 0.0
        tp = throughput.get(trial.job_id) if trial.job_id else None
        rows.append(
            {
                "number": trial.number,
                "state": trial.state,
                "params": trial.params,
                "job": trial.job_id,
                "job_state": job.state if job is not None else None,
                "objective_last": trial.objective_last,
                "objective_best": trial.objective_best,
                "judged_through": trial.judged_through,
                "reason": trial.reason,
                "created": _iso(trial.created),
                "ended": _iso(trial.ended),
                "core_hours": seconds / 3600.0 * (job.cpu_total if job is not None else 0),
                "cost": figures.cost(price, seconds),
                "samples_per_dollar": (
                    figures.samples_per_dollar(tp.global_sps, price) if tp is not None else None
                ),
            }
        )
    return rows


def experiment_detail(experiment: Experiment) -> dict[str, Any]:
    trials = list(experiment.trials.select_related("job").order_by("number"))
    out = _summary(experiment, trials, budget.used_of(experiment))
    out["trials"] = trial_rows(trials)
    return out
