"""The victim choice and the queue's order (jobs.services.scheduler.preemption, queue_order): pure
functions, tested without a database."""

from datetime import UTC, datetime, timedelta

from jobs.services.placement import Demand, Holding, Room, place
from jobs.services.scheduler.preemption import (
    Preemptor,
    Running,
    choose_victims,
    rooms_without,
)
from tests.unit.helpers import queue_key

T0 = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
NOW = T0 + timedelta(hours=1)
MIN_RUN = 600.0
LOW, NORMAL, HIGH = -10, 0, 10


def superfluous(preemptor: Preemptor, rooms: list[Room], victims: list[Running]) -> list[Running]:
    """The victims the preemptor would fit without (there should be none)."""
    return [
        v
        for v in victims
        if place(preemptor.demands, rooms_without(rooms, [w for w in victims if w is not v]))
        is not None
    ]


def cpus(n: int, key: int = 0) -> Demand:
    return Demand(("worker", key), n, 0, 1)


def high_job(*demands: Demand, job_id: int = 100, **more: object) -> Preemptor:
    return Preemptor(job_id, HIGH, True, tuple(demands), **more)  # type: ignore[arg-type]


def running(
    job_id: int,
    node: str,
    cpu: int,
    started_min: int,
    priority: int = LOW,
    preemptible: bool = True,
    times_preempted: int = 0,
    started: datetime | None = None,
) -> Running:
    return Running(
        job_id,
        priority,
        preemptible,
        started or T0 + timedelta(minutes=started_min),
        (Holding(job_id, node, cpu, 0, 1),),
        times_preempted,
    )


def full(*nodes: str) -> list[Room]:
    return [Room(n, 0, 0, 16) for n in nodes]


def ids(victims: list[Running] | None) -> list[int] | None:
    return None if victims is None else sorted(v.job_id for v in victims)


def test_it_takes_one_job_when_one_is_enough_the_one_that_started_last() -> None:
    jobs = [running(i, f"node-{i % 2 + 1}", 2, started_min=i) for i in range(1, 5)]
    victims = choose_victims(high_job(cpus(2)), full("node-1", "node-2"), jobs, NOW, MIN_RUN)
    assert ids(victims) == [4]


def test_it_takes_the_fewest_jobs_not_the_latest_started_ones() -> None:
    # Two small late jobs would do too, but one early large job is fewer.
    jobs = [
        running(1, "node-1", 4, started_min=0),
        running(2, "node-2", 2, started_min=10),
        running(3, "node-2", 2, started_min=20),
    ]
    victims = choose_victims(high_job(cpus(4)), full("node-1", "node-2"), jobs, NOW, MIN_RUN)
    assert ids(victims) == [1]


def test_a_gang_that_needs_two_nodes_evicts_one_job_on_each() -> None:
    jobs = [running(i, f"node-{(i - 1) // 2 + 1}", 2, started_min=i) for i in range(1, 5)]
    demands = (cpus(2, 0), cpus(2, 1), cpus(2, 2))  # 6 of 8 cores: three 2-core jobs
    victims = choose_victims(high_job(*demands), full("node-1", "node-2"), jobs, NOW, MIN_RUN)
    assert victims is not None and len(victims) == 3
    assert 1 not in ids(victims)  # type: ignore[operator]  # the earliest started stays
    assert superfluous(high_job(*demands), full("node-1", "node-2"), victims) == []


def test_only_strictly_lower_preemptible_jobs_are_victims() -> None:
    same = [running(1, "node-1", 4, 0, priority=HIGH)]
    assert choose_victims(high_job(cpus(4)), full("node-1"), same, NOW, MIN_RUN) is None
    protected = [running(1, "node-1", 4, 0, preemptible=False)]
    assert choose_victims(high_job(cpus(4)), full("node-1"), protected, NOW, MIN_RUN) is None


def test_a_normal_job_never_preempts_a_normal_one() -> None:
    normal = Preemptor(100, NORMAL, True, (cpus(4),))  # even were normal allowed to preempt
    jobs = [running(1, "node-1", 4, 0, priority=NORMAL)]
    assert choose_victims(normal, full("node-1"), jobs, NOW, MIN_RUN) is None


