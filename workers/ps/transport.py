"""Tensors between workers and servers: gloo point-to-point with a bound on every wait.

torch.distributed.isend/irecv on the default (gloo) group. Gloo rather than NCCL even when the
workers have GPUs: servers are CPU processes, and NCCL only moves tensors between GPUs. A worker
with GPUs reduces its gradients on the device first (dist_device_sync) and ships one CPU copy.

A gloo wait that times out closes the connection to that peer for good, so a timeout is always
fatal here: it becomes a PeerError that names the peer and what we were waiting for. The one
unbounded wait (a server waiting for its next request) is guarded by the heartbeats instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from workers.ps.errors import PeerError
from workers.ps.liveness import first_line
from workers.ps.protocol import nbytes
from workers.ps.session import Session

# Long enough to never fire; the wait it bounds is watched by the heartbeats (liveness.py).
UNBOUNDED = timedelta(days=365)


@dataclass
class Pending:
    """One isend or irecv in flight; holds its tensor so that it outlives the transfer."""

    work: dist.Work
    tensor: torch.Tensor
    peer: int | None  # None: receive from any source
    is_send: bool
    what: str  # for errors: "sending push 12", "waiting for its reply to pull 3"


class Transport:
    def __init__(self, session: Session) -> None:
        self.session = session
        # Per peer rank, so that a server can say how much each worker's epoch cost it.
        self.bytes_in: dict[int, int] = {}
        self.bytes_out: dict[int, int] = {}

    def send(self, tensor: torch.Tensor, dst: int, tag: int, what: str) -> Pending:
        """Start sending; `what` completes "while ..." in errors, e.g. "sending push 12"."""
        try:
            work = dist.isend(tensor, dst, tag=tag)
        except RuntimeError as exc:
            raise self._lost(dst, what, exc) from None
        assert work is not None  # only None for ranks outside the group
        self.bytes_out[dst] = self.bytes_out.get(dst, 0) + nbytes(tensor)
        return Pending(work, tensor, dst, is_send=True, what=what)

    def recv(self, tensor: torch.Tensor, src: int | None, tag: int, what: str) -> Pending:
        """Start receiving; `what` as for send, e.g. "waiting for its reply to pull 3"."""
        try:
            work = dist.irecv(tensor, src, tag=tag)
        except RuntimeError as exc:
            raise self._lost(src, what, exc) from None
        assert work is not None
        return Pending(work, tensor, src, is_send=False, what=what)

    def wait(self, op: Pending, timeout: timedelta | None = None) -> int:
        """Block until `op` completes; return the peer's rank (-1 for a receive from any source:
        the protocol puts the sender in the message)."""
        timeout = self.session.timeout if timeout is None else timeout
        who = "any worker" if op.peer is None else self.session.describe(op.peer)
        doing = op.what if op.peer is None else f"{op.what} {'to' if op.is_send else 'from'} {who}"
        with self.session.wait_state.waiting(doing):
            try:
                op.work.wait(timeout)
            except RuntimeError as exc:
                if "timed out" in str(exc).lower():
                    raise PeerError(
                        f"no answer from {who} within {timeout.total_seconds():g} s while {op.what}"
                    ) from None
                raise self._lost(op.peer, op.what, exc) from None
        if not op.is_send and op.peer is not None:
            self.count_in(op.peer, nbytes(op.tensor))
        return op.peer if op.peer is not None else -1

    def count_in(self, src: int, size: int) -> None:
        """Account `size` bytes received; the caller does it for receives from any source, once
        the message has said who sent it (and how long it was)."""
        self.bytes_in[src] = self.bytes_in.get(src, 0) + size

    def wait_all(self, ops: list[Pending]) -> None:
        for op in ops:
            self.wait(op)
        ops.clear()

    def _lost(self, peer: int | None, what: str, exc: BaseException) -> PeerError:
        who = "a peer" if peer is None else self.session.describe(peer)
        return PeerError(f"lost {who} while {what}: {first_line(exc)}")
