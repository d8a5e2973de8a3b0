"""Moving an experiment on: `advance` tells the searcher how ended trials did and asks it for
new ones while the budget allows; `judge` tells the pruner a running trial's new objective
values and stops the trial early when the pruner says so.

Both rebuild the Optuna study from its storage every time and hold the experiment's row
locked while they decide (SQLite: the write lock), so either may run twice, or at once in two
processes, and decide each thing once: a trial is told to Optuna with skip_if_finished, a
value already reported for a step is ignored by Optuna, and `Trial.judged_through` says what
was judged. Optuna's storage commits on its own, so a call that dies keeps what it told
Optuna and loses its own writes: an Optuna trial asked before its Trial row was written is
adopted by the next call as a waiting trial, and a trial Optuna ended whose row still runs is
caught up (`_catch_up`: stopped, if it was pruned), so no configuration and no decision is
lost.

Trials are ordinary jobs of the experiment's owner, submitted through the job submission's own
checks (quota, fair share, restarts, logs); a trial pruned is cancelled through the lifecycle's
cancel path with the pruner's reason.
"""

import logging
import math
from collections.abc import Iterable

import numpy as np
import optuna
from django.db import transaction
from django.utils import timezone
from optuna.trial import TrialState

from jobs.models import Experiment, Job, MetricPoint, Trial
from jobs.services.experiments import budget, reasons, space
from jobs.services.experiments import study as studies
from jobs.services.lifecycle import outcomes
from jobs.services.submission import ValidationFailed, check_job_request, submit_job

log = logging.getLogger(__name__)

# What a refusal of a trial's job may say for it to wait and be tried again (the user's quota
# is full, or the nodes cannot hold it now); any other refusal means the template no longer
# submits at all (its image was removed, say), and the experiment fails saying so.
REFUSALS_THAT_WAIT = {"quota", "roles"}


def _locked(experiment_id: int) -> Experiment | None:
    return Experiment.objects.select_for_update().filter(pk=experiment_id).first()


# --- advance ----------------------------------------------------------------------------------


def advance(experiment_id: int) -> None:
    with transaction.atomic():
        experiment = _locked(experiment_id)
        if experiment is None or not experiment.is_active:
            return
        study = studies.load(experiment, asked=experiment.trials.count())
        _adopt_asked(experiment, study)
        for trial in experiment.trials.filter(state=Trial.State.RUNNING).select_related("job"):
            _settle(experiment, study, trial)
        used = budget.used_of(experiment)
        spent = budget.hours_spent(experiment, used)
        if spent:
            end_trials(experiment, study, reasons.budget_spent(spent))
            end(experiment, Experiment.State.FINISHED, f"finished: {spent}")
            return
        if experiment.state == Experiment.State.RUNNING:
            _start_trials(experiment, study)
        _finish_if_done(experiment)


def _adopt_asked(experiment: Experiment, study: optuna.Study) -> None:
    """Optuna trials asked but never written as a Trial (the call died between): waiting."""
    known = set(experiment.trials.values_list("number", flat=True))
    for frozen in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if frozen.number not in known:
            Trial.objects.create(experiment=experiment, number=frozen.number, params=frozen.params)


def _start_trials(experiment: Experiment, study: optuna.Study) -> None:
    """Submit the waiting trials, then ask new ones, while the budget has room; stop at the
    first the quota refuses (the rest would wait behind it)."""
    for trial in experiment.trials.filter(state=Trial.State.WAITING):
        if not _submit(experiment, study, trial):
            return
    dimensions = space.dimensions_of(experiment.space)
    for _ in range(budget.new_trials_allowed(experiment, budget.used_of(experiment))):
        asked = study.ask(fixed_distributions=space.distributions(dimensions))
        trial = Trial.objects.create(
            experiment=experiment, number=asked.number, params=dict(asked.params)
        )
        if not _submit(experiment, study, trial):
            return
    if experiment.reason.startswith("trial ") and " waits: " in experiment.reason:
        _set_reason(experiment, "")


