"""The digits example as a parameter-server job: 1 scheduler, S servers, W workers (MXNet style).

The same data split, model, per-worker shards and learning-rate schedule as digits_ddp.py (they
are imported from it), but the gradients go to parameter servers, which average them and run the
optimizer, instead of being all-reduced among the workers. With --kvstore dist_sync (default) and
the same seed and per-worker batch, W workers print the same per-epoch losses as digits_ddp.py
with W ranks: same initial weights, same shards in the same order, the mean gradient of the
global batch of W x b, and the same Nesterov SGD step with the same learning rate.

--kvstore dist_device_sync is identical here: it only differs on workers with several GPUs,
which average their devices' gradients on the GPU before pushing. --kvstore dist_async applies
every worker's push on its own as it arrives; each update then comes from one batch of b
samples, so the learning rate is the single-machine one (no scaling by W, no warm-up).

Each process learns its role from DMLC_ROLE; the platform starts all of them with the same
arguments. Worker 0 prints the job-wide line per epoch and ends with
`final eval_accuracy=<accuracy> wall_time_s=<s>`.

Checkpoints (docs/checkpoints.md), when TRAINYARD_CHECKPOINT_DIR is set: after every epoch worker
0 pulls the weights from the servers (which hold the authoritative copy) and writes them to
`latest.pt` there, atomically, as digits_ddp.py does; at the end it also writes `model.pt`. A job
that finds `latest.pt` at start continues from it: worker 0 initialises the servers with the
saved weights, every worker continues with the epoch after the saved one, and worker 0 prints
`resumed from checkpoint <path> at epoch=E/N (restart R)`. The servers' optimizer state
(Nesterov momentum) is not saved: it starts from zero again after a resume, so a resumed run
ends close to, not exactly at, an uninterrupted one.

On SIGTERM a worker stops at its next step boundary and exits with status 143; worker 0 first
saves its own copy of the weights as a mid-epoch checkpoint (`SIGTERM: saved checkpoint at
epoch=E step=S/T; exiting`; the servers, stopped too, may be gone already). In the sync modes
that copy is exactly the servers' weights after the last completed step. The scheduler and the
servers keep the default SIGTERM behaviour: they hold nothing that is not in the checkpoint.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler

from workers import ps

# Only workers import digits_ddp (and through it scikit-learn): the scheduler and servers of a
# job start faster without it. So its names are imported inside the functions that use them.
if TYPE_CHECKING:
    from workers.examples.digits_ddp import Data, Position, StopRequest


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--kvstore",
        choices=ps.MODES,
        # The mode picked in Trainyard's form arrives as TRAINYARD_KVSTORE.
        default=os.environ.get("TRAINYARD_KVSTORE") or "dist_sync",
        help="how servers apply the workers' gradients",
    )
    parser.add_argument("--epochs", type=int, default=20, help="passes over the data")
    parser.add_argument(
        "--batch-size", type=int, default=32, help="mini-batch size per worker, not global"
    )
    parser.add_argument(
        "--lr",
        type=float,
        default=0.05,
        help="learning rate for one machine; sync modes scale it by the number of workers",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="the same number gives the same initial weights and data order",
    )
    args = parser.parse_args(argv)
    if args.epochs < 1 or args.batch_size < 1 or args.lr <= 0:
        parser.error("--epochs and --batch-size must be at least 1 and --lr positive")
    return args


@dataclass
class Worker:
    """What one worker trains with, built by `set_up`."""

    args: argparse.Namespace
    kv: ps.KVStore
    data: Data
    sampler: DistributedSampler[int]
    loader: DataLoader[tuple[torch.Tensor, ...]]
    model: nn.Module
    names: list[str]
    params: list[nn.Parameter]
    checkpoints: Path | None
    stop: StopRequest

    @property
    def steps_per_epoch(self) -> int:
        return len(self.loader)

    def settings(self) -> dict[str, Any]:
        from workers.examples.digits_ddp import run_settings

        return {**run_settings(self.args, self.kv.num_workers), "kvstore": self.kv.type}


def set_up(
    args: argparse.Namespace,
    kv: ps.KVStore,
    data: Data,
    checkpoints: Path | None,
    stop: StopRequest,
) -> Worker:
    from workers.examples.digits_ddp import build_model

    workers, me = kv.num_workers, kv.rank
    sync = kv.type in ps.SYNC_MODES
    # Worker i reads the shard DDP's rank i reads: same sampler, same seed, same epochs.
    sampler: DistributedSampler[int] = DistributedSampler(
        data.train, num_replicas=workers, rank=me, shuffle=True, seed=args.seed
    )
    loader = DataLoader(data.train, batch_size=args.batch_size, sampler=sampler)
    # The batch size is per machine; a sync update sees W of them, an async one 1.
    batch = (
        f"global_batch={workers * args.batch_size}" if sync else f"update_batch={args.batch_size}"
    )
    print(
        f"worker {me}/{workers} kvstore={kv.type} servers={kv.num_servers} "
        f"batch_size={args.batch_size} {batch} lr_scale={lr_scale(kv)} shard={len(sampler)} "
        "samples devices=cpu",
        flush=True,
    )
    model = build_model(args.seed)
    names = [name for name, _ in model.named_parameters()]
    params = [p for _, p in model.named_parameters()]
    return Worker(args, kv, data, sampler, loader, model, names, params, checkpoints, stop)


def lr_scale(kv: ps.KVStore) -> int:
    """One update per round of W pushes in the sync modes (the linear scaling rule of DDP), one
    update per push in dist_async: there the rate is the one-machine rate with batch b."""
    return kv.num_workers if kv.type in ps.SYNC_MODES else 1


def resume(run: Worker, saved: dict[str, Any] | None) -> Position:
    """Put the checkpoint's weights into the model, before kv.init sends worker 0's to the
    servers; return where to continue. Every worker reads the file to learn where that is."""
    from workers.examples.digits_ddp import (
        CHECKPOINT_NAME,
        Position,
        describe_position,
        restart_count,
        resume_position,
    )

    me = run.kv.rank
    if saved is None:
        if me == 0 and restart_count() > 0:
            print(f"no checkpoint to resume from (restart {restart_count()})", flush=True)
        return Position()
    run.model.load_state_dict(saved["model"])
    torch.set_rng_state(saved["torch_rng"])
    position = resume_position(saved, run.settings(), keeps_sums=me == 0, announce=me == 0)
    if me == 0:
        where = describe_position(position, run.args.epochs, run.steps_per_epoch)
        path = (run.checkpoints or Path()) / CHECKPOINT_NAME
        print(f"resumed from checkpoint {path} at {where} (restart {restart_count()})", flush=True)
    return position


def save_weights(run: Worker, weights: list[torch.Tensor], position: Position) -> None:
    """Worker 0's save of `weights` (named as the model's parameters) at `position`. Only the
    weights: the optimizer state lives on the servers, which do not hand it out."""
    from workers.examples.digits_ddp import CHECKPOINT_NAME, checkpoint_state, save_atomically

    if run.checkpoints is None:
        return
    named = dict(zip(run.names, weights, strict=True))
    state = checkpoint_state(named, None, position, run.settings())
    save_atomically(state, run.checkpoints / CHECKPOINT_NAME)


def save_epoch(run: Worker, position: Position) -> None:
    """Worker 0's end-of-epoch save of the servers' current weights."""
    if run.kv.rank != 0 or run.checkpoints is None:
        return
    # The servers hold the authoritative weights (in dist_async they have the other workers'
    # latest updates, which our copy lacks). Pulled into buffers of our own, so that training
    # goes on with exactly the weights it would have had without checkpoints.
    weights = [torch.empty_like(p) for p in run.params]
    run.kv.pull(run.names, out=weights)
    save_weights(run, weights, position)


def halt(run: Worker, position: Position) -> NoReturn:
    """SIGTERM: worker 0 saves its own copy of the weights at `position`, then the worker exits
    143. No pull: the servers got SIGTERM too and may be gone. In the sync modes that copy is the
    servers' weights after the last completed step; in dist_async, those of its last reply."""
    from workers.examples.digits_ddp import exit_stopped

    where = f"epoch={position.epochs_done} step={position.steps_done}/{run.steps_per_epoch}"
    if run.kv.rank != 0:
        print(f"SIGTERM: worker {run.kv.rank} stopping at {where}; exiting", flush=True)
    elif run.checkpoints is None:
        print(f"SIGTERM: stopping at {where}; exiting (TRAINYARD_CHECKPOINT_DIR unset)", flush=True)
    else:
        save_weights(run, [p.detach() for p in run.params], position)
        print(f"SIGTERM: saved checkpoint at {where}; exiting", flush=True)
    exit_stopped()


