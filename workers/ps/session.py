"""Joining the job at the scheduler, and leaving it: the control plane every role shares.

Rendezvous follows MXNet's shape with torch.distributed parts: the scheduler hosts a TCPStore at
DMLC_PS_ROOT_URI:DMLC_PS_ROOT_PORT; every process connects to it, claims its rank (so two
processes started with the same index are caught), and registers who it is. The scheduler waits
until all 1+S+W have registered, printing each as it arrives, checks that they agree on the job's
shape, and opens the gate. Only then does everyone call init_process_group over gloo on the same
store, so that gloo's own (short) timeout never has to cover slow starts.

The store stays the control plane for the whole run: heartbeats and the abort key (liveness.py),
worker barriers and the per-epoch figures (board.py) all go through the scheduler, as in ps-lite.
Tensors never do: they move over gloo point-to-point.

Leaving: stop the watchdog, destroy the process group, then mark this rank finished as the very
last store call, because the scheduler exits (taking the store with it) once every rank is marked.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist

from workers.ps.config import SCHEDULER, Topology
from workers.ps.errors import PeerError, PSError
from workers.ps.liveness import (
    WaitState,
    Watchdog,
    finished_key,
    first_line,
    post_abort,
    read_abort,
)

JOINED_KEY = "ps/joined"
POLL_S = 0.02  # store polling step for control-plane waits (rare: joins, barriers, epoch ends)


def claim_key(rank: int) -> str:
    return f"ps/claim/{rank}"


def who_key(rank: int) -> str:
    return f"ps/who/{rank}"


@dataclass(frozen=True)
class Peer:
    role: str
    index: int
    host: str
    pid: int


class Session:
    """This process's membership in the job: store, gloo group, liveness, failure reporting."""

    def __init__(self, topo: Topology, store: dist.Store, peers: dict[int, Peer]) -> None:
        self.topo = topo
        self.store = store
        self.peers = peers
        self.wait_state = WaitState()
        self._watchdog: Watchdog | None = None

    @property
    def timeout(self) -> timedelta:
        return timedelta(seconds=self.topo.timeout_s)

    def describe(self, rank: int) -> str:
        """`server-0 (rank 1 on node-a)`: enough to find the process's own log."""
        peer = self.peers.get(rank)
        where = f" on {peer.host}" if peer else ""
        return f"{self.topo.label_of(rank)} (rank {rank}{where})"

    def start_watchdog(self) -> None:
        topo = self.topo
        # A second connection of our own: see liveness.py for why the watchdog needs it.
        watch_store = dist.TCPStore(
            topo.root_uri,
            topo.root_port,
            None,
            False,
            timeout=timedelta(seconds=topo.join_timeout_s),
        )
        self._watchdog = Watchdog(
            watch_store,
            topo.rank,
            topo.timeout_s,
            self.wait_state,
            scheduler_address=f"{topo.root_uri}:{topo.root_port}",
        )
        self._watchdog.start()

    def stop_watchdog(self) -> None:
        if self._watchdog is not None:
            self._watchdog.stop()
            self._watchdog = None

    def abort(self, reason: str) -> str | None:
        """Tell every process to stop (first reason wins); return the reason that stands, None
        if the scheduler is unreachable."""
        self.stop_watchdog()  # our own abort key must not make our watchdog exit under us
        return post_abort(self.store, reason)

    def wait_for_keys(
        self,
        keys: list[str],
        timeout_s: float,
        what: str,
        missing: Callable[[list[str]], str],
    ) -> None:
        """Poll the store until every key exists; fail on timeout naming who is missing.

        Polling with check() instead of store.wait(): wait() logs C++ warnings on timeout, and a
        poll can also notice the abort key and stop early with the real cause.
        """
        deadline = time.monotonic() + timeout_s
        with self.wait_state.waiting(f"waiting for {what}"):
            while True:
                try:
                    if self.store.check(keys):
                        return
                    reason = read_abort(self.store)
                except Exception as exc:  # any store failure: the scheduler is gone
                    raise PeerError(
                        f"lost the scheduler at {self.topo.root_uri}:{self.topo.root_port} "
                        f"while waiting for {what} ({first_line(exc)})"
                    ) from None
                if reason is not None:
                    raise PSError(
                        f"the job was aborted: {reason}; this process was waiting for {what}"
                    )
                if time.monotonic() > deadline:
                    absent = [k for k in keys if not self.store.check([k])]
                    raise PeerError(
                        f"timed out after {timeout_s:g} s waiting for {what}: "
                        f"{missing(absent)} did not get there"
                    )
                time.sleep(POLL_S)

    def finish(self) -> None:
        """Leave cleanly; see the module docstring for why the order matters."""
        self.stop_watchdog()
        if dist.is_initialized():
            dist.destroy_process_group()
        if self.topo.role != SCHEDULER:
            self.store.set(finished_key(self.topo.rank), "ok")

    def fail(self, exc: BaseException) -> int:
        """Report a fatal error (ours or a peer's), stop the job, and return the exit code."""
        message = str(exc) if isinstance(exc, PSError) else f"{type(exc).__name__}: {exc}"
        print(f"error: {message}", file=sys.stderr, flush=True)
        standing = self.abort(f"{self.topo.label} failed: {message}")
        if standing is None:
            note = f"the scheduler at {self.topo.root_uri}:{self.topo.root_port} is gone too"
        elif not standing.startswith(f"{self.topo.label} failed:"):
            note = f"the job had already been aborted: {standing}"
        else:
            note = ""
        if note:
            print(f"({note})", file=sys.stderr, flush=True)
        # No destroy_process_group: with a peer gone, gloo teardown could block on it.
        return 1


