"""Noticing, within a bounded time, that some process of the job is gone, and stopping everyone.

Gloo alone is not enough: a receive from one named peer fails at once when that peer dies, but a
server's receive-from-any-worker never notices a dead worker, and the scheduler exchanges no
tensors at all while training runs. So every process except the scheduler runs a `Watchdog`
thread that, once per tick, adds 1 to its heartbeat counter in the scheduler's TCPStore and looks
for the job's abort key. The scheduler (`HeartbeatMonitor`) declares a process lost when its
counter has not moved for the timeout, and writes the abort key. Any process that sees a peer
fail writes the abort key too, so one dead server stops the whole job in about a tick, not after
a chain of timeouts. A process whose store connection breaks has lost the scheduler.

The watchdog has its own store connection: the main thread may be blocked in a store call, and
TCPStore serialises calls on one connection, which would stall the heartbeat behind it.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterator

    import torch.distributed as dist

ABORT_KEY = "ps/abort"


def heartbeat_key(rank: int) -> str:
    return f"ps/heartbeat/{rank}"


def finished_key(rank: int) -> str:
    return f"ps/finished/{rank}"


def tick_seconds(timeout_s: float) -> float:
    """A tenth of the timeout, within [0.1 s, 1 s]: ten chances to beat before being declared
    lost, and at most one store round trip per second per process."""
    return min(1.0, max(0.1, timeout_s / 10))


def post_abort(store: dist.Store, reason: str) -> str | None:
    """Record why the job stops, unless someone already did; return the reason that stands,
    or None if the scheduler cannot be reached (then nobody can be told: it is gone too).

    compare_set from "" sets the key only if it does not exist yet, so the first failure (the
    cause) wins over the failures it then triggers in the other processes.
    """
    try:
        return store.compare_set(ABORT_KEY, "", reason).decode(errors="replace")
    except Exception:  # any store failure means the same: the scheduler is gone
        return None


def read_abort(store: dist.Store) -> str | None:
    if not store.check([ABORT_KEY]):
        return None
    return store.get(ABORT_KEY).decode(errors="replace")


class WaitState:
    """What the main thread is blocked on, so that a failure report can say it."""

    def __init__(self, idle: str = "busy computing, not waiting for anyone") -> None:
        self.idle = idle
        self.current = idle

    @contextmanager
    def waiting(self, what: str) -> Iterator[None]:
        previous = self.current
        self.current = what  # one attribute store: atomic under the GIL, no lock needed
        try:
            yield
        finally:
            self.current = previous


def die(message: str) -> None:
    """Report and leave at once, from any thread, even while the main thread is blocked in C++.

    os._exit skips interpreter teardown on purpose: the main thread may be stuck in a gloo wait
    that would otherwise keep the process alive until its own timeout.
    """
    print(f"error: {message}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(1)


class Watchdog:
    """Heartbeats to the scheduler and reacts to the job's abort key; see the module docstring."""

    def __init__(
        self,
        store: dist.Store,
        rank: int,
        timeout_s: float,
        wait_state: WaitState,
        scheduler_address: str,
        exit_fn: Callable[[str], None] = die,
    ) -> None:
        self._store = store
        self._rank = rank
        self._tick = tick_seconds(timeout_s)
        self._wait_state = wait_state
        self._scheduler_address = scheduler_address
        self._exit = exit_fn
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ps-watchdog", daemon=True)

    def start(self) -> None:
        self._beat()  # the first beat before returning: the scheduler counts from here
        self._thread.start()

    def stop(self) -> None:
        """Stop beating; after this returns the thread touches the store no more."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self._tick):
            self._beat()

    def _beat(self) -> None:
        try:
            self._store.add(heartbeat_key(self._rank), 1)
            reason = read_abort(self._store)
        except Exception as exc:  # any store failure means the same: the scheduler is gone
            if self._stop.is_set():
                return
            self._exit(
                f"lost the scheduler at {self._scheduler_address} "
                f"({first_line(exc)}); this process was {self._wait_state.current}"
            )
            return
        if reason is not None and not self._stop.is_set():
            self._exit(
                f"the job was aborted: {reason}; this process was {self._wait_state.current}"
            )


class HeartbeatMonitor:
    """The scheduler's view: whose heartbeat counter has stood still for longer than the timeout.

    Only the scheduler's own clock is used (counters, not timestamps), so hosts with skewed
    clocks cannot make each other look dead.
    """

    def __init__(self, ranks: list[int], timeout_s: float, now: float | None = None) -> None:
        start = time.monotonic() if now is None else now
        self.timeout_s = timeout_s
        self._last: dict[int, tuple[int, float]] = {rank: (-1, start) for rank in ranks}

    @property
    def watched(self) -> list[int]:
        return sorted(self._last)

    def forget(self, rank: int) -> None:
        """A process that finished cleanly stops beating; it must not be declared lost."""
        self._last.pop(rank, None)

    def observe(self, rank: int, count: int, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        if count != self._last.get(rank, (-1, now))[0]:
            self._last[rank] = (count, now)

    def stale(self, now: float | None = None) -> list[tuple[int, float]]:
        """(rank, seconds since its counter last moved) for every rank past the timeout."""
        now = time.monotonic() if now is None else now
        return [
            (rank, now - since)
            for rank, (_, since) in sorted(self._last.items())
            if now - since > self.timeout_s
        ]


def first_line(exc: BaseException) -> str:
    """The useful part of a torch/gloo error: its first sentence, without the C++ source
    location in front or gloo's generic advice behind ("This is typically caused by ...")."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if text.startswith("[") and "] " in text:
        text = text.split("] ", 1)[1]
    return text.split(". ", 1)[0].rstrip(".")
