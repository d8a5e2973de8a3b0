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
`final eval_accuracy=<accuracy> wall_time_s=<s>`; it also saves model.pt into
TRAINYARD_CHECKPOINT_DIR when that is set.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler

from workers import ps

if TYPE_CHECKING:
    from workers.examples.digits_ddp import Data


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--kvstore",
        choices=ps.MODES,
        # The mode picked in Trainyard's form arrives as TRAINYARD_KVSTORE.
        default=os.environ.get("TRAINYARD_KVSTORE") or "dist_sync",
        help="how servers apply the workers' gradients (seed 004)",
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
    parser.add_argument("--seed", type=int, default=0, help="seeds weights, shuffling")
    args = parser.parse_args(argv)
    if args.epochs < 1 or args.batch_size < 1 or args.lr <= 0:
        parser.error("--epochs and --batch-size must be at least 1 and --lr positive")
    return args


def train(args: argparse.Namespace, kv: ps.KVStore, data: Data, started: float) -> None:
    from workers.examples.digits_ddp import build_model, evaluate, learning_rate, metrics

    workers, me = kv.num_workers, kv.rank
    sync = kv.type in ps.SYNC_MODES
    # One update per round of W pushes in the sync modes (the linear scaling rule of DDP), one
    # update per push in dist_async: there the rate is the one-machine rate with batch b.
    lr_scale = workers if sync else 1

    # Worker i reads the shard DDP's rank i reads: same sampler, same seed, same epochs.
    sampler: DistributedSampler[int] = DistributedSampler(
        data.train, num_replicas=workers, rank=me, shuffle=True, seed=args.seed
    )
    loader = DataLoader(data.train, batch_size=args.batch_size, sampler=sampler)
    # Seed 004: the batch size is per machine; a sync update sees W of them, an async one 1.
    batch = (
        f"global_batch={workers * args.batch_size}" if sync else f"update_batch={args.batch_size}"
    )
    print(
        f"worker {me}/{workers} kvstore={kv.type} servers={kv.num_servers} "
        f"batch_size={args.batch_size} {batch} lr_scale={lr_scale} shard={len(sampler)} samples "
        "devices=cpu",
        flush=True,
    )

    model = build_model(args.seed)
    names = [name for name, _ in model.named_parameters()]
    params = [p for _, p in model.named_parameters()]
    # The servers run the same step DDP's optimizer runs on every rank.
    kv.set_optimizer(ps.sgd(lr=args.lr, momentum=0.9, nesterov=True))
    kv.init(names, [p.detach() for p in params])
    kv.pull(names, out=params)  # everyone starts from worker 0's weights
    loss_fn = nn.CrossEntropyLoss()
    local: dict[int, tuple[float, float]] = {}  # worker 0: epoch -> (lr, eval accuracy)
    accuracy = 0.0
    metrics.declare(total_steps=args.epochs * len(loader), total_epochs=args.epochs)

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        lr = learning_rate(epoch, args.epochs, args.lr, lr_scale)
        kv.set_learning_rate(lr)
        epoch_start = time.perf_counter()
        loss_sum = 0.0
        seen = 0
        for batch_x, batch_y in loader:
            model.zero_grad(set_to_none=True)
            loss = loss_fn(model(batch_x), batch_y)
            loss.backward()
            # push + pull in one round trip; in the sync modes the reply waits for the others.
            kv.pushpull(names, [p.grad for p in params if p.grad is not None], out=params)
            loss_sum += loss.item() * len(batch_y)
            seen += len(batch_y)
        elapsed = time.perf_counter() - epoch_start
        kv.mark_epoch(epoch + 1, args.epochs)
        kv.board.post(epoch + 1, [loss_sum, float(seen), seen / elapsed])
        # Each worker its own loss and throughput (the console averages and adds them up).
        step = (epoch + 1) * len(loader)
        metrics.report(
            step=step, epoch=epoch + 1, loss=loss_sum / seen, lr=lr, samples_per_sec=seen / elapsed
        )
        if me == 0:
            accuracy = evaluate(model, data, torch.device("cpu"))
            metrics.report(step=step, epoch=epoch + 1, eval_accuracy=accuracy)
            local[epoch + 1] = (lr, accuracy)
            # In sync modes the others finish each epoch with us; in dist_async nobody waits
            # for anybody, so lines for epochs the others have not finished come later.
            print_epochs(kv, local, args.epochs, through=epoch + 1 if sync else None)
        else:
            print(
                f"epoch={epoch + 1}/{args.epochs} worker={me} local_loss={loss_sum / seen:.4f} "
                f"local_samples_per_sec={seen / elapsed:.1f}",
                flush=True,
            )

    # Every worker's last push has been applied once all are here.
    kv.barrier()
    if me == 0:
        print_epochs(kv, local, args.epochs, through=args.epochs)
        if not sync:
            kv.pull(names, out=params)  # the others' last updates came after ours
            accuracy = evaluate(model, data, torch.device("cpu"))
        checkpoint_dir = os.environ.get("TRAINYARD_CHECKPOINT_DIR")
        if checkpoint_dir:
            path = Path(checkpoint_dir)
            path.mkdir(parents=True, exist_ok=True)
            torch.save(model.state_dict(), path / "model.pt")
            print(f"saved checkpoint={path / 'model.pt'}", flush=True)
        print(
            f"final eval_accuracy={accuracy:.4f} wall_time_s={time.perf_counter() - started:.1f}",
            flush=True,
        )


def print_epochs(
    kv: ps.KVStore, local: dict[int, tuple[float, float]], epochs: int, through: int | None
) -> None:
    """Worker 0's job-wide lines, computed as digits_ddp.py's rank 0 computes them."""
    for epoch, rows in kv.board.collect(through=through):
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
    from workers.examples.digits_ddp import configure_threads, load_data

    configure_threads()
    # Before joining: once the job has met, its waits are bounded, and loading is no part of them.
    data = load_data()
    try:
        kv = ps.create(args.kvstore, topo)
    except ps.PSError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 1
    try:
        train(args, kv, data, started)
    except Exception as exc:  # a failed worker stops the whole job at once
        return kv.fail(exc)
    kv.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
