"""Fair share, borrowing and reclaim as pure policy: decay, share ratios, the order of waiting
jobs, what a group may borrow, and which borrowed jobs give capacity back."""

import math
from datetime import UTC, datetime, timedelta

import pytest

from jobs.services import placement
from jobs.services.placement import Demand, Holding, Room
from jobs.services.scheduler import borrowing, fairshare, reclaim
from jobs.services.scheduler.fairshare import Resources, Tenancy, UsageRecord

NOW = datetime(2026, 1, 2, 12, 0, tzinfo=UTC)
HOUR = 3600.0


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


def test_an_interval_that_ends_now_weighs_its_length_when_young() -> None:
    # A minute held just now barely decays under a one-hour half-life.
    assert fairshare.decayed_weight(ago(60), NOW, NOW, HOUR) == pytest.approx(60, rel=0.01)


def test_usage_one_half_life_old_counts_half() -> None:
    recent = fairshare.decayed_weight(ago(60), NOW, NOW, HOUR)
    old = fairshare.decayed_weight(ago(HOUR + 60), ago(HOUR), NOW, HOUR)
    assert old == pytest.approx(recent / 2, rel=0.01)


def test_yesterdays_burst_is_forgiven() -> None:
    burst = [UsageRecord(ago(25 * HOUR), ago(24 * HOUR), Resources(cpu=100))]
    steady = [UsageRecord(ago(HOUR), None, Resources(cpu=10))]
    half_life = 2 * HOUR
    assert (
        fairshare.decayed_usage(burst, NOW, half_life).cpu
        < fairshare.decayed_usage(steady, NOW, half_life).cpu
    )


def test_a_share_held_without_pause_has_a_ratio_of_one() -> None:
    forever = [UsageRecord(ago(100 * HOUR), None, Resources(cpu=8, memory_gb=32))]
    usage = fairshare.decayed_usage(forever, NOW, HOUR)
    assert fairshare.share_ratio(usage, Resources(cpu=8, memory_gb=64), HOUR) == pytest.approx(
        1.0, rel=1e-3
    )  # the dominant resource (CPU: all of it) decides, not memory (half)


def test_a_resource_the_share_gives_none_of_does_not_count() -> None:
    usage = Resources(cpu=HOUR / math.log(2), gpus=5)
    assert fairshare.share_ratio(usage, Resources(cpu=2), HOUR) == pytest.approx(0.5)
    assert fairshare.share_ratio(usage, Resources(), HOUR) == 0.0


def test_the_group_furthest_below_its_share_goes_first_then_the_user() -> None:
    team_a = Tenancy("group:a", Resources(cpu=8), (1, 2))
    team_b = Tenancy("group:b", Resources(cpu=8), (3,))
    tenancies = {1: team_a, 2: team_a, 3: team_b}
    held = Resources(cpu=HOUR)  # some usage each
    usage = {1: held.scaled(3), 2: held, 3: held.scaled(2)}
    ratios = fairshare.ratios(tenancies, usage, HOUR)
    # Group a used 4 units, group b 2 (same share): b first; within a, user 2 (1) before 1 (3).
    jobs = [(10, 1, ago(30)), (11, 2, ago(20)), (12, 3, ago(10))]
    order = sorted(jobs, key=lambda j: fairshare.sort_key(*ratios[j[1]], j[2], j[0]))
    assert [j[0] for j in order] == [12, 11, 10]


def test_equal_shares_and_usage_leave_first_come_first_served() -> None:
    keys = [fairshare.sort_key(0.5, 0.5, ago(s), i) for i, s in ((2, 10), (1, 30), (3, 20))]
    assert [k[3] for k in sorted(keys)] == [1, 3, 2]


def share(used: int = 0, nominal: int = 8, borrow: int = 0, group: str = "a") -> borrowing.Share:
    return borrowing.Share(
        group,
        borrowing.need_of(nominal, 0, 64),
        borrowing.need_of(borrow, 0, 0),
        borrowing.need_of(used, 0, 0),
    )


def test_a_job_within_the_nominal_share_lends_and_does_not_borrow() -> None:
    verdict = borrowing.judge([share(used=4)], borrowing.need_of(4, 0, 1))
    assert verdict == borrowing.Verdict(None, False, "a")


def test_a_job_beyond_the_nominal_share_borrows_up_to_the_limit() -> None:
    verdict = borrowing.judge([share(used=6, borrow=4)], borrowing.need_of(4, 0, 1))
    assert verdict == borrowing.Verdict(None, True, None)