def join(topo: Topology) -> Session:
    """Meet the rest of the job at the scheduler and set up the gloo process group."""
    store = _connect(topo)
    try:
        if topo.role != SCHEDULER:
            _check_shape(topo, store)
        if store.add(claim_key(topo.rank), 1) != 1:
            raise PSError(
                f"another process already joined as {topo.label} (rank {topo.rank}); "
                "each server and worker needs its own TRAINYARD_INDEX"
            )
        record = {
            "role": topo.role,
            "index": topo.index,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "num_server": topo.num_servers,
            "num_worker": topo.num_workers,
        }
        store.set(who_key(topo.rank), json.dumps(record))
        session = Session(topo, store, {})
        _meet(session)
    except Exception as exc:
        # Tell the others at once instead of letting them wait out their join timeout.
        message = str(exc) if isinstance(exc, PSError) else first_line(exc)
        post_abort(store, f"{topo.label} failed while joining: {message}")
        if isinstance(exc, PSError):
            raise
        raise PeerError(f"joining the job failed: {message}") from exc
    return session


def _meet(session: Session) -> None:
    """Wait for everyone, learn who is where, then build the gloo group and start beating."""
    topo, store = session.topo, session.store
    ranks = list(range(topo.world_size))
    if topo.role == SCHEDULER:
        records = _gather_joins(session)
        store.set(JOINED_KEY, "1")
    else:
        session.wait_for_keys(
            [JOINED_KEY],
            topo.join_timeout_s,
            "the scheduler to see every process join",
            lambda _: "the rest of the job",
        )
        records = [json.loads(v) for v in store.multi_get([who_key(r) for r in ranks])]
    session.peers = {
        rank: Peer(str(r["role"]), int(str(r["index"])), str(r["host"]), int(str(r["pid"])))
        for rank, r in zip(ranks, records, strict=True)
    }
    dist.init_process_group(
        "gloo",
        store=dist.PrefixStore("ps/gloo", store),
        rank=topo.rank,
        world_size=topo.world_size,
        timeout=session.timeout,
    )
    if topo.role != SCHEDULER:
        session.start_watchdog()


def _connect(topo: Topology) -> dist.Store:
    address = f"{topo.root_uri}:{topo.root_port}"
    is_master = topo.role == SCHEDULER
    try:
        return dist.TCPStore(
            topo.root_uri,
            topo.root_port,
            None,
            is_master,
            timeout=timedelta(seconds=topo.join_timeout_s),
            wait_for_workers=False,
        )
    except Exception as exc:  # torch raises several types for the same failures
        if is_master:
            raise PSError(
                f"the scheduler cannot listen on {address} (DMLC_PS_ROOT_URI/DMLC_PS_ROOT_PORT): "
                f"{first_line(exc)}"
            ) from None
        raise PeerError(
            f"could not reach the scheduler at {address} within {topo.join_timeout_s:g} s: "
            f"{first_line(exc)}"
        ) from None


def _check_shape(topo: Topology, store: dist.Store) -> None:
    """Refuse to join a job of another shape: our rank would mean something else there.

    The scheduler registers first thing after it starts listening, so its record is there, or
    about to be, as soon as we are connected.
    """
    deadline = time.monotonic() + topo.join_timeout_s
    while not store.check([who_key(0)]):
        if time.monotonic() > deadline:
            raise PeerError("the scheduler accepted the connection but never registered")
        time.sleep(POLL_S)
    scheduler = json.loads(store.get(who_key(0)))
    theirs = (scheduler["num_server"], scheduler["num_worker"])
    if theirs != (topo.num_servers, topo.num_workers):
        raise PSError(
            f"this process was started for {topo.num_servers} server(s) and "
            f"{topo.num_workers} worker(s), the scheduler for {theirs[0]} and {theirs[1]}: "
            "DMLC_NUM_SERVER and DMLC_NUM_WORKER must be the same for every process of a job"
        )


def _gather_joins(session: Session) -> list[dict[str, object]]:
    """The scheduler's side of the join: print arrivals, check the job's shape, or give up."""
    topo, store = session.topo, session.store
    print(
        f"scheduler listening on port {topo.root_port}, expecting "
        f"{topo.num_servers} server(s) and {topo.num_workers} worker(s)",
        flush=True,
    )
    pending = list(range(topo.world_size))
    records: dict[int, dict[str, object]] = {}
    deadline = time.monotonic() + topo.join_timeout_s
    while pending:
        for rank in [r for r in pending if store.check([who_key(r)])]:
            record = json.loads(store.get(who_key(rank)))
            records[rank] = record
            pending.remove(rank)
            print(
                f"joined role={record['role']} index={record['index']} rank={rank} "
                f"host={record['host']} pid={record['pid']}",
                flush=True,
            )
        if pending and time.monotonic() > deadline:
            missing = ", ".join(topo.label_of(r) for r in pending)
            raise PeerError(f"{missing} did not join within {topo.join_timeout_s:g} s")
        if pending:
            time.sleep(POLL_S * 5)
    print(
        f"all joined: 1 scheduler + {topo.num_servers} server(s) + {topo.num_workers} worker(s) "
        f"= {topo.world_size} processes",
        flush=True,
    )
    return [records[r] for r in range(topo.world_size)]