def test_a_class_that_may_not_preempt_evicts_nothing() -> None:
    polite = Preemptor(100, HIGH, False, (cpus(4),))
    jobs = [running(1, "node-1", 4, 0)]
    assert choose_victims(polite, full("node-1"), jobs, NOW, MIN_RUN) is None


def test_a_job_preempted_before_is_safe_until_it_has_run_the_minimum_time() -> None:
    just_back = running(1, "node-1", 4, 0, times_preempted=1, started=NOW - timedelta(seconds=599))
    assert choose_victims(high_job(cpus(4)), full("node-1"), [just_back], NOW, MIN_RUN) is None
    long_back = running(1, "node-1", 4, 0, times_preempted=1, started=NOW - timedelta(seconds=600))
    assert ids(choose_victims(high_job(cpus(4)), full("node-1"), [long_back], NOW, MIN_RUN)) == [1]


def test_a_job_never_preempted_may_be_preempted_however_new() -> None:
    fresh = running(1, "node-1", 4, 0, started=NOW - timedelta(seconds=1))
    assert ids(choose_victims(high_job(cpus(4)), full("node-1"), [fresh], NOW, MIN_RUN)) == [1]


def test_a_job_never_preempts_one_that_preempted_it() -> None:
    jobs = [running(1, "node-1", 4, 0)]
    back = high_job(cpus(4), preempted_by=frozenset({1}))
    assert choose_victims(back, full("node-1"), jobs, NOW, MIN_RUN) is None


def test_nothing_is_evicted_when_the_job_fits_or_could_never_fit() -> None:
    jobs = [running(1, "node-1", 2, 0)]
    assert choose_victims(high_job(cpus(2)), [Room("node-1", 2, 0, 16)], jobs, NOW, MIN_RUN) == []
    assert choose_victims(high_job(cpus(8)), full("node-1"), jobs, NOW, MIN_RUN) is None


def test_no_victim_is_superfluous_when_the_free_room_covers_part_of_the_need() -> None:
    # 1 core free; the job needs 3: one 2-core victim is enough, not two 1-core ones plus it.
    jobs = [
        running(1, "node-1", 1, 30),
        running(2, "node-1", 1, 40),
        running(3, "node-1", 2, 0),
    ]
    rooms = [Room("node-1", 1, 0, 16)]
    victims = choose_victims(high_job(cpus(3)), rooms, jobs, NOW, MIN_RUN)
    assert ids(victims) == [3]
    assert superfluous(high_job(cpus(3)), rooms, victims or []) == []


def test_victims_on_a_node_the_job_may_not_use_are_left_alone() -> None:
    jobs = [running(1, "node-1", 4, 50), running(2, "node-2", 4, 0)]
    # The scheduler offers only the rooms the job may use (node-2: node-1 is excluded).
    victims = choose_victims(high_job(cpus(4)), full("node-2"), jobs, NOW, MIN_RUN)
    assert ids(victims) == [2]


def test_a_large_fleet_falls_back_to_a_greedy_choice_without_superfluous_victims() -> None:
    nodes = [f"n{i}" for i in range(200)]
    jobs = [running(i, nodes[i % 200], 1, started_min=i) for i in range(800)]
    rooms = [Room(n, 0, 0, 16) for n in nodes]
    demands = tuple(cpus(3, k) for k in range(30))  # more sets than the exact search tries
    victims = choose_victims(high_job(*demands), rooms, jobs, NOW, MIN_RUN)
    assert victims is not None and len(victims) >= 90
    assert superfluous(high_job(*demands), rooms, victims) == []


def test_the_queue_orders_by_priority_then_submission_time_then_id() -> None:
    waiting = [
        (1, LOW, T0),
        (2, NORMAL, T0 + timedelta(minutes=1)),
        (3, HIGH, T0 + timedelta(minutes=5)),
        (4, NORMAL, T0),
        (5, NORMAL, T0),
    ]
    order = sorted(waiting, key=lambda w: queue_key(w[1], w[2], w[0]))
    assert [w[0] for w in order] == [3, 4, 5, 2, 1]