def _submit(experiment: Experiment, study: optuna.Study, trial: Trial) -> bool:
    """Submit the trial's job as the experiment's owner; False when it was refused."""
    request = space.apply(experiment.template, trial.params)
    request["name"] = space.trial_name(experiment.name, trial.number)
    try:
        job = submit_job(experiment.owner, check_job_request(request, owner=experiment.owner))
    except ValidationFailed as exc:
        refusal = "; ".join(m for messages in exc.errors.values() for m in messages)
        if set(exc.errors) <= REFUSALS_THAT_WAIT:
            _set_reason(experiment, reasons.waiting_for_quota(trial.number, refusal))
            return False
        _end_trial(study, trial, Trial.State.FAILED, f"its job was refused: {refusal}")
        end(
            experiment,
            Experiment.State.FAILED,
            f"a trial's job can no longer be submitted: {refusal}",
        )
        return False
    trial.job = job
    trial.state = Trial.State.RUNNING
    trial.save(update_fields=["job", "state"])
    return True


def _settle(experiment: Experiment, study: optuna.Study, trial: Trial) -> None:
    """A running trial whose job has ended: tell Optuna how it did."""
    job = trial.job
    if job is None:
        _end_trial(study, trial, Trial.State.FAILED, "its job was deleted")
        return
    if job.is_active:
        return
    if job.state != Job.State.SUCCEEDED:
        _end_trial(study, trial, Trial.State.FAILED, reasons.job_ended(job.state, job.reason))
        return
    if not job.log_archived:
        # Its last points may still be on their way to the database: a trial that ends right
        # after its last report would be judged without it, or found to have reported nothing.
        # The log keeper asks again once every line is in (experiment_requests.log_archived).
        return
    # The last values it reported are recorded, but a finished trial is not pruned.
    _judge(experiment, study, trial, prune=False)
    points = objective_points(experiment, job.pk)
    if not points:
        _end_trial(
            study, trial, Trial.State.FAILED, reasons.no_objective(experiment.objective_metric)
        )
        return
    _end_trial(study, trial, Trial.State.COMPLETED, "", value=points[-1][1])


def _end_trial(
    study: optuna.Study, trial: Trial, state: str, reason: str, value: float | None = None
) -> None:
    told = {
        Trial.State.COMPLETED: TrialState.COMPLETE,
        Trial.State.PRUNED: TrialState.PRUNED,
        Trial.State.FAILED: TrialState.FAIL,
    }[Trial.State(state)]
    study.tell(
        trial.number,
        value if told == TrialState.COMPLETE else None,
        state=told,
        skip_if_finished=True,
    )
    trial.state = state
    trial.reason = reason
    trial.ended = timezone.now()
    fields = ["state", "reason", "ended"]
    if value is not None:
        trial.objective_last = value
        fields.append("objective_last")
    trial.save(update_fields=fields)


def end_trials(experiment: Experiment, study: optuna.Study, reason: str) -> None:
    """End every waiting or running trial with `reason` (failed to Optuna), cancelling the
    jobs that still run: a stop by the user, a spent budget."""
    for trial in experiment.trials.filter(
        state__in=(Trial.State.WAITING, Trial.State.RUNNING)
    ).select_related("job"):
        if trial.job is not None and trial.job.is_active:
            outcomes.cancel_for(trial.job.pk, reason, strict=False)
        _end_trial(study, trial, Trial.State.FAILED, reason)


def _finish_if_done(experiment: Experiment) -> None:
    if experiment.state != Experiment.State.RUNNING:
        return
    used = budget.used_of(experiment)
    if used.running or used.trials < budget.trial_limit(experiment):
        return
    counts = {s: 0 for s in Trial.ENDED_STATES}
    for state in experiment.trials.values_list("state", flat=True):
        counts[Trial.State(state)] = counts.get(Trial.State(state), 0) + 1
    end(
        experiment,
        Experiment.State.FINISHED,
        f"finished: {used.trials} trials, {counts[Trial.State.COMPLETED]} completed, "
        f"{counts[Trial.State.PRUNED]} stopped early, {counts[Trial.State.FAILED]} failed",
    )


