"""EASY backfill's decision, on plain values: the head's reserved start, and which later jobs
may pass it without delaying it (jobs.services.scheduler.backfill)."""

from datetime import UTC, datetime, timedelta

from jobs.services.placement import Demand, Holding, Room, place
from jobs.services.scheduler.backfill import Backfill

NOW = datetime(2026, 11, 26, 14, 0, tzinfo=UTC)
GRACE = timedelta(seconds=30)


def gang(instances: int, cpu: int) -> list[Demand]:
    return [Demand(("worker", i), cpu, 0, 1) for i in range(instances)]


def free(**cores: int) -> list[Room]:
    return [Room(node, cpu, 0, 100) for node, cpu in cores.items()]


def minutes(n: float) -> timedelta:
    return timedelta(minutes=n)


# Two 8-core nodes. Job 1 holds 6 cores of node-1 and ends at 14:30; job 2 holds 6 cores of
# node-2 and ends at 15:00. Free now: 2 + 2. The head wants one 8-core instance: it can start
# at 14:30 on node-1, once job 1 has ended.
HELD = [Holding(1, "node-1", 6, 0, 6), Holding(2, "node-2", 6, 0, 6)]
ENDS: dict[int, datetime | None] = {1: NOW + minutes(30), 2: NOW + minutes(60)}


def reserved() -> Backfill:
    easy = Backfill(NOW, HELD, ENDS, GRACE)
    reservation = easy.reserve(10, gang(1, 8), free(**{"node-1": 2, "node-2": 2}))
    assert reservation is not None
    return easy


def test_the_head_is_reserved_the_earliest_time_its_whole_gang_fits() -> None:
    easy = Backfill(NOW, HELD, ENDS, GRACE)
    reservation = easy.reserve(10, gang(1, 8), free(**{"node-1": 2, "node-2": 2}))
    assert reservation is not None
    assert (reservation.start, reservation.nodes) == (NOW + minutes(30), ("node-1",))
    assert reservation.in_words(NOW) == "reserved to start at 14:30 UTC on node-1"
    # A gang of two 8-core instances needs both nodes: it waits for job 2 as well.
    both = Backfill(NOW, HELD, ENDS, GRACE).reserve(
        10, gang(2, 8), free(**{"node-1": 2, "node-2": 2})
    )
    assert both is not None
    assert (both.start, both.nodes) == (NOW + minutes(60), ("node-1", "node-2"))


def test_a_job_that_a_greedy_pass_would_start_and_that_would_delay_the_head_waits() -> None:
    # Two cores for an hour, with no limit at all: both fit now, and greedy backfill
    # would start them; on node-1 they would keep the head from starting at 14:30.
    rooms = free(**{"node-1": 2, "node-2": 2})
    for limit in (minutes(60), None):
        easy = reserved()
        on_node_1 = {("worker", 0): "node-1"}
        assert place(gang(1, 2), rooms) == on_node_1  # where a greedy pass would start it
        # It is moved beside the reservation instead, onto node-2, where it delays no one...
        assert easy.admits(gang(1, 2), rooms, on_node_1, limit) == {("worker", 0): "node-2"}
        # ...and once node-2 is full, nowhere is left that would not delay the head.
        assert easy.admits(gang(1, 2), free(**{"node-1": 2}), on_node_1, limit) is None


def test_a_short_job_that_ends_before_the_reserved_start_may_use_the_head_s_nodes() -> None:
    easy = reserved()
    on_node_1 = {("worker", 0): "node-1"}
    rooms = free(**{"node-1": 2})
    # 29 min 30 s of limit + 30 s of stop grace: gone at 14:30 sharp.
    assert easy.admits(gang(1, 2), rooms, on_node_1, minutes(29.5)) == on_node_1
    # One second longer and it would still hold node-1 when the head is due there.
    longer = minutes(29.5) + timedelta(seconds=1)
    assert easy.admits(gang(1, 2), rooms, on_node_1, longer) is None


def test_a_job_beside_the_reservation_starts_however_long_it_runs() -> None:
    easy = reserved()
    on_node_2 = {("worker", 0): "node-2"}
    assert easy.admits(gang(1, 2), free(**{"node-2": 2}), on_node_2, None) == on_node_2