def train(
    args: argparse.Namespace,
    kv: ps.KVStore,
    data: Data,
    started: float,
    checkpoints: Path | None,
    saved: dict[str, Any] | None,
    stop: StopRequest,
) -> None:
    from workers.examples.digits_ddp import (
        Position,
        evaluate,
        learning_rate,
        metrics,
        remove_temporary_files,
    )

    run = set_up(args, kv, data, checkpoints, stop)
    model, names, params = run.model, run.names, run.params
    me = kv.rank
    sync = kv.type in ps.SYNC_MODES
    position = resume(run, saved)
    # The servers run the same step DDP's optimizer runs on every rank.
    kv.set_optimizer(ps.sgd(lr=args.lr, momentum=0.9, nesterov=True))
    kv.init(names, [p.detach() for p in params])
    kv.pull(names, out=params)  # everyone starts from worker 0's weights
    if me == 0 and checkpoints is not None:
        remove_temporary_files(checkpoints)
    local: dict[int, tuple[float, float]] = {}  # worker 0: epoch -> (lr, eval accuracy)
    accuracy: float | None = None
    # The epoch board numbers the epochs of this attempt from 1; `first` maps them back.
    first = position.epochs_done
    steps = run.steps_per_epoch
    metrics.declare(total_steps=args.epochs * steps, total_epochs=args.epochs)
    # Until here a SIGTERM ends the process at once, which is right: there is nothing to save.
    stop.install()

    for epoch in range(first, args.epochs):
        lr = learning_rate(epoch, args.epochs, args.lr, lr_scale(kv))
        kv.set_learning_rate(lr)
        loss_sum, seen, rate = train_epoch(run, epoch, position)
        kv.mark_epoch(epoch + 1, args.epochs)
        kv.board.post(epoch + 1 - first, [loss_sum, float(seen), rate])
        # Each worker its own loss and throughput (the console averages and adds them up).
        local_loss = loss_sum / seen if seen else float("nan")
        metrics.report(
            step=(epoch + 1) * steps, epoch=epoch + 1, loss=local_loss, lr=lr, samples_per_sec=rate
        )
        if me == 0:
            accuracy = evaluate(model, data, torch.device("cpu"))
            metrics.report(step=(epoch + 1) * steps, epoch=epoch + 1, eval_accuracy=accuracy)
            local[epoch + 1] = (lr, accuracy)
            # Saved before the epoch's line: every epoch a log shows as done is saved.
            save_epoch(run, Position(epoch + 1))
            # In sync modes the others finish each epoch with us; in dist_async nobody waits
            # for anybody, so lines for epochs the others have not finished come later.
            print_epochs(kv, local, args.epochs, first, through=epoch + 1 if sync else None)
        else:
            print(
                f"epoch={epoch + 1}/{args.epochs} worker={me} local_loss={local_loss:.4f} "
                f"local_samples_per_sec={rate:.1f}",
                flush=True,
            )
        position = Position(epoch + 1)

    # Every worker's last push has been applied once all are here.
    kv.barrier()
    if me == 0:
        finish(run, local, first, accuracy, started)