def end(experiment: Experiment, state: str, reason: str) -> None:
    experiment.state = state
    experiment.reason = reason
    experiment.ended = timezone.now()
    experiment.save(update_fields=["state", "reason", "ended"])


def _set_reason(experiment: Experiment, reason: str) -> None:
    if experiment.reason != reason:
        experiment.reason = reason
        experiment.save(update_fields=["reason"])


# --- judge ------------------------------------------------------------------------------------


def judge(job_id: int) -> None:
    """Tell the pruner what the trial that job `job_id` runs reported anew; stop it early when
    the pruner says so. Nothing for a job that is no trial, or a trial no longer running."""
    found = Trial.objects.filter(job_id=job_id).values_list("experiment_id", flat=True).first()
    if found is None:
        return
    with transaction.atomic():
        experiment = _locked(found)
        trial = Trial.objects.filter(job_id=job_id).select_related("job").first()
        if experiment is None or trial is None or trial.state != Trial.State.RUNNING:
            return
        if experiment.state not in (Experiment.State.RUNNING, Experiment.State.PAUSED):
            return
        _judge(experiment, studies.load(experiment), trial)


def objective_points(experiment: Experiment, job_id: int) -> list[tuple[int, float]]:
    """The job's objective, one value per epoch (or step), in order: the last reported for it.
    A point at a fraction of an epoch counts for the epoch it falls in (2.5 is in epoch 3)."""
    by_step = experiment.objective_unit == Experiment.Unit.STEP
    rows = (
        MetricPoint.objects.filter(job_id=job_id, name=experiment.objective_metric)
        .order_by("cursor")
        .values_list("step" if by_step else "epoch", "value")
    )
    found: dict[int, float] = {}
    for at, value in rows:
        if at is None:
            continue
        found[int(at) if by_step else math.ceil(at - 1e-9)] = value
    return sorted(found.items())


def _judge(experiment: Experiment, study: optuna.Study, trial: Trial, prune: bool = True) -> None:
    assert trial.job is not None
    points = [
        (at, value)
        for at, value in objective_points(experiment, trial.job.pk)
        if trial.judged_through is None or at > trial.judged_through
    ]
    if not points:
        return
    asked = optuna.trial.Trial(study, studies.trial_id(study, trial.number))
    frozen = study._storage.get_trial(asked._trial_id)
    if frozen.state != TrialState.RUNNING:
        _catch_up(experiment, study, trial, frozen, points, stop=prune)
        return
    last = declared_end(experiment, trial.job.pk)
    for at, value in points:
        asked.report(value, at)
        trial.objective_last = value
        trial.objective_best = _better(experiment, trial.objective_best, value)
        trial.judged_through = at
        # A trial that has reported its last epoch has nothing left to save: stopping it
        # would only cancel a job that is finishing, and lose its end.
        finishing = last is not None and at >= last
        if (
            prune
            and not finishing
            and experiment.pruner != Experiment.Pruner.NONE
            and asked.should_prune()
        ):
            trial.save(update_fields=["objective_last", "objective_best", "judged_through"])
            why = explain(experiment, study, trial.number, at, value)
            _end_trial(study, trial, Trial.State.PRUNED, why)
            outcomes.cancel_for(trial.job.pk, why, strict=False)
            return
    trial.save(update_fields=["objective_last", "objective_best", "judged_through"])


def _catch_up(
    experiment: Experiment,
    study: optuna.Study,
    trial: Trial,
    frozen: optuna.trial.FrozenTrial,
    points: list[tuple[int, float]],
    stop: bool,
) -> None:
    """Optuna has ended a trial whose row still runs: the call that told it died before its
    own transaction committed (Optuna's storage commits on its own). The row takes what the
    trial reported, and a trial Optuna pruned is stopped now, for the reason the pruner had,
    as that call would have stopped it; left running, it was never judged again (Optuna
    takes no report of an ended trial) and trained to its end."""
    assert trial.job is not None
    for at, value in points:
        trial.objective_last = value
        trial.objective_best = _better(experiment, trial.objective_best, value)
        trial.judged_through = at
    trial.save(update_fields=["objective_last", "objective_best", "judged_through"])
    told = sorted(frozen.intermediate_values.items())
    if stop and frozen.state == TrialState.PRUNED and told:
        at, value = told[-1]
        why = explain(experiment, study, trial.number, at, value)
        _end_trial(study, trial, Trial.State.PRUNED, why)
        outcomes.cancel_for(trial.job.pk, why, strict=False)


