"""restarts.decide, the one place that says what follows an attempt's end, for every cause:
restart within the budget (counted or not, avoiding a node or not), or fail with the reason."""

import pytest

from jobs.models import Job, RestartPolicy
from jobs.services.lifecycle.restarts import Cause, Decision, decide

COUNTED = [Cause.INSTANCE_FAILED, Cause.RULE_RESTART, Cause.RULE_RESTART_AWAY]
NOT_COUNTED = [Cause.EVICTION, Cause.PREEMPTION]


def job(policy: str = RestartPolicy.ON_FAILURE, left: int = 1, exclude: bool = False) -> Job:
    return Job(
        restart_policy=policy, max_restarts=3, restarts_used=3 - left, exclude_failed_node=exclude
    )


@pytest.mark.parametrize("cause", COUNTED)
def test_it_restarts_a_counted_cause_while_the_budget_lasts(cause: Cause) -> None:
    decision = decide(job(left=1), cause, "why", "node-1")
    assert decision.restart and decision.counts and decision.why == "why"


@pytest.mark.parametrize("cause", COUNTED)
def test_it_fails_a_counted_cause_once_the_budget_is_spent(cause: Cause) -> None:
    assert decide(job(left=0), cause, "why", "node-1") == Decision(False, "why")


@pytest.mark.parametrize("cause", NOT_COUNTED)
def test_it_restarts_an_eviction_or_preemption_even_with_the_budget_spent(cause: Cause) -> None:
    assert decide(job(left=0), cause, "node-1 drained", "node-1") == Decision(
        True, "node-1 drained", counts=False
    )


@pytest.mark.parametrize("cause", COUNTED)
def test_it_never_restarts_under_the_never_policy(cause: Cause) -> None:
    assert decide(job(RestartPolicy.NEVER), cause, "why", "node-1") == Decision(False, "why")


def test_it_says_the_policy_when_a_never_job_loses_its_nodes() -> None:
    decision = decide(job(RestartPolicy.NEVER), Cause.EVICTION, "node-1 drained")
    assert not decision.restart
    assert decision.why == "node-1 drained; its restart policy is never"


def test_a_preempted_job_goes_back_to_the_queue_even_under_the_never_policy() -> None:
    # Not its failure: the platform stopped it for a more urgent job and owes it its turn.
    why = "preempted by job 7 (high) of bob"
    assert decide(job(RestartPolicy.NEVER), Cause.PREEMPTION, why) == Decision(
        True, why, counts=False
    )


def test_a_stop_rule_fails_the_job_whatever_the_budget() -> None:
    assert decide(job(left=3), Cause.RULE_STOP, "why", "node-1") == Decision(False, "why")


def test_a_failed_instance_avoids_its_node_only_when_the_job_asks() -> None:
    assert decide(job(), Cause.INSTANCE_FAILED, "why", "node-1").exclude == ()
    asked = decide(job(exclude=True), Cause.INSTANCE_FAILED, "why", "node-1")
    assert asked.exclude == ("node-1",)


def test_a_restart_exclude_node_rule_avoids_the_node_and_a_restart_rule_does_not() -> None:
    assert decide(job(), Cause.RULE_RESTART_AWAY, "why", "node-1").exclude == ("node-1",)
    assert decide(job(exclude=True), Cause.RULE_RESTART, "why", "node-1").exclude == ()


@pytest.mark.parametrize("cause", [Cause.EVICTION, Cause.INSTANCE_FAILED, Cause.RULE_RESTART_AWAY])
def test_nothing_is_avoided_where_no_node_is_known(cause: Cause) -> None:
    assert decide(job(exclude=True), cause, "why", "").exclude == ()


def test_an_eviction_never_excludes_the_drained_node_itself() -> None:
    # The drain already keeps new work away; excluding would outlive the drain.
    assert decide(job(exclude=True), Cause.EVICTION, "why", "node-1").exclude == ()