def train_epoch(run: Worker, epoch: int, start: Position) -> tuple[float, int, float]:
    """Train epoch `epoch` (0-based) from `start`; return this worker's loss sum, samples seen
    and samples per second. On SIGTERM this does not return (see `halt`)."""
    from workers.examples.digits_ddp import Position

    kv, names, params, steps = run.kv, run.names, run.params, run.steps_per_epoch
    run.sampler.set_epoch(epoch)
    epoch_start = time.perf_counter()
    loss_sum, seen = start.loss_sum, start.seen
    # After a mid-epoch resume, the batches already trained are skipped (same order).
    batches = islice(run.loader, start.steps_done, None)
    for k, (batch_x, batch_y) in enumerate(batches, start=start.steps_done):
        if run.stop.requested:
            halt(run, Position(epoch, k, loss_sum, seen))
        run.model.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(run.model(batch_x), batch_y)
        loss.backward()
        try:
            # push + pull in one round trip; in the sync modes the reply waits for the others.
            kv.pushpull(names, [p.grad for p in params if p.grad is not None], out=params)
        except ps.PSError:
            # After a SIGTERM: a server that got it first is gone. Our copy is still the
            # weights after batch k-1 (a failed pushpull copies nothing into params).
            if not run.stop.requested:
                raise
            halt(run, Position(epoch, k, loss_sum, seen))
        loss_sum += loss.item() * len(batch_y)
        seen += len(batch_y)
    if run.stop.requested:
        halt(run, Position(epoch, steps, loss_sum, seen))
    elapsed = time.perf_counter() - epoch_start
    return loss_sum, seen, (seen - start.seen) / elapsed if elapsed > 0 else 0.0


