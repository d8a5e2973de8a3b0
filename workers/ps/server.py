"""A server: holds its shard of the parameters and applies the optimizer to it.

One thread, one loop: receive a request header from any worker, read the request's follow-ups
from that worker, act, reply. Keeping everything on one thread means no locks, and "no two
updates happen on the same weight at the same time" (dist_async's one promise) holds trivially.

dist_sync / dist_device_sync: each slot collects one push from every worker per round, then the
mean of those gradients takes one optimizer step (the same averaged gradient a DDP rank would
get from all-reduce). A pull from a worker that has pushed into an unfinished round waits for
that round, so every worker pulls the same parameters. The two modes are the same on a server:
they differ only in where a worker adds up its own devices' gradients before pushing.

dist_async: every push is one optimizer step with that worker's gradient and learning rate, and
pulls are answered at once with whatever the parameters are now.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

import torch

from workers.ps import protocol
from workers.ps.config import Topology, read_topology
from workers.ps.errors import ProtocolError, PSError
from workers.ps.optim import OptimizerSpec, Updater
from workers.ps.protocol import Kind
from workers.ps.session import Session, join
from workers.ps.transport import UNBOUNDED, Pending, Transport


@dataclass
class Round:
    """A sync-mode slot's gradients for its current update, one per worker so far."""

    total: torch.Tensor
    workers: set[int] = field(default_factory=set)
    lrs: set[float] = field(default_factory=set)
    step: int = 0


@dataclass
class Traffic:
    pushes: int = 0
    updates: int = 0
    bytes_in: int = 0
    bytes_out: int = 0

    def add(self, other: Traffic) -> None:
        self.pushes += other.pushes
        self.updates += other.updates
        self.bytes_in += other.bytes_in
        self.bytes_out += other.bytes_out


