"""The experiments' driver (jobs/services/experiments/driver.py) over the real database and a
real Optuna storage (a file of the test's own): trials submitted as the owner's jobs within the
quota and the budget, judged on the objective they report, stopped early with the pruner's
reason, told to Optuna when they end; every call safe to make twice."""

import optuna
import pytest
from django.contrib.auth.models import User
from django.db import transaction

from jobs.models import Experiment, Job, JobAttempt, Trial
from jobs.services.experiments import control, driver, reasons
from jobs.services.experiments import study as studies
from tests.conftest import set_quota
from tests.unit.experiment_helpers import end_job, report, search_request, search_storage
from tests.unit.helpers import SentTasks

__all__ = ["search_storage"]

pytestmark = pytest.mark.usefixtures("catalog", "code_root", "nodes", "search_storage")


def trials_of(experiment: Experiment) -> list[Trial]:
    return list(Trial.objects.filter(experiment=experiment).select_related("job"))


def optuna_states(experiment: Experiment) -> dict[int, str]:
    study = studies.load(experiment)
    return {t.number: t.state.name for t in study.get_trials(deepcopy=False)}


def test_it_submits_parallel_trials_as_the_owners_jobs(alice: User, sent_tasks: SentTasks) -> None:
    set_quota(alice, cpu=8, jobs=8)
    experiment = control.create_experiment(alice, search_request())
    driver.advance(experiment.pk)
    driver.advance(experiment.pk)  # twice: nothing more
    trials = trials_of(experiment)
    assert [t.number for t in trials] == [0, 1, 2]
    for trial in trials:
        assert trial.state == Trial.State.RUNNING
        job = trial.job
        assert job is not None and job.owner == alice
        assert job.name == f"digits-lr-bs #{trial.number}"
        args = job.args
        assert args[args.index("--lr") + 1] == repr(trial.params["--lr"])
        assert args[args.index("--batch-size") + 1] == str(trial.params["--batch-size"])
        assert args[:2] == ["--epochs", "9"]
    assert len({t.params["--lr"] for t in trials}) == 3, "each trial its own values"
    assert optuna_states(experiment) == {0: "RUNNING", 1: "RUNNING", 2: "RUNNING"}


def test_a_trial_the_quota_refuses_waits_and_is_submitted_later(
    alice: User, sent_tasks: SentTasks
) -> None:
    quota = set_quota(alice, cpu=8, jobs=2)
    experiment = control.create_experiment(alice, search_request())
    driver.advance(experiment.pk)
    trials = trials_of(experiment)
    assert [t.state for t in trials] == ["running", "running", "waiting"]
    experiment.refresh_from_db()
    assert experiment.reason.startswith("trial 2 waits: ")
    assert Job.objects.filter(owner=alice).count() == 2, "never past the quota"
    quota.running_jobs = 3
    quota.save()
    driver.advance(experiment.pk)
    assert [t.state for t in trials_of(experiment)] == ["running"] * 3
    experiment.refresh_from_db()
    assert experiment.reason == ""


# Successive halving's reason for the third of three trials at epoch 1 (0.9, 0.85, then 0.4).
THIRD_BEHIND_ITS_RUNG = (
    "stopped early: eval_accuracy 0.4 at epoch 1, below the cut-off 0.9: only the best 1 of 3 "
    "trials at epoch 1 go on"
)


def three_trials_the_third_behind_at_epoch_1(alice: User) -> tuple[Experiment, Trial, Trial]:
    """A search's first three trials at epoch 1: the first two judged (0.9, 0.85), the third's
    0.4 reported and not yet judged. The experiment, the first trial and the third."""
    set_quota(alice, cpu=8, jobs=8)
    experiment = control.create_experiment(alice, search_request())
    driver.advance(experiment.pk)
    first, second, third = trials_of(experiment)
    assert first.job and second.job and third.job
    for trial, value in ((first, 0.90), (second, 0.85)):
        assert trial.job is not None
        report(trial.job, 1, value)
        driver.judge(trial.job.pk)
    report(third.job, 1, 0.40)
    return experiment, first, third


def test_successive_halving_stops_a_trial_behind_its_rung_through_cancel(
    alice: User, sent_tasks: SentTasks
) -> None:
    experiment, first, third = three_trials_the_third_behind_at_epoch_1(alice)
    assert third.job is not None
    driver.judge(third.job.pk)
    driver.judge(third.job.pk)  # twice: decided once
    third.refresh_from_db()
    assert third.state == Trial.State.PRUNED
    assert third.reason == THIRD_BEHIND_ITS_RUNG
    assert (third.objective_last, third.objective_best, third.judged_through) == (0.4, 0.4, 1)
    job = Job.objects.get(pk=third.job.pk)
    assert job.state == Job.State.CANCELLED and job.reason == third.reason
    assert optuna_states(experiment)[2] == "PRUNED"
    first.refresh_from_db()
    assert first.state == Trial.State.RUNNING and first.judged_through == 1


class Killed(Exception):
    """The console worker dying inside a call, before its transaction commits."""