def finish(
    run: Worker,
    local: dict[int, tuple[float, float]],
    first: int,
    accuracy: float | None,
    started: float,
) -> None:
    """Worker 0's last lines, and the final weights as model.pt."""
    from workers.examples.digits_ddp import FINAL_WEIGHTS_NAME, evaluate, save_atomically

    kv, args = run.kv, run.args
    print_epochs(kv, local, args.epochs, first, through=args.epochs)
    if kv.type not in ps.SYNC_MODES:
        kv.pull(run.names, out=run.params)  # the others' last updates came after ours
    if kv.type not in ps.SYNC_MODES or accuracy is None:  # None: no epoch was left to train
        accuracy = evaluate(run.model, run.data, torch.device("cpu"))
    if run.checkpoints is not None:
        path = run.checkpoints / FINAL_WEIGHTS_NAME
        save_atomically(run.model.state_dict(), path)
        print(f"saved checkpoint={path}", flush=True)
    print(
        f"final eval_accuracy={accuracy:.4f} wall_time_s={time.perf_counter() - started:.1f}",
        flush=True,
    )


def print_epochs(
    kv: ps.KVStore,
    local: dict[int, tuple[float, float]],
    epochs: int,
    first: int,
    through: int | None,
) -> None:
    """Worker 0's job-wide lines, computed as digits_ddp.py's rank 0 computes them.

    The board counts this attempt's epochs from 1; `first` is the number of epochs done before
    it (by earlier attempts, as the checkpoint says)."""
    for board_epoch, rows in kv.board.collect(through=None if through is None else through - first):
        epoch = first + board_epoch
        loss_sum = sum(row[0] for row in rows)
        seen = sum(row[1] for row in rows)
        rate = sum(row[2] for row in rows)
        lr, accuracy = local[epoch]
        print(
            f"epoch={epoch}/{epochs} loss={loss_sum / seen:.4f} lr={lr:.4f} "
            f"samples_per_sec={rate:.1f} eval_accuracy={accuracy:.4f}",
            flush=True,
        )


def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()
    # What torch's import made lives as long as the process: no collection walks it again,
    # and the exit does not wait for one (digits_ddp.freeze_imports).
    gc.freeze()
    args = parse_args(argv)
    try:
        topo = ps.read_topology()
    except ps.ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    if topo.role == ps.SCHEDULER:
        return ps.run_scheduler(topo)
    if topo.role == ps.SERVER:
        return ps.run_server(topo)
    # Only workers need the data and model code (and scikit-learn, which it imports): the
    # scheduler and servers of a job start faster without them.
    from workers.examples.digits_ddp import (
        CheckpointError,
        StopRequest,
        checkpoint_dir,
        configure_threads,
        exit_stopped,
        load_checkpoint,
        load_data,
    )

    configure_threads()
    # Before joining: once the job has met, its waits are bounded, and loading is no part of them.
    # The checkpoint too: once every worker has joined, worker 0 may overwrite it.
    data = load_data()
    checkpoints = checkpoint_dir()
    try:
        saved = load_checkpoint(checkpoints) if checkpoints is not None else None
    except CheckpointError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 1
    try:
        kv = ps.create(args.kvstore, topo)
    except ps.PSError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 1
    stop = StopRequest()
    try:
        train(args, kv, data, started, checkpoints, saved, stop)
    except Exception as exc:
        if stop.requested:
            # The job is being stopped and a peer went first; the last checkpoint stands.
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            print(f"SIGTERM: exiting ({reason})", flush=True)
            exit_stopped()
        return kv.fail(exc)  # a failed worker stops the whole job at once
    kv.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
