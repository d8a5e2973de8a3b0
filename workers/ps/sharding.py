"""Which server holds which part of which key: balanced by size, the same on every worker.

The rule (MXNet's, with a better placement for the small keys):

* a key of at most `big_array_bound` elements lives whole on one server. Keys are placed largest
  first, each onto the server that holds the fewest elements so far (ties: the lowest index).
  This is the classic LPT heuristic: no server ends up more than one key's size above the mean.
* a key larger than the bound is cut into S near-equal contiguous slices, one per server, so that
  one huge embedding cannot land on a single server (MXNET_KVSTORE_BIGARRAY_BOUND does this too;
  the default bound is MXNet's, one million elements). The biggest slices go to the least loaded
  servers.

Servers only ever see "slots": one slot per (key, slice), numbered in the order the keys were
given. The plan is a pure function of the keys' sizes in the order `init` received them, so every
worker computes the same plan without talking to anyone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_BIG_ARRAY_BOUND = 1_000_000

Key = int | str  # MXNet allows both; the digits example uses parameter names


@dataclass(frozen=True)
class Slice:
    """Elements [start, stop) of a key's flattened value, held by one server as one slot."""

    key: Key
    slot: int
    server: int
    start: int
    stop: int

    @property
    def size(self) -> int:
        return self.stop - self.start


class Sharder:
    """Places keys on servers; remembers the load so that later `init` calls stay balanced."""

    def __init__(self, num_servers: int, big_array_bound: int = DEFAULT_BIG_ARRAY_BOUND) -> None:
        if num_servers < 1:
            raise ValueError("need at least one server")
        if big_array_bound < 1:
            raise ValueError("big_array_bound must be at least 1")
        self.num_servers = num_servers
        self.big_array_bound = big_array_bound
        self.loads = [0] * num_servers  # elements held per server
        self._next_slot = 0

    def assign(self, sizes: Sequence[tuple[Key, int]]) -> dict[Key, list[Slice]]:
        """Place each (key, number of elements); return each key's slices in element order."""
        keys = [key for key, _ in sizes]
        if len(set(keys)) != len(keys):
            raise ValueError("a key appears twice in one init")
        if any(size < 0 for _, size in sizes):
            raise ValueError("a key cannot have a negative size")
        # (key position, start, stop, server), decided largest key first. sorted() is stable, so
        # keys of equal size keep their given order and the plan never depends on dict ordering.
        placed: list[tuple[int, int, int, int]] = []
        for position in sorted(range(len(sizes)), key=lambda i: -sizes[i][1]):
            size = sizes[position][1]
            if size > self.big_array_bound and self.num_servers > 1:
                placed.extend(self._split(position, size))
            else:
                server = self._least_loaded()
                self.loads[server] += size
                placed.append((position, 0, size, server))
        # Slot numbers follow the given key order (then element order), not the placement order,
        # so that a server's log lists its slots in the order the model declares its parameters.
        placed.sort(key=lambda p: (p[0], p[1]))
        plan: dict[Key, list[Slice]] = {key: [] for key in keys}
        for position, start, stop, server in placed:
            key = sizes[position][0]
            plan[key].append(Slice(key, self._next_slot, server, start, stop))
            self._next_slot += 1
        return plan

    def _least_loaded(self) -> int:
        return min(range(self.num_servers), key=lambda s: (self.loads[s], s))

    def _split(self, position: int, size: int) -> list[tuple[int, int, int, int]]:
        base, extra = divmod(size, self.num_servers)
        # The first `extra` slices are one element longer; they go to the least loaded servers.
        servers = sorted(range(self.num_servers), key=lambda s: (self.loads[s], s))
        parts = []
        start = 0
        for i, server in enumerate(servers):
            stop = start + base + (1 if i < extra else 0)
            self.loads[server] += stop - start
            parts.append((position, start, stop, server))
            start = stop
        return parts