def test_a_stop_whose_commit_was_lost_is_made_by_the_next_judgement(
    alice: User, sent_tasks: SentTasks
) -> None:
    """Optuna's storage commits on its own: a kill after the pruner said "stop" and before the
    console's commit leaves Optuna with the trial pruned and its row running (CI saw that
    trial train to its end, "completed" with nothing judged)."""
    experiment, _, third = three_trials_the_third_behind_at_epoch_1(alice)
    assert third.job is not None
    with pytest.raises(Killed), transaction.atomic():
        driver.judge(third.job.pk)
        raise Killed
    third.refresh_from_db()
    assert third.state == Trial.State.RUNNING and third.judged_through is None
    assert Job.objects.get(pk=third.job.pk).is_active
    assert optuna_states(experiment)[2] == "PRUNED", "what the lost call told Optuna stays"

    report(third.job, 2, 0.45)  # it trained on; its next point brings the next judgement
    driver.judge(third.job.pk)
    third.refresh_from_db()
    assert third.state == Trial.State.PRUNED
    assert third.reason == THIRD_BEHIND_ITS_RUNG
    assert (third.objective_last, third.objective_best, third.judged_through) == (0.45, 0.45, 2)
    job = Job.objects.get(pk=third.job.pk)
    assert job.state == Job.State.CANCELLED and job.reason == third.reason


def test_an_end_whose_commit_was_lost_is_settled_again_with_its_points(
    alice: User, sent_tasks: SentTasks
) -> None:
    set_quota(alice, cpu=8, jobs=8)
    experiment = control.create_experiment(
        alice,
        search_request(pruner="none", pruner_options=None, budget={"trials": 1, "parallel": 1}),
    )
    driver.advance(experiment.pk)
    (trial,) = trials_of(experiment)
    assert trial.job is not None
    report(trial.job, 1, 0.7)
    report(trial.job, 2, 0.8)
    end_job(trial.job)
    with pytest.raises(Killed), transaction.atomic():
        driver.advance(experiment.pk)
        raise Killed
    trial.refresh_from_db()
    assert trial.state == Trial.State.RUNNING and optuna_states(experiment) == {0: "COMPLETE"}
    driver.advance(experiment.pk)
    trial.refresh_from_db()
    assert (trial.state, trial.objective_last, trial.judged_through) == ("completed", 0.8, 2)
    experiment.refresh_from_db()
    assert experiment.state == Experiment.State.FINISHED
    assert studies.load(experiment).best_value == 0.8


def test_a_resumed_trial_is_judged_only_on_epochs_it_reports_anew(
    alice: User, sent_tasks: SentTasks
) -> None:
    set_quota(alice, cpu=8, jobs=8)
    experiment = control.create_experiment(
        alice, search_request(pruner="none", pruner_options=None)
    )
    driver.advance(experiment.pk)
    trial = trials_of(experiment)[0]
    assert trial.job is not None
    report(trial.job, 1, 0.5)
    report(trial.job, 2, 0.6)
    driver.judge(trial.job.pk)
    # The next attempt resumes from the checkpoint of epoch 1 and reports epoch 2 again.
    report(trial.job, 2, 0.1)
    report(trial.job, 3, 0.7)
    driver.judge(trial.job.pk)
    trial.refresh_from_db()
    assert trial.judged_through == 3
    frozen = studies.load(experiment).get_trials()[0]
    assert frozen.intermediate_values == {1: 0.5, 2: 0.6, 3: 0.7}


def test_ended_trials_are_told_and_the_search_goes_on_to_its_end(
    alice: User, sent_tasks: SentTasks
) -> None:
    set_quota(alice, cpu=8, jobs=8)
    experiment = control.create_experiment(
        alice,
        search_request(pruner="none", pruner_options=None, budget={"trials": 4, "parallel": 2}),
    )
    driver.advance(experiment.pk)
    first, second = trials_of(experiment)
    assert first.job and second.job
    report(first.job, 1, 0.7)
    report(first.job, 2, 0.8)
    end_job(first.job)
    end_job(second.job, Job.State.FAILED, "master on node-1: exit code 1")
    driver.advance(experiment.pk)
    driver.advance(experiment.pk)
    first.refresh_from_db()
    second.refresh_from_db()
    assert (first.state, first.objective_last) == (Trial.State.COMPLETED, 0.8)
    assert second.state == Trial.State.FAILED
    assert second.reason == "its job failed: master on node-1: exit code 1"
    states = optuna_states(experiment)
    assert (states[0], states[1], states[2], states[3]) == (
        "COMPLETE",
        "FAIL",
        "RUNNING",
        "RUNNING",
    )
    assert studies.load(experiment).best_value == 0.8
    for trial in trials_of(experiment)[2:]:
        assert trial.job is not None
        end_job(trial.job)  # succeeded, but never reported the objective
    driver.advance(experiment.pk)
    experiment.refresh_from_db()
    assert experiment.state == Experiment.State.FINISHED
    assert experiment.reason == "finished: 4 trials, 1 completed, 0 stopped early, 3 failed"
    assert trials_of(experiment)[3].reason == reasons.no_objective("eval_accuracy")


