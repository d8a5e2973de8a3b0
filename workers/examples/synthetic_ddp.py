"""Throughput benchmark with cached input: DDP on one random batch reused every step.

Reading and preparing data is out of the picture, so samples per second (and per dollar) show
what the compute and the gradient exchange alone allow: the ceiling a real input pipeline can
only approach. Each rank reports its samples/sec through Trainyard's metrics channel every few
steps; the console adds the ranks up and compares with a 1-worker run for speedup.

    python workers/examples/synthetic_ddp.py --steps 200            (one process)
    torchrun --standalone --nproc-per-node 2 workers/examples/synthetic_ddp.py
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.optim import SGD

from workers.examples.digits_ddp import (
    configure_threads,
    freeze_imports,
    metrics,
    pick_device,
    process_group,
    read_topology,
)

REPORT_EVERY_STEPS = 10
WARMUP_STEPS = 5  # left out of the throughput: allocation and the first all-reduce setup


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--steps",
        type=int,
        default=300,
        help=f"training steps; the first {WARMUP_STEPS} are not timed",
    )
    # Per rank, as everywhere in Trainyard: the global batch is ranks × this.
    parser.add_argument("--batch-size", type=int, default=128, help="mini-batch size per rank")
    parser.add_argument("--width", type=int, default=512, help="hidden units of the MLP")
    parser.add_argument("--lr", type=float, default=0.01, help="learning rate")
    args = parser.parse_args(argv)
    if args.steps <= WARMUP_STEPS or args.batch_size < 1 or args.width < 1:
        parser.error(f"--steps must exceed {WARMUP_STEPS}; --batch-size and --width positive")
    return args


def main(argv: list[str] | None = None) -> int:
    freeze_imports()
    args = parse_args(argv)
    configure_threads()
    topo = read_topology()
    backend, device = pick_device(topo)
    with process_group(topo, backend):
        generator = torch.Generator().manual_seed(1234 + topo.rank)
        x = torch.randn(args.batch_size, 256, generator=generator).to(device)
        y = torch.randint(0, 10, (args.batch_size,), generator=generator).to(device)
        torch.manual_seed(0)  # the same initial weights on every rank
        model = nn.Sequential(
            nn.Linear(256, args.width), nn.ReLU(), nn.Linear(args.width, args.width), nn.ReLU(),
            nn.Linear(args.width, 10),
        ).to(device)  # fmt: skip
        net: nn.Module = DistributedDataParallel(model) if topo.distributed else model
        optimizer = SGD(net.parameters(), lr=args.lr)
        loss_fn = nn.CrossEntropyLoss()
        metrics.declare(total_steps=args.steps)
        window_start, window_steps = time.perf_counter(), 0
        for step in range(1, args.steps + 1):
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(net(x), y)
            loss.backward()
            optimizer.step()
            if step == WARMUP_STEPS:
                window_start, window_steps = time.perf_counter(), 0
                continue
            window_steps += 1
            if step % REPORT_EVERY_STEPS == 0 and step > WARMUP_STEPS:
                rate = window_steps * args.batch_size / (time.perf_counter() - window_start)
                metrics.report(step=step, loss=loss.item(), lr=args.lr, samples_per_sec=rate)
                print(
                    f"step={step}/{args.steps} {topo.label} loss={loss.item():.4f} "
                    f"samples_per_sec={rate:.1f}",
                    flush=True,
                )
                window_start, window_steps = time.perf_counter(), 0
        if topo.distributed:
            dist.barrier()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
