"""Gang placement: every instance of a job gets a node with room, or none of them does.

Pure functions over plain values, so the policy is tested without a database.
"""

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol


class Sized(Protocol):
    """What one instance of a package asks for (a Package row, or its plain values)."""

    @property
    def cpu(self) -> int: ...
    @property
    def gpus(self) -> int: ...
    @property
    def memory_gb(self) -> int: ...


@dataclass(frozen=True)
class Demand:
    """One instance to place."""

    key: tuple[str, int]  # (role, index)
    cpu: int
    gpus: int
    memory_gb: int
    # One instance per node (a job's one_instance_per_node, Slurm's --ntasks-per-node=1): it
    # goes to a node that none of the other instances placed with it takes. Every instance
    # of a job has it, or none does.
    alone: bool = False

    @classmethod
    def of(cls, key: tuple[str, int], package: Sized, alone: bool = False) -> "Demand":
        """An instance of `package`."""
        return cls(key, package.cpu, package.gpus, package.memory_gb, alone)


def smallest(demands: Sequence[Demand]) -> Demand:
    """An instance as small as the smallest of `demands` in each resource: a room that cannot
    hold it takes none of them."""
    return Demand(
        ("smallest", 0),
        min(d.cpu for d in demands),
        min(d.gpus for d in demands),
        min(d.memory_gb for d in demands),
    )


@dataclass
class Room:
    """What a node has free right now."""

    node: str
    cpu: int
    gpus: int
    memory_gb: int

    def fits(self, d: Demand) -> bool:
        return self.cpu >= d.cpu and self.gpus >= d.gpus and self.memory_gb >= d.memory_gb

    def take(self, d: Demand) -> None:
        self.cpu -= d.cpu
        self.gpus -= d.gpus
        self.memory_gb -= d.memory_gb


@dataclass(frozen=True)
class Holding:
    """What one job holds on one node: running instances' room, as the scheduler, preemption,
    reclaim and backfill all read it."""

    job_id: int
    node: str
    cpu: int
    gpus: int
    memory_gb: int


def with_freed(rooms: Sequence[Room], freed: Iterable[Holding]) -> list[Room]:
    """Copies of the free rooms once `freed` is given back: what preemption, reclaim and their
    reservations place into. A node not among `rooms` (draining, lost) frees nothing usable."""
    out = {r.node: Room(r.node, r.cpu, r.gpus, r.memory_gb) for r in rooms}
    for h in freed:
        room = out.get(h.node)
        if room is not None:
            room.cpu += h.cpu
            room.gpus += h.gpus
            room.memory_gb += h.memory_gb
    return list(out.values())


def reserve(
    demands: Sequence[Demand],
    rooms: list[Room],
    freeing: Sequence[Holding],
    also: Sequence[Holding] = (),
) -> set[str]:
    """Take `demands` out of the rooms where they will go once `freeing` is gone (or, if they
    do not fit there, once `also` is gone too), so that the rest of the pass cannot take that
    room (a room may go below zero meanwhile): the room a preemption or a reclaim made is kept
    for the job it was made for. Returns those nodes."""
    assignment = place(demands, with_freed(rooms, freeing))
    if assignment is None and also:
        assignment = place(demands, with_freed(rooms, [*freeing, *also]))
    if assignment is None:
        return set()
    by_node = {room.node: room for room in rooms}
    for demand in demands:
        by_node[assignment[demand.key]].take(demand)
    return set(assignment.values())


@dataclass
class _Attempt:
    assignment: dict[tuple[str, int], str]
    stuck: Demand | None  # the instance no room was left for, if any
    free: list[Room]  # the rooms as they were when placement stopped

    def taken(self) -> set[str]:
        """The nodes the instances placed so far went to."""
        return set(self.assignment.values())


def _best_fit(
    demands: Sequence[Demand],
    rooms: Sequence[Room],
    placed: dict[tuple[str, int], str] | None = None,
) -> _Attempt:
    """Best fit, largest demand first: each instance goes to the node it leaves least room on.

    Packing tightly keeps whole nodes free for large (GPU) requests instead of leaving
    fragments everywhere. Works on copies: the rooms passed in are not changed. `placed`: where
    instances of the same job already went (their room already taken out of `rooms`).
    """
    free = [Room(r.node, r.cpu, r.gpus, r.memory_gb) for r in rooms]
    attempt = _Attempt(dict(placed or {}), None, free)
    for demand in sorted(demands, key=lambda d: (d.gpus, d.cpu, d.memory_gb), reverse=True):
        taken = attempt.taken() if demand.alone else set()
        candidates = [r for r in free if r.fits(demand) and r.node not in taken]
        if not candidates:
            attempt.stuck = demand
            return attempt
        best = min(
            candidates,
            key=lambda r: (
                r.gpus - demand.gpus,
                r.cpu - demand.cpu,
                r.memory_gb - demand.memory_gb,
                r.node,
            ),
        )
        best.take(demand)
        attempt.assignment[demand.key] = best.node
    return attempt