class Server:
    def __init__(self, session: Session) -> None:
        self.session = session
        self.topo: Topology = session.topo
        self.transport = Transport(session)
        self.mode: str | None = None
        self.mode_from: int = -1
        self.updater: Updater | None = None
        self.values: dict[int, torch.Tensor] = {}  # slot -> flat float32 parameter slice
        self.ordered_slots: list[int] = []  # what ALL_SLOTS stands for
        self.capacity = 0  # elements held: the longest push that can come inline
        self.rounds: dict[int, Round] = {}  # sync only: slots with an unfinished round
        self.deferred: list[tuple[int, list[int], int]] = []  # (worker rank, slots, step)
        self.replies: list[Pending] = []
        self.stopped: set[int] = set()
        self.epoch_ends: dict[int, set[int]] = {}
        # Traffic is booked to the worker that caused it (a sync update to the worker whose push
        # completed the round) and moved into an epoch's tally when that worker says the epoch
        # ended; so an epoch's line counts exactly its own pushes, even while a fast worker is
        # already pushing the next epoch.
        self.since_epoch: dict[int, Traffic] = {r: Traffic() for r in self.topo.worker_ranks}
        self.epoch_tally: dict[int, Traffic] = {}
        self.totals = Traffic()
        self.booked: dict[int, tuple[int, int]] = {}  # worker -> transport bytes (in, out) booked
        self.warned_lr = False

    @property
    def sync(self) -> bool:
        return self.mode in protocol.SYNC_MODES

    @property
    def name(self) -> str:
        return f"server={self.topo.index}"

    def serve(self) -> None:
        workers = self.topo.num_workers
        while len(self.stopped) < workers:
            # Room for a header and, inline, a push of everything this server holds.
            head = protocol.empty_message(self.capacity)
            op = self.transport.recv(head, None, protocol.TAG_REQUEST, self._idle_what())
            # Unbounded: a dead worker is caught by the heartbeats, while a live one may pause
            # (evaluate, checkpoint) for as long as it likes between requests.
            self.transport.wait(op, timeout=UNBOUNDED)
            header = protocol.parse_header(head)
            if header.sender not in self.topo.worker_ranks:
                raise ProtocolError(
                    f"a {header.kind.name} request claims to come from rank {header.sender}"
                )
            self._handle(header, head)
            self._reap_replies(block=False)
        self._reap_replies(block=True)
        for worker in self.topo.worker_ranks:
            self._book(worker)
            self.totals.add(self.since_epoch[worker])
        print(f"{self.name} finished {self._figures(self.totals)}", flush=True)

    def _handle(self, header: protocol.Header, message: torch.Tensor) -> None:
        src, kind = header.sender, header.kind
        inline = kind in (Kind.PUSH, Kind.PUSHPULL) and header.count == protocol.ALL_SLOTS
        # Gloo does not say how long a message received into a longer buffer was; the header does.
        words = protocol.HEADER_WORDS + (self.capacity if inline else 0)
        self.transport.count_in(src, words * message.element_size())
        if kind == Kind.MODE:
            self._on_mode(src, protocol.mode_name(int(header.value)))
        elif kind == Kind.OPTIMIZER:
            self._on_optimizer(src, header.count)
        elif kind == Kind.INIT:
            self._on_init(src, header.count)
        elif kind in (Kind.PUSH, Kind.PUSHPULL):
            slots = self._on_push(src, header.count, header.value, header.step, message)
            if kind == Kind.PUSHPULL:
                self._answer_pull(src, slots, header.step)
        elif kind == Kind.PULL:
            self._on_pull(src, header.count, header.step)
        elif kind == Kind.EPOCH:
            self._on_epoch(src, header.step, header.count)
        elif kind == Kind.STOP:
            self._on_stop(src)
        else:
            raise ProtocolError(f"unexpected {kind.name} from {self.session.describe(src)}")

    # --- requests -------------------------------------------------------------------------

    def _on_mode(self, src: int, mode: str) -> None:
        if self.mode is None:
            self.mode, self.mode_from = mode, src
            print(f"{self.name} mode={mode} workers={self.topo.num_workers}", flush=True)
        elif mode != self.mode:
            raise ProtocolError(
                f"{self.topo.label_of(src)} runs kvstore {mode} but "
                f"{self.topo.label_of(self.mode_from)} runs {self.mode}: "
                "every worker must create the same kvstore type"
            )

    def _on_optimizer(self, src: int, size: int) -> None:
        body = self._recv(torch.empty(size, dtype=torch.uint8), src, "the optimizer description")
        spec = OptimizerSpec.from_json(protocol.tensor_json(body))
        self.updater = Updater(spec)
        for slot, value in self.values.items():
            self.updater.add(slot, value)
        print(f"{self.name} optimizer {spec}", flush=True)
        self._reply(src, protocol.message(Kind.ACK, self.topo.rank))

    def _on_init(self, src: int, count: int) -> None:
        table = self._recv(torch.empty(count, 2, dtype=torch.int64), src, "the init slot table")
        slots = [int(s) for s in table[:, 0].tolist()]
        sizes = [int(n) for n in table[:, 1].tolist()]
        data = self._recv(torch.empty(sum(sizes), dtype=protocol.VALUE_DTYPE), src, "init values")
        for slot, value in zip(slots, data.split(sizes), strict=True):
            if slot in self.values:
                raise ProtocolError(f"slot {slot} was initialised twice")
            self.values[slot] = value.clone()
            if self.updater is not None:
                self.updater.add(slot, self.values[slot])
        self.ordered_slots = sorted(self.values)
        self.capacity = self._params()
        print(
            f"{self.name} init keys={len(self.values)} params={self._params()} "
            f"(slots {', '.join(str(s) for s in sorted(self.values))})",
            flush=True,
        )
        self._reply(src, protocol.message(Kind.ACK, self.topo.rank))

    def _on_push(
        self, src: int, count: int, lr: float, step: int, message: torch.Tensor
    ) -> list[int]:
        slots = self._slots(src, count, f"the slot list of push {step}")
        sizes = [self.values[s].numel() for s in slots]
        if count == protocol.ALL_SLOTS:
            data = protocol.inline_part(message, self.capacity)
        else:
            data = self._recv(
                torch.empty(sum(sizes), dtype=protocol.VALUE_DTYPE),
                src,
                f"the gradients of push {step}",
            )
        self.since_epoch[src].pushes += 1
        if self.updater is None:
            raise ProtocolError(
                f"{self.topo.label_of(src)} pushed before any optimizer was set: "
                "call kv.set_optimizer(...) before the first push"
            )
        grads = list(zip(slots, data.split(sizes), strict=True))
        if self.sync:
            self._collect(src, grads, lr, step)
        else:
            self.updater.step(grads, lr)
            self.since_epoch[src].updates += 1
        return slots

    def _collect(
        self, src: int, grads: list[tuple[int, torch.Tensor]], lr: float, step: int
    ) -> None:
        if self.stopped:
            gone = ", ".join(self.topo.label_of(r) for r in sorted(self.stopped))
            raise ProtocolError(
                f"{self.topo.label_of(src)} pushed step {step} after {gone} stopped, so that "
                "round can never complete: in sync mode every worker must push the same "
                "number of times (give every worker the same number of batches)"
            )
        ready: list[tuple[int, Round]] = []
        for slot, grad in grads:
            rnd = self.rounds.get(slot)
            if rnd is None:
                rnd = self.rounds[slot] = Round(grad.clone(), step=step)
            elif src in rnd.workers:
                raise ProtocolError(
                    f"{self.topo.label_of(src)} pushed slot {slot} twice before the round of "
                    f"step {rnd.step} completed: in sync mode pull after each push"
                )
            else:
                rnd.total += grad
            rnd.workers.add(src)
            rnd.lrs.add(lr)
            if len(rnd.workers) == self.topo.num_workers:
                ready.append((slot, rnd))
        if not ready:
            return
        for slot, rnd in ready:
            del self.rounds[slot]
            if len(rnd.lrs) > 1 and not self.warned_lr:
                self.warned_lr = True
                print(
                    f"{self.name} warning: workers pushed different learning rates "
                    f"{sorted(rnd.lrs)} for step {rnd.step}; using {lr}",
                    file=sys.stderr,
                    flush=True,
                )
        assert self.updater is not None
        # Mean over workers: each pushed the mean gradient of its own batch, so this is the mean
        # over the global batch of W x b, as DDP's all-reduce computes it.
        self.updater.step([(slot, rnd.total / self.topo.num_workers) for slot, rnd in ready], lr)
        self.since_epoch[src].updates += 1
        waiting, self.deferred = self.deferred, []
        for worker, slots, pull_step in waiting:
            self._answer_pull(worker, slots, pull_step)

    def _on_pull(self, src: int, count: int, step: int) -> None:
        slots = self._slots(src, count, f"the slot list of pull {step}")
        self._answer_pull(src, slots, step)

    def _answer_pull(self, src: int, slots: list[int], step: int) -> None:
        if self.sync and any(src in self.rounds[s].workers for s in slots if s in self.rounds):
            self.deferred.append((src, slots, step))  # until the others have pushed too
            return
        self._reply(src, torch.cat([self.values[s].detach() for s in slots]))

    def _on_epoch(self, src: int, epoch: int, epochs: int) -> None:
        self._book(src)
        tally = self.epoch_tally.setdefault(epoch, Traffic())
        tally.add(self.since_epoch[src])
        self.totals.add(self.since_epoch[src])
        self.since_epoch[src] = Traffic()
        done = self.epoch_ends.setdefault(epoch, set())
        done.add(src)
        if len(done) == self.topo.num_workers:
            del self.epoch_ends[epoch]
            figures = self._figures(self.epoch_tally.pop(epoch))
            print(f"{self.name} epoch={epoch}/{epochs} {figures}", flush=True)

    def _on_stop(self, src: int) -> None:
        self.stopped.add(src)
        if not self.sync:
            return
        for slot, rnd in self.rounds.items():
            if src not in rnd.workers:
                raise ProtocolError(
                    f"{self.topo.label_of(src)} stopped, but the round of step {rnd.step} (slot "
                    f"{slot}) still waits for its push: in sync mode every worker must push the "
                    "same number of times (give every worker the same number of batches)"
                )

    # --- helpers --------------------------------------------------------------------------

    def _recv(self, tensor: torch.Tensor, src: int, what: str) -> torch.Tensor:
        self.transport.wait(
            self.transport.recv(tensor, src, protocol.TAG_DATA, f"receiving {what}")
        )
        return tensor

    def _slots(self, src: int, count: int, what: str) -> list[int]:
        if count == protocol.ALL_SLOTS:
            return self.ordered_slots
        slots = [int(s) for s in self._recv(torch.empty(count, dtype=torch.int64), src, what)]
        unknown = [s for s in slots if s not in self.values]
        if unknown:
            raise ProtocolError(
                f"{self.topo.label_of(src)} used slots {unknown} that were never initialised "
                "here: call kv.init on every worker with the same keys, in the same order"
            )
        return slots

    def _reply(self, dst: int, tensor: torch.Tensor) -> None:
        self.replies.append(self.transport.send(tensor, dst, protocol.TAG_REPLY, "replying to it"))

    def _reap_replies(self, block: bool) -> None:
        still = []
        for op in self.replies:
            if block or op.work.is_completed():
                self.transport.wait(op)
            else:
                still.append(op)
        self.replies = still

    def _idle_what(self) -> str:
        if self.rounds:
            step = min(r.step for r in self.rounds.values())
            have = set.union(*(r.workers for r in self.rounds.values()))
            missing = [r for r in self.topo.worker_ranks if r not in have]
            names = ", ".join(self.topo.label_of(r) for r in missing) or "any worker"
            return f"waiting for the push of step {step} from {names}"
        return "waiting for its next request"

    def _params(self) -> int:
        return sum(v.numel() for v in self.values.values())

    def _book(self, worker: int) -> None:
        """Move the transport's byte counts for `worker` since the last booking to its tally."""
        now = (self.transport.bytes_in.get(worker, 0), self.transport.bytes_out.get(worker, 0))
        before = self.booked.get(worker, (0, 0))
        self.since_epoch[worker].bytes_in += now[0] - before[0]
        self.since_epoch[worker].bytes_out += now[1] - before[1]
        self.booked[worker] = now

    def _figures(self, t: Traffic) -> str:
        return (
            f"pushes={t.pushes} updates={t.updates} bytes_in={t.bytes_in} "
            f"bytes_out={t.bytes_out} keys={len(self.values)} params={self._params()}"
        )


def run_server(topo: Topology | None = None) -> int:
    """Run this process as a server until every worker has stopped; return the exit code."""
    try:
        topo = read_topology() if topo is None else topo
        session = join(topo)
    except PSError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 1
    try:
        Server(session).serve()
    except Exception as exc:  # every failure must stop the job, not hang it
        return session.fail(exc)
    session.finish()
    return 0
