"""A small compute-bound training loop that logs one line per step, as trainers do.

    python -u train.py STEPS RESULT_PATH

An MLP on synthetic data, CPU only, one torch thread. It prints `step/loss/lr` each step and,
at the end, writes its own throughput (steps/s, timed inside the loop after a warm-up) to
RESULT_PATH as JSON (a relative path: in TRAINYARD_CHECKPOINT_DIR, where a sandboxed trainer
may write), so the figure is the same whether stdout goes to a pipe or to /dev/null.
"""

import json
import os
import sys
import time
from pathlib import Path

import torch

WARMUP_STEPS = 100
BATCH = 64


def main() -> None:
    steps = int(sys.argv[1])
    # A relative path is in the job's checkpoint folder: under an agent, the trainer's sandbox
    # lets it write there (and in its scratch folder) only.
    result = Path(os.environ.get("TRAINYARD_CHECKPOINT_DIR", ".")) / sys.argv[2]
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 10),
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, steps)
    data = torch.randn(4096, 64)
    labels = torch.randint(0, 10, (4096,))
    started = 0.0
    for step in range(steps):
        if step == WARMUP_STEPS:
            started = time.perf_counter()
        at = (step * BATCH) % (len(data) - BATCH)
        loss = torch.nn.functional.cross_entropy(
            model(data[at : at + BATCH]), labels[at : at + BATCH]
        )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        print(f"step {step} loss {loss.item():.4f} lr {schedule.get_last_lr()[0]:.6f}")
    rate = (steps - WARMUP_STEPS) / (time.perf_counter() - started)
    result.write_text(json.dumps({"steps_per_second": rate}))
    print(f"done: {rate:.1f} steps/s")


if __name__ == "__main__":
    main()
