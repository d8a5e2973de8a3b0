"""The worker's side: an MXNet-style kvstore whose values live on the servers.

    kv = ps.create("dist_sync")          # joins the job (scheduler, servers, other workers)
    kv.set_optimizer(ps.sgd(...))         # worker 0's reaches the servers
    kv.init(keys, values)                 # worker 0's values; every worker must call it alike
    kv.pull(keys, out=params)             # everyone starts from the same weights
    loop: kv.set_learning_rate(lr); backward; kv.pushpull(keys, grads, out=params)
    kv.close()

(pushpull is push then pull in one round trip per server; both also exist on their own.)

Keys are ints or strings; a value is a tensor or, for a worker with several devices, a list of
tensors (one per device) that is averaged before it is pushed. Gradients are means over their
batch and the servers average them over workers, so the update is the one a single machine
would make with the global batch of W x b (the batch size a user gives is per machine).

dist_sync averages a worker's devices on the CPU; dist_device_sync averages them on the first
device and ships only the result (less host traffic on GPU workers). With one CPU device, as
here, the two are the same computation.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType
from typing import Self, cast

import torch

from workers.ps import protocol
from workers.ps.board import EpochBoard
from workers.ps.config import WORKER, Topology, label, read_topology
from workers.ps.errors import ConfigError, PSError
from workers.ps.optim import OptimizerSpec
from workers.ps.protocol import Kind
from workers.ps.session import Session, join
from workers.ps.sharding import DEFAULT_BIG_ARRAY_BOUND, Key, Sharder, Slice
from workers.ps.transport import Pending, Transport

Value = torch.Tensor | Sequence[torch.Tensor]


class KVStore:
    """One worker's handle on the job's parameters; made by `create`, closed by `close`."""

    def __init__(self, session: Session, mode: str, big_array_bound: int) -> None:
        topo = session.topo
        self.type = mode
        self.rank = topo.index  # the worker's index, as MXNet's kv.rank
        self.num_workers = topo.num_workers
        self.num_servers = topo.num_servers
        self.board = EpochBoard(session)
        self._session = session
        self._topo: Topology = topo
        self._transport = Transport(session)
        self._sharder = Sharder(topo.num_servers, big_array_bound)
        self._slices: dict[Key, list[Slice]] = {}
        self._shapes: dict[Key, torch.Size] = {}
        self._held: dict[int, list[int]] = {r: [] for r in topo.server_ranks}  # rank -> slots
        self._sends: list[Pending] = []
        self._lr: float | None = None
        self._pushes = 0
        self._pulls = 0
        self._barriers = 0
        self._closed = False
        for server in topo.server_ranks:
            self._send(server, self._header(Kind.MODE, value=protocol.mode_code(mode)), "mode")

    # --- MXNet's kvstore interface ------------------------------------------------------------

    def set_optimizer(self, spec: OptimizerSpec) -> None:
        """Worker 0 sends the update rule to every server; all workers then meet at a barrier."""
        if self._lr is None:
            self._lr = spec.lr
        if self.rank == 0:
            body = protocol.json_tensor(spec.to_json())
            for server in self._topo.server_ranks:
                head = self._header(Kind.OPTIMIZER, body.numel())
                self._send(server, head, "optimizer", body)
            self._wait_acks("the optimizer")
        self.barrier()

    def init(self, keys: Key | Sequence[Key], values: Value | Sequence[Value]) -> None:
        """Place the keys on the servers (every worker computes the same plan) and, on worker 0,
        send their initial values. Like MXNet, this does not change `values`: pull afterwards."""
        key_list, value_list = _pairs(keys, values)
        tensors = [
            self._flatten(key, value, check=False)
            for key, value in zip(key_list, value_list, strict=True)
        ]
        duplicate = [k for k in key_list if k in self._slices]
        if duplicate:
            raise PSError(f"keys {duplicate} were initialised before")
        plan = self._sharder.assign(
            [(k, t.numel()) for k, t in zip(key_list, tensors, strict=True)]
        )
        for key, value in zip(key_list, value_list, strict=True):
            self._slices[key] = plan[key]
            self._shapes[key] = _first(value).shape
            for s in plan[key]:
                self._held[self._topo.server_ranks[s.server]].append(s.slot)
        for slots in self._held.values():
            slots.sort()
        if self.rank == 0:
            for server, parts in self._by_server(
                key_list, dict(zip(key_list, tensors, strict=True))
            ).items():
                table = torch.tensor([[s.slot, s.size] for s, _ in parts], dtype=torch.int64)
                body = torch.cat([t for _, t in parts])
                self._send(server, self._header(Kind.INIT, len(parts)), "init", table, body)
            self._wait_acks("init")
            print(f"sharding {self.describe_sharding()}", flush=True)
        self.barrier()

    def set_learning_rate(self, lr: float) -> None:
        """The learning rate the servers use for this worker's following pushes."""
        if not lr > 0:
            raise ValueError("the learning rate must be positive")
        self._lr = float(lr)

    def push(self, keys: Key | Sequence[Key], values: Value | Sequence[Value]) -> None:
        """Send gradients; in the sync modes the servers update once every worker has pushed."""
        key_list, value_list = _pairs(keys, values)
        self._flush()
        self._request(Kind.PUSH, key_list, self._gradients(key_list, value_list))

    def pull(self, keys: Key | Sequence[Key], out: Value | Sequence[Value]) -> None:
        """Copy the servers' current values into `out` (in the sync modes: after the round this
        worker last pushed into has been applied, so every worker sees the same values)."""
        key_list, out_list = _pairs(keys, out)
        self._receive(self._request(Kind.PULL, key_list, None), key_list, out_list)

    def pushpull(
        self,
        keys: Key | Sequence[Key],
        values: Value | Sequence[Value],
        out: Value | Sequence[Value],
    ) -> None:
        """push then pull in one round trip per server: the server answers the push itself."""
        key_list, value_list = _pairs(keys, values)
        _, out_list = _pairs(keys, out)
        grads = self._gradients(key_list, value_list)
        self._flush()
        self._receive(self._request(Kind.PUSHPULL, key_list, grads), key_list, out_list)

    def barrier(self) -> None:
        """Wait until every worker gets here (through the scheduler, as ps-lite's barrier)."""
        self._flush()
        self._barriers += 1
        n = self._barriers
        store = self._session.store
        store.set(f"ps/barrier/{n}/{self.rank}", "1")
        keys = [f"ps/barrier/{n}/{w}" for w in range(self.num_workers)]
        self._session.wait_for_keys(
            keys,
            self._topo.timeout_s,
            f"barrier {n} of the workers",
            lambda absent: ", ".join(label(WORKER, int(k.rsplit("/", 1)[1])) for k in absent),
        )

    # --- Trainyard's additions ----------------------------------------------------------------

    def mark_epoch(self, epoch: int, epochs: int) -> None:
        """Tell the servers this worker finished `epoch` (1-based) of `epochs`, so that they log
        their traffic per epoch."""
        for server in self._topo.server_ranks:
            self._send(
                server, self._header(Kind.EPOCH, count=epochs, step=epoch), f"end of epoch {epoch}"
            )

    def describe_sharding(self) -> str:
        held: dict[int, tuple[int, int]] = {}
        for slices in self._slices.values():
            for s in slices:
                keys, params = held.get(s.server, (0, 0))
                held[s.server] = (keys + 1, params + s.size)
        return " ".join(
            f"server-{i}:keys={held.get(i, (0, 0))[0]},params={held.get(i, (0, 0))[1]}"
            for i in range(self.num_servers)
        )

    def close(self) -> None:
        """Tell every server this worker is done, then leave the job cleanly."""
        if self._closed:
            return
        self._closed = True
        for server in self._topo.server_ranks:
            self._send(server, self._header(Kind.STOP), "stop")
        self._flush()
        self._session.finish()

    def fail(self, exc: BaseException) -> int:
        """Report `exc`, stop the whole job at once, and return the exit code to use."""
        self._closed = True
        return self._session.fail(exc)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            self.close()
        elif not self._closed:
            # Stop the others now rather than after a heartbeat timeout; the caller reports exc.
            self._closed = True
            self._session.abort(f"{self._topo.label} failed: {exc}")

    # --- internals ----------------------------------------------------------------------------

    @property
    def _sync(self) -> bool:
        return self.type in protocol.SYNC_MODES

    def _gradients(self, keys: list[Key], values: list[Value]) -> dict[Key, torch.Tensor]:
        if self._lr is None:
            raise PSError("push before set_optimizer: the servers have no update rule yet")
        return {k: self._flatten(k, v, check=True) for k, v in zip(keys, values, strict=True)}

    def _request(
        self, kind: Kind, keys: list[Key], grads: dict[Key, torch.Tensor] | None
    ) -> list[tuple[Pending, list[Slice]]]:
        """Send one request per server concerned; post a receive for each reply it will send."""
        unknown = [k for k in keys if k not in self._slices]
        if unknown:
            raise PSError(f"keys {unknown} were never initialised (call kv.init first)")
        if grads is not None:
            self._pushes += 1
        else:
            self._pulls += 1
        step = self._pushes
        name = f"{kind.name.lower()} {step if grads is not None else self._pulls}"
        replies = []
        for server, parts in self._by_server(keys, grads).items():
            parts.sort(key=lambda part: part[0].slot)
            slices = [s for s, _ in parts]
            ids = [s.slot for s in slices]
            lr = self._lr if grads is not None and self._lr is not None else 0.0
            data = [t for _, t in parts] if grads is not None else []
            if ids == self._held[server]:
                # The usual request covers every slot the server holds: say "all" instead of
                # sending the list, and put the gradients in the same message.
                head = self._header(kind, protocol.ALL_SLOTS, lr, step, inline=data)
                self._send(server, head, name)
            else:
                head = self._header(kind, len(ids), lr, step)
                follow = [torch.tensor(ids, dtype=torch.int64)]
                if data:
                    follow.append(torch.cat(data))
                self._send(server, head, name, *follow)
            if kind != Kind.PUSH:
                buffer = torch.empty(sum(s.size for s in slices), dtype=protocol.VALUE_DTYPE)
                what = f"waiting for its reply to {name}"
                if self._sync and self._pushes:
                    what += f" (in sync mode it also waits for the other workers' push {step})"
                op = self._transport.recv(buffer, server, protocol.TAG_REPLY, what)
                replies.append((op, slices))
        return replies

    def _receive(
        self, replies: list[tuple[Pending, list[Slice]]], keys: list[Key], outs: list[Value]
    ) -> None:
        """Wait for the replies and copy each key's value, reassembled from its slices, out."""
        self._flush()
        pieces: dict[Key, list[tuple[Slice, torch.Tensor]]] = {k: [] for k in keys}
        for op, slices in replies:
            self._transport.wait(op)
            sizes = [s.size for s in slices]
            for s, part in zip(slices, op.tensor.split(sizes), strict=True):
                pieces[s.key].append((s, part))
        with torch.no_grad():
            for key, value in zip(keys, outs, strict=True):
                flat = _assemble(pieces[key])
                for target in _as_list(value):
                    target.copy_(flat.view(self._shapes[key]))

    def _header(
        self,
        kind: Kind,
        count: int = 0,
        value: float = 0.0,
        step: int = 0,
        inline: list[torch.Tensor] | None = None,
    ) -> torch.Tensor:
        return protocol.message(kind, self._topo.rank, count, value, step, inline)

    def _send(self, server: int, head: torch.Tensor, what: str, *follow: torch.Tensor) -> None:
        """A request: its header on the request tag, its follow-ups on the data tag."""
        self._sends.append(
            self._transport.send(head, server, protocol.TAG_REQUEST, f"sending {what}")
        )
        for tensor in follow:
            self._sends.append(
                self._transport.send(tensor, server, protocol.TAG_DATA, f"sending {what}")
            )

    def _flush(self) -> None:
        """Wait until everything sent so far has gone out (bounded, like every wait)."""
        self._transport.wait_all(self._sends)

    def _wait_acks(self, what: str) -> None:
        acks = [
            self._transport.recv(
                protocol.empty_message(), s, protocol.TAG_REPLY, f"waiting for it to confirm {what}"
            )
            for s in self._topo.server_ranks
        ]
        self._flush()
        self._transport.wait_all(acks)

    def _by_server(
        self, keys: list[Key], flats: dict[Key, torch.Tensor] | None
    ) -> dict[int, list[tuple[Slice, torch.Tensor]]]:
        """Group the keys' slices by server rank; with `flats`, also cut out each slice's data."""
        if len(set(keys)) != len(keys):
            raise PSError("a key appears twice in one call")
        empty = torch.empty(0)
        out: dict[int, list[tuple[Slice, torch.Tensor]]] = {}
        for key in keys:
            for s in self._slices[key]:
                data = flats[key][s.start : s.stop] if flats is not None else empty
                out.setdefault(self._topo.server_ranks[s.server], []).append((s, data))
        return out

    def _flatten(self, key: Key, value: Value, check: bool) -> torch.Tensor:
        """One flat float32 CPU tensor per key; several devices' tensors are averaged first."""
        tensors = _as_list(value)
        if not tensors:
            raise PSError(f"key {key!r}: empty list of values")
        if check:
            if key not in self._slices:
                raise PSError(f"push of key {key!r} that was never initialised")
            for t in tensors:
                if t.shape != self._shapes[key]:
                    raise PSError(
                        f"key {key!r}: shape {tuple(t.shape)} does not match the initialised "
                        f"{tuple(self._shapes[key])}"
                    )
        return merge_devices(tensors, on_device=self.type == "dist_device_sync")