def place(demands: Sequence[Demand], rooms: Sequence[Room]) -> dict[tuple[str, int], str] | None:
    """{(role, index): node} for every instance, or None when not all of them fit now."""
    attempt = _best_fit(demands, _open(demands, rooms))
    return None if attempt.stuck is not None else attempt.assignment


def place_elastic(
    required: Sequence[Demand],
    extra: Sequence[Demand],
    rooms: Sequence[Room],
    kept: Sequence[tuple[str, str]] = (),
) -> dict[tuple[str, int], str] | None:
    """An elastic job's placement: every `required` instance and as many of `extra` as fit
    beside them, in their order (the lowest worker indices first, so ranks stay contiguous);
    None when not even the required ones fit. `kept`, (role, node) of the attempt before,
    are tried first: a resize keeps its instances where they ran (their data and caches are
    there, and a grow does not move the group), the torch elastic way."""
    for count in range(len(extra), -1, -1):
        assignment = place_keeping([*required, *extra[:count]], rooms, kept)
        if assignment is not None:
            return assignment
    return None


def place_keeping(
    demands: Sequence[Demand], rooms: Sequence[Room], kept: Sequence[tuple[str, str]]
) -> dict[tuple[str, int], str] | None:
    """place(), each (role, node) of `kept` first taking an instance of that role to that node
    where it fits there; the rest placed by best fit."""
    if not kept:
        return place(demands, rooms)
    free = {r.node: Room(r.node, r.cpu, r.gpus, r.memory_gb) for r in rooms}
    waiting = sorted(demands, key=lambda d: d.key)
    placed: dict[tuple[str, int], str] = {}
    for role, node in kept:
        room = free.get(node)
        demand = next((d for d in waiting if d.key[0] == role), None)
        if room is None or demand is None or not room.fits(demand):
            continue
        if demand.alone and node in placed.values():
            continue
        room.take(demand)
        placed[demand.key] = node
        waiting.remove(demand)
    attempt = _best_fit(waiting, _open(waiting, list(free.values())), placed)
    return None if attempt.stuck is not None else attempt.assignment


def _open(demands: Sequence[Demand], rooms: Sequence[Room]) -> Sequence[Room]:
    """The rooms with space for the smallest instance: no other room takes any of them (rooms
    only shrink as instances are placed), so best fit chooses among these as among all. At a
    thousand full nodes, copying the rest was most of a scheduling pass's placement."""
    if not demands:
        return rooms
    least = smallest(demands)
    return [r for r in rooms if r.fits(least)]


def never_fits(demands: Sequence[Demand], capacities: Sequence[Room]) -> Demand | None:
    """An instance that no node could hold even when empty, if there is one."""
    for demand in demands:
        if not any(c.fits(demand) for c in capacities):
            return demand
    return None


def gang_never_fits(demands: Sequence[Demand], capacities: Sequence[Room]) -> bool:
    """True when the instances could not all run at once even on empty nodes."""
    return place(demands, capacities) is None


def first_unplaceable(
    demands: Sequence[Demand], rooms: Sequence[Room]
) -> tuple[Demand, list[Room]] | None:
    """The instance placement gets stuck on, with the rooms as they were at that moment
    (after the larger instances before it were placed); None when everything fits. A room
    that could take none of them is returned as passed in, not copied: do not change them.
    For an instance that goes alone, the nodes its job's other instances took are left out:
    no room there would let it start."""
    attempt = _best_fit(demands, _open(demands, rooms))
    if attempt.stuck is None:
        return None
    then = {r.node: r for r in attempt.free}
    taken = attempt.taken() if attempt.stuck.alone else set()
    return attempt.stuck, [then.get(r.node, r) for r in rooms if r.node not in taken]


def describe(cpu: int, gpus: int, memory_gb: int) -> str:
    """ "2 GPUs, 12 CPU cores and 120 GB": the non-zero parts, GPUs first."""
    parts = []
    if gpus:
        parts.append(f"{gpus} GPU{'s' if gpus != 1 else ''}")
    if cpu:
        parts.append(f"{cpu} CPU core{'s' if cpu != 1 else ''}")
    if memory_gb:
        parts.append(f"{memory_gb} GB")
    if len(parts) > 1:
        return ", ".join(parts[:-1]) + " and " + parts[-1]
    return parts[0] if parts else "nothing"
