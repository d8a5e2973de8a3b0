"""The scheduler: hosts the rendezvous, watches that everyone stays alive, reports the end.

It holds no parameters and moves no tensors. After the join it loops once per tick: it reads
every unfinished process's heartbeat counter, declares a process lost when its counter has not
moved for the timeout (writing the abort key, which stops all the others within a tick), and
notes each process that marks itself finished. When all have, it prints so and exits 0. If the
job was aborted, by itself or by anyone else, it prints the reason and exits 1.
"""

from __future__ import annotations

import sys
import time

from workers.ps.config import Topology, read_topology
from workers.ps.errors import PeerError, PSError
from workers.ps.liveness import (
    HeartbeatMonitor,
    finished_key,
    heartbeat_key,
    post_abort,
    read_abort,
    tick_seconds,
)
from workers.ps.session import Session, join


def watch(session: Session) -> None:
    """Block until every other process has finished; raise PSError when the job must stop."""
    topo, store = session.topo, session.store
    others = list(range(1, topo.world_size))
    monitor = HeartbeatMonitor(others, topo.timeout_s)
    tick = tick_seconds(topo.timeout_s)
    started = time.monotonic()
    while monitor.watched:
        for rank in monitor.watched:
            if store.check([finished_key(rank)]):
                monitor.forget(rank)
                print(f"finished {session.describe(rank)}", flush=True)
            else:
                monitor.observe(rank, store.add(heartbeat_key(rank), 0))
        reason = read_abort(store)
        if reason is not None:
            raise PSError(f"the job was aborted: {reason}")
        lost = monitor.stale()
        if lost:
            rank, silent = lost[0]
            reason = (
                f"{session.describe(rank)} sent no heartbeat for {silent:.0f} s "
                f"(TRAINYARD_PS_TIMEOUT={topo.timeout_s:g}): the process died or hung"
            )
            # Posted here rather than by session.fail: this is the cause, not our own failure.
            raise PeerError(post_abort(store, reason) or reason)
        if monitor.watched:
            left = ", ".join(topo.label_of(r) for r in monitor.watched)
            session.wait_state.current = f"waiting for the job to finish ({left} still running)"
            time.sleep(tick)
    print(
        f"all finished: {topo.num_servers} server(s) and {topo.num_workers} worker(s) "
        f"exited cleanly after {time.monotonic() - started:.1f} s",
        flush=True,
    )


def run_scheduler(topo: Topology | None = None) -> int:
    """Run this process as the scheduler until the job ends; return the exit code."""
    try:
        topo = read_topology() if topo is None else topo
    except PSError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 1
    try:
        session = join(topo)
    except PSError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        _linger(topo)
        return 1
    try:
        watch(session)
    except PSError as exc:
        print(
            f"error: {exc}; the scheduler was {session.wait_state.current}",
            file=sys.stderr,
            flush=True,
        )
        _linger(topo)
        return 1
    except Exception as exc:  # every failure must stop the job, not hang it
        return session.fail(exc)
    session.finish()
    return 0


def _linger(topo: Topology) -> None:
    """The store dies with the scheduler. Stay a little after an abort, so that every other
    process reads the reason (within a tick) instead of reporting only that we vanished."""
    time.sleep(2 * tick_seconds(topo.timeout_s) + 0.5)