def create(
    mode: str = "dist_sync",
    topo: Topology | None = None,
    big_array_bound: int = DEFAULT_BIG_ARRAY_BOUND,
) -> KVStore:
    """Join the job as a worker and return its kvstore (MXNet's `mx.kv.create`)."""
    if mode not in protocol.MODES:
        raise ConfigError(
            f"kvstore type {mode!r} is not supported here; use one of {', '.join(protocol.MODES)}"
        )
    topo = read_topology() if topo is None else topo
    if topo.role != WORKER:
        raise ConfigError(
            f"this process is the {topo.label}, not a worker: call run_scheduler() or "
            "run_server() for that role"
        )
    session = join(topo)
    try:
        return KVStore(session, mode, big_array_bound)
    except Exception as exc:
        session.abort(f"{topo.label} failed: {exc}")
        raise


def merge_devices(tensors: Sequence[torch.Tensor], on_device: bool) -> torch.Tensor:
    """One worker's value for a key: the mean over its devices, as one flat float32 CPU tensor.

    on_device (dist_device_sync) averages on the first tensor's device and copies one result to
    the host; otherwise (dist_sync) every device's tensor is copied and averaged on the host.
    """
    if len(tensors) == 1:
        merged = tensors[0].detach()
    elif on_device:
        device = tensors[0].device
        merged = torch.stack([t.detach().to(device) for t in tensors]).mean(dim=0)
    else:
        merged = torch.stack([t.detach().cpu() for t in tensors]).mean(dim=0)
    return merged.reshape(-1).to(device="cpu", dtype=protocol.VALUE_DTYPE)


def _as_list(value: Value) -> list[torch.Tensor]:
    return [value] if isinstance(value, torch.Tensor) else list(value)


def _first(value: Value) -> torch.Tensor:
    return _as_list(value)[0]


def _pairs(
    keys: Key | Sequence[Key], values: Value | Sequence[Value]
) -> tuple[list[Key], list[Value]]:
    """Accept MXNet's two call shapes: one key and its value, or a list of each."""
    if isinstance(keys, str | int):
        return [keys], [cast(Value, values)]
    key_list = list(keys)
    value_list: list[Value] = [values] if isinstance(values, torch.Tensor) else list(values)
    if len(key_list) != len(value_list):
        raise PSError(f"{len(key_list)} keys but {len(value_list)} values")
    return key_list, value_list


def _assemble(parts: list[tuple[Slice, torch.Tensor]]) -> torch.Tensor:
    if len(parts) == 1:
        return parts[0][1]
    size = max(s.stop for s, _ in parts)
    flat = torch.empty(size, dtype=protocol.VALUE_DTYPE)
    for s, part in parts:
        flat[s.start : s.stop] = part
    return flat