def test_jobs_admitted_beside_the_reservation_count_against_what_is_free_then() -> None:
    # At 14:30 node-1 has all 8 cores free; the head wants 6 of them. Long jobs may take the
    # 2 left over, and no more: two of 1 core, or one of 2 and none after it.
    easy = Backfill(NOW, HELD, ENDS, GRACE)
    assert easy.reserve(10, gang(1, 6), free(**{"node-1": 2})) is not None
    on_node_1 = {("worker", 0): "node-1"}
    assert easy.admits(gang(1, 1), free(**{"node-1": 2}), on_node_1, None) == on_node_1
    assert easy.admits(gang(1, 1), free(**{"node-1": 1}), on_node_1, None) == on_node_1
    easy = Backfill(NOW, HELD, ENDS, GRACE)
    assert easy.reserve(10, gang(1, 6), free(**{"node-1": 2})) is not None
    assert easy.admits(gang(1, 2), free(**{"node-1": 2}), on_node_1, None) == on_node_1
    assert easy.admits(gang(1, 1), free(**{"node-1": 0}), on_node_1, None) is None


def test_without_the_limits_it_needs_the_start_is_unknown_and_the_grace_rule_decides() -> None:
    no_limit_on_1: dict[int, datetime | None] = {1: None, 2: NOW + minutes(60)}
    easy = Backfill(NOW, HELD, no_limit_on_1, GRACE)
    # The gang needs node-1 or node-2 whole: node-2 frees at 15:00, so it is still known.
    assert easy.reserve(10, gang(1, 8), free(**{"node-1": 2, "node-2": 2})) is not None
    # Two 8-core instances need job 1's cores too: unknown.
    easy = Backfill(NOW, HELD, no_limit_on_1, GRACE)
    assert easy.reserve(10, gang(2, 8), free(**{"node-1": 2, "node-2": 2})) is None
    assert easy.reservation is None
    # With no reservation, the test lets every job that fits through (greedy): the caller's
    # grace rule is what holds it back then.
    anywhere = {("worker", 0): "node-1"}
    assert easy.admits(gang(1, 2), free(**{"node-1": 2}), anywhere, None) == anywhere


def test_a_head_that_could_not_start_even_on_emptied_nodes_reserves_nothing() -> None:
    easy = Backfill(NOW, HELD, ENDS, GRACE)
    assert easy.reserve(10, gang(1, 9), free(**{"node-1": 2, "node-2": 2})) is None


def test_a_job_past_its_limit_frees_its_nodes_now_at_the_earliest() -> None:
    overdue: dict[int, datetime | None] = {1: NOW - minutes(5), 2: NOW + minutes(60)}
    easy = Backfill(NOW, HELD, overdue, GRACE)
    reservation = easy.reserve(10, gang(1, 8), free(**{"node-1": 2, "node-2": 2}))
    assert reservation is not None and reservation.start == NOW
    # Nothing can end before now: only a job beside it may start.
    on_node_1 = {("worker", 0): "node-1"}
    assert easy.admits(gang(1, 2), free(**{"node-1": 2}), on_node_1, minutes(1)) is None


def test_a_reservation_on_another_day_says_the_day() -> None:
    late: dict[int, datetime | None] = {1: NOW + timedelta(hours=12), 2: None}
    easy = Backfill(NOW, HELD, late, GRACE)
    reservation = easy.reserve(10, gang(1, 8), free(**{"node-1": 2, "node-2": 2}))
    assert reservation is not None
    assert reservation.in_words(NOW) == "reserved to start at 2026-11-27 02:00 UTC on node-1"


def test_the_rooms_passed_in_are_never_changed() -> None:
    rooms = free(**{"node-1": 2, "node-2": 2})
    easy = Backfill(NOW, HELD, ENDS, GRACE)
    assert easy.reserve(10, gang(1, 8), rooms) is not None
    on_node_2 = {("worker", 0): "node-2"}
    assert easy.admits(gang(1, 2), rooms, on_node_2, None) == on_node_2
    assert [(r.node, r.cpu) for r in rooms] == [("node-1", 2), ("node-2", 2)]