def declared_end(experiment: Experiment, job_id: int) -> float | None:
    """The last epoch (or step) the trainer said it will run (trainyard_metrics.declare), or
    None when it said nothing."""
    name = "total_steps" if experiment.objective_unit == Experiment.Unit.STEP else "total_epochs"
    return (
        MetricPoint.objects.filter(job_id=job_id, name=name)
        .order_by("-cursor")
        .values_list("value", flat=True)
        .first()
    )


def _better(experiment: Experiment, best: float | None, value: float) -> float:
    if best is None or math.isnan(best):
        return value
    if experiment.objective_goal == Experiment.Goal.MAXIMIZE:
        return max(best, value)
    return min(best, value)


def explain(experiment: Experiment, study: optuna.Study, number: int, at: int, value: float) -> str:
    """Why the pruner stopped trial `number` at `at`, in the figures it decided by."""
    metric, unit, goal = (
        experiment.objective_metric,
        experiment.objective_unit,
        experiment.objective_goal,
    )
    if math.isnan(value):
        return reasons.not_a_number(metric, unit, at)
    if experiment.pruner == Experiment.Pruner.MEDIAN:
        values = [
            t.intermediate_values[at]
            for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if at in t.intermediate_values
        ]
        if values:
            median = float(np.nanpercentile(np.array(values, dtype=float), 50))
            return reasons.below_median(metric, value, unit, at, median, len(values), goal)
    if experiment.pruner == Experiment.Pruner.SUCCESSIVE_HALVING:
        found = _rung_cutoff(experiment, study, number)
        if found is not None:
            cutoff, promoted, trials = found
            return reasons.below_rung(metric, value, unit, at, cutoff, promoted, trials, goal)
    return reasons.pruned(metric, value, unit, at)


def _rung_cutoff(
    experiment: Experiment, study: optuna.Study, number: int
) -> tuple[float, int, int] | None:
    """The cut-off of the rung the trial failed, how many trials there go on, of how many: as
    Optuna's successive halving decided (a rung's values are its trials' system attributes)."""
    trials = study.get_trials(deepcopy=False)
    mine = next((t for t in trials if t.number == number), None)
    if mine is None:
        return None
    rungs = [int(k.rsplit("_", 1)[1]) for k in mine.system_attrs if k.startswith("completed_rung_")]
    if not rungs:
        return None
    rung = max(rungs)
    key = f"completed_rung_{rung}"
    values: list[float] = sorted(t.system_attrs[key] for t in trials if key in t.system_attrs)
    reduction = int(experiment.pruner_options.get("reduction_factor", 3))
    promoted = max(1, len(values) // reduction)
    if experiment.objective_goal == Experiment.Goal.MAXIMIZE:
        cutoff = values[-promoted]
    else:
        cutoff = values[promoted - 1]
    return cutoff, promoted, len(values)


# --- the sweep --------------------------------------------------------------------------------


def active_experiment_ids() -> list[int]:
    return list(
        Experiment.objects.filter(state__in=Experiment.ACTIVE_STATES)
        .order_by("pk")
        .values_list("pk", flat=True)
    )


def running_trial_jobs(experiment_ids: Iterable[int]) -> list[int]:
    return list(
        Trial.objects.filter(
            experiment_id__in=list(experiment_ids),
            state=Trial.State.RUNNING,
            job__isnull=False,
        ).values_list("job_id", flat=True)
    )


def sweep() -> int:
    """Judge every running trial and advance every active experiment: whatever a lost hint
    (a task the console worker died holding) would have done. The number of experiments."""
    ids = active_experiment_ids()
    for job_id in running_trial_jobs(ids):
        judge(job_id)
    for experiment_id in ids:
        advance(experiment_id)
    return len(ids)