def test_a_group_over_its_borrowing_limit_waits_and_says_why() -> None:
    verdict = borrowing.judge([share(used=10, borrow=4)], borrowing.need_of(4, 0, 1))
    assert verdict.wait == (
        "waiting: group a runs 10 CPU cores of its 12 (nominal 8 + borrowing 4); "
        "this job needs 4 more"
    )
    none = borrowing.judge([share(used=8)], borrowing.need_of(1, 0, 1))
    assert none.wait is not None and "(nominal 8, no borrowing)" in none.wait


def test_a_user_in_no_group_neither_borrows_nor_lends() -> None:
    assert borrowing.judge([], borrowing.need_of(100, 0, 1)) == borrowing.Verdict(None, False, None)


def borrower(
    job_id: int, started_ago: float, node: str, cpu: int, preempted: int = 0
) -> reclaim.Borrower:
    return reclaim.Borrower(
        job_id, ago(started_ago), (Holding(job_id, node, cpu, 0, 4),), times_preempted=preempted
    )


def demands(*cpus: int) -> list[Demand]:
    return [Demand(("worker", i), cpu, 0, 1) for i, cpu in enumerate(cpus)]


def test_reclaim_stops_the_fewest_borrowed_jobs_the_lender_needs() -> None:
    rooms = [Room("n1", 0, 0, 32), Room("n2", 0, 0, 32)]
    jobs = [borrower(1, 50, "n1", 2), borrower(2, 40, "n1", 2), borrower(3, 30, "n2", 4)]
    chosen = reclaim.choose(demands(4), rooms, jobs, NOW, 0)
    assert chosen is not None and [b.job_id for b in chosen] == [3]  # one, not two


def test_reclaim_takes_the_most_recently_started_among_equals() -> None:
    rooms = [Room("n1", 0, 0, 32)]
    jobs = [borrower(1, 50, "n1", 2), borrower(2, 10, "n1", 2), borrower(3, 30, "n1", 2)]
    chosen = reclaim.choose(demands(2), rooms, jobs, NOW, 0)
    assert chosen is not None and [b.job_id for b in chosen] == [2]


def test_reclaim_stops_nothing_when_the_lender_fits_and_none_when_it_cannot_help() -> None:
    assert (
        reclaim.choose(demands(2), [Room("n1", 4, 0, 32)], [borrower(1, 5, "n1", 4)], NOW, 0) == []
    )
    assert (
        reclaim.choose(demands(8), [Room("n1", 0, 0, 32)], [borrower(1, 5, "n1", 4)], NOW, 0)
        is None
    )


def test_a_job_reclaimed_before_runs_its_minimum_time_first() -> None:
    rooms = [Room("n1", 0, 0, 32)]
    again = [borrower(1, 30, "n1", 4, preempted=1)]
    assert reclaim.choose(demands(4), rooms, again, NOW, 60) is None
    assert reclaim.choose(demands(4), rooms, again, NOW, 20) == again


def test_reclaim_takes_whole_jobs_and_no_superfluous_one() -> None:
    # Job 1 holds 2 cores on each node; the lender needs 4 on one node.
    spread = reclaim.Borrower(1, ago(5), (Holding(1, "n1", 2, 0, 1), Holding(1, "n2", 2, 0, 1)))
    rooms = [Room("n1", 2, 0, 32), Room("n2", 0, 0, 32)]
    chosen = reclaim.choose(demands(4), rooms, [spread, borrower(2, 1, "n2", 2)], NOW, 0)
    assert chosen is not None and [b.job_id for b in chosen] == [1]


def test_the_room_reserved_for_a_lender_is_taken_from_the_rest_of_the_pass() -> None:
    rooms = [Room("n1", 0, 0, 32), Room("n2", 2, 0, 32)]
    placement.reserve(demands(4), rooms, [Holding(7, "n1", 4, 0, 4)])
    assert rooms[0].cpu == -4  # nothing else fits on n1 while job 7 stops
    assert rooms[1].cpu == 2


def test_two_groups_submitting_without_pause_share_the_cluster_evenly() -> None:
    from bench import fairness

    shares = fairness.both_groups(nodes=4, seed=3, seconds=300)
    assert abs(shares["a"] - 0.5) < 0.05 and abs(shares["b"] - 0.5) < 0.05


def test_a_lender_gets_its_share_back_within_one_grace_period() -> None:
    from bench import fairness

    assert fairness.lender_returns(nodes=4, seed=3) <= fairness.GRACE_SECONDS