def test_a_succeeded_trial_is_told_only_once_its_last_points_are_archived(
    alice: User, sent_tasks: SentTasks
) -> None:
    """Its end can reach the console before its last report reaches the database: told then,
    it was "never reported eval_accuracy" (or judged on an earlier epoch)."""
    set_quota(alice, cpu=8, jobs=8)
    experiment = control.create_experiment(
        alice,
        search_request(pruner="none", pruner_options=None, budget={"trials": 1, "parallel": 1}),
    )
    driver.advance(experiment.pk)
    (trial,) = trials_of(experiment)
    assert trial.job is not None
    report(trial.job, 1, 0.7)
    end_job(trial.job, archived=False)
    driver.advance(experiment.pk)
    trial.refresh_from_db()
    assert trial.state == Trial.State.RUNNING and optuna_states(experiment) == {0: "RUNNING"}
    report(trial.job, 2, 0.9)  # the last point, archived with the rest of its log
    Job.objects.filter(pk=trial.job.pk).update(log_archived=True)
    driver.advance(experiment.pk)
    trial.refresh_from_db()
    assert (trial.state, trial.objective_last) == (Trial.State.COMPLETED, 0.9)
    assert studies.load(experiment).best_value == 0.9


def test_an_asked_trial_whose_row_was_never_written_is_adopted(
    alice: User, sent_tasks: SentTasks
) -> None:
    set_quota(alice, cpu=8, jobs=8)
    experiment = control.create_experiment(
        alice, search_request(budget={"trials": 2, "parallel": 2})
    )
    study = studies.load(experiment)
    lost = study.ask(
        {"--lr": optuna.distributions.FloatDistribution(0.01, 1, log=True),
         "--batch-size": optuna.distributions.IntDistribution(16, 128, log=True)}
    )  # fmt: skip
    driver.advance(experiment.pk)
    trials = trials_of(experiment)
    assert [t.number for t in trials] == [0, 1]
    assert trials[0].params == lost.params
    assert all(t.state == Trial.State.RUNNING for t in trials)


def test_a_spent_core_hour_budget_stops_the_running_trials(
    alice: User, sent_tasks: SentTasks
) -> None:
    set_quota(alice, cpu=8, jobs=8)
    experiment = control.create_experiment(
        alice, search_request(budget={"trials": 6, "parallel": 2, "core_hours": 0.5})
    )
    driver.advance(experiment.pk)
    first = trials_of(experiment)[0]
    assert first.job is not None
    from datetime import timedelta

    from django.utils import timezone

    JobAttempt.objects.filter(job=first.job).update(started=timezone.now() - timedelta(hours=1))
    driver.advance(experiment.pk)
    experiment.refresh_from_db()
    assert experiment.state == Experiment.State.FINISHED
    assert experiment.reason == "finished: its budget of 0.5 core-hours is spent"
    for trial in trials_of(experiment):
        assert trial.state == Trial.State.FAILED
        assert trial.reason == "experiment stopped: its budget of 0.5 core-hours is spent"
        assert trial.job is not None and trial.job.state == Job.State.CANCELLED


def test_the_median_pruner_says_the_median_it_stopped_a_trial_below(
    alice: User, sent_tasks: SentTasks
) -> None:
    set_quota(alice, cpu=8, jobs=8)
    experiment = control.create_experiment(
        alice,
        search_request(
            pruner="median",
            pruner_options={"n_startup_trials": 2, "n_warmup_steps": 0},
            budget={"trials": 4, "parallel": 2},
        ),
    )
    driver.advance(experiment.pk)
    for trial, value in zip(trials_of(experiment), (0.9, 0.8), strict=True):
        assert trial.job is not None
        report(trial.job, 1, value)
        end_job(trial.job)
    driver.advance(experiment.pk)
    third = trials_of(experiment)[2]
    assert third.job is not None
    report(third.job, 1, 0.5)
    driver.judge(third.job.pk)
    third.refresh_from_db()
    assert third.state == Trial.State.PRUNED
    assert third.reason == (
        "stopped early: eval_accuracy 0.5 at epoch 1, below the median 0.85 of 2 trials"
    )


def test_a_trial_at_its_declared_last_epoch_is_not_stopped(
    alice: User, sent_tasks: SentTasks
) -> None:
    set_quota(alice, cpu=8, jobs=8)
    experiment = control.create_experiment(
        alice, search_request(pruner_options={"min_resource": 1, "reduction_factor": 3})
    )
    driver.advance(experiment.pk)
    first, second, _ = trials_of(experiment)
    assert first.job and second.job
    report(first.job, 1, 0.9)
    driver.judge(first.job.pk)
    report(second.job, 0, 1.0, name="total_epochs")  # it runs 1 epoch in all
    report(second.job, 1, 0.2)
    driver.judge(second.job.pk)
    second.refresh_from_db()
    assert second.state == Trial.State.RUNNING and second.judged_through == 1
    assert Job.objects.get(pk=second.job.pk).is_active
