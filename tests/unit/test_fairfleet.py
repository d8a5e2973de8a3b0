"""The pure parts of bench/fairfleet.py (the compressed clock, core-seconds from the fleet's
events) and the simulated fleet's stop with a grace, which its figures depend on: a preempted
replica shows "stopping" while it saves its checkpoint and exits within the grace."""

import asyncio
from typing import Any

from bench.fairfleet import DEFAULTS, FLOORS, Clock, _fleet_core_seconds
from bench.fleet import SECONDS_ARG, Event, Fleet, FleetConfig
from workers import contract, credentials


def test_it_divides_every_setting_by_the_factor_above_its_floor() -> None:
    clock = Clock(5.0)
    s = clock.settings()
    assert s["TRAINYARD_PREEMPTION_GRACE_SECONDS"] == 6
    assert s["TRAINYARD_PREEMPTION_MIN_RUN_SECONDS"] == 120
    assert s["TRAINYARD_FAIR_SHARE_HALF_LIFE_SECONDS"] == 4320
    assert s["TRAINYARD_NODE_LOST_SECONDS"] == FLOORS["TRAINYARD_NODE_LOST_SECONDS"]
    assert clock.simulated(clock.real(600)) == 600
    assert all(v >= FLOORS[k] for k, v in Clock(10_000).settings().items())
    assert set(s) == set(DEFAULTS)


def _event(at: float, kind: str, job_id: int, cpus: int) -> Event:
    return Event(at, "n", kind, job_id, 0, "master", 0, cpus)


def test_it_counts_core_seconds_per_group_within_the_window() -> None:
    events = [
        _event(0.0, "start", 1, 4),  # a: 4 cores from before the window
        _event(5.0, "start", 2, 8),  # b: 8 cores from 5 s
        _event(15.0, "stop", 1, 4),  # a stops at 15 s
        _event(30.0, "exit", 2, 8),  # after the window
        _event(6.0, "start", 3, 2),  # not of either group
    ]
    totals = _fleet_core_seconds(events, {1: "a", 2: "b"}, since=2.0, until=20.0)
    assert totals == {"a": 4 * 13.0, "b": 8 * 15.0}


def _fleet(stop_seconds: float) -> tuple[Fleet, list[tuple[str, dict[str, Any]]]]:
    url = credentials.agent_url("sim-0", "secret", "127.0.0.1", 1)
    fleet = Fleet({"sim-0": url}, FleetConfig(stop_seconds=stop_seconds))
    sent: list[tuple[str, dict[str, Any]]] = []

    async def report(task: str, payload: dict[str, Any], expires: float | None = None) -> None:
        sent.append((task, payload))

    fleet.agents[0].report = report  # type: ignore[method-assign]
    return fleet, sent


def _spec(job_id: int) -> dict[str, Any]:
    return {"job_id": job_id, "attempt": 0, "role": "master", "index": 0, "cpus": 2,
            "args": [SECONDS_ARG, "3600"]}  # fmt: skip


async def _until(condition: Any) -> None:
    while not condition():
        await asyncio.sleep(0.01)


def test_a_replica_stopped_with_a_grace_shows_stopping_then_exits_within_it() -> None:
    async def scenario() -> None:
        fleet, sent = _fleet(stop_seconds=3600.0)
        agent = fleet.agents[0]
        await agent.start(_spec(7))
        await agent.stop_job(7, "preempted", grace_seconds=0.2)
        assert [r["state"] for r in agent.running()] == ["stopping"]
        assert not any(task == contract.TASK_REPLICA_EXITED for task, _ in sent)
        await agent.stop_job(7, "preempted", grace_seconds=0.2)  # a repeat changes nothing
        # The checkpoint would take an hour: the grace cuts it short.
        await _until(lambda: any(task == contract.TASK_REPLICA_EXITED for task, _ in sent))
        exits = [p for task, p in sent if task == contract.TASK_REPLICA_EXITED]
        assert [p["state"] for p in exits] == ["stopped"]
        assert agent.running() == []
        assert [e.kind for e in fleet.events] == ["start", "stop"]

    asyncio.run(scenario())


def test_a_stop_without_a_grace_ends_the_replica_at_once() -> None:
    async def scenario() -> None:
        fleet, sent = _fleet(stop_seconds=3600.0)
        agent = fleet.agents[0]
        await agent.start(_spec(8))
        await agent.stop_job(8, "cancelled by alice")
        assert agent.running() == []
        assert [p["state"] for t, p in sent if t == contract.TASK_REPLICA_EXITED] == ["stopped"]

    asyncio.run(scenario())
