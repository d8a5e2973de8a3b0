"""Data-parallel training of a small MLP on scikit-learn's digits, with torch.distributed DDP.

What it demonstrates: one process per rank, rendezvous through the environment variables that
torchrun sets (MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK, LOCAL_RANK), a DistributedSampler that
gives every rank its own shard of the training set, gradients averaged by DistributedDataParallel,
per-epoch metrics reduced across ranks and printed as `key=value` lines, and loss, learning
rate, throughput and eval accuracy reported through Trainyard's metrics channel
(trainyard_metrics) for the console's charts. The data set ships inside scikit-learn, so
nothing is downloaded.

Run it by hand as a single process (no process group at all):

    python workers/examples/digits_ddp.py --epochs 20

or as three local ranks through torchrun:

    torchrun --standalone --nproc-per-node 3 workers/examples/digits_ddp.py

Rank 0 ends with a line `final eval_accuracy=<accuracy on the whole test set> wall_time_s=<s>`.

Checkpoints (docs/checkpoints.md): if TRAINYARD_CHECKPOINT_DIR is set, rank 0 writes
`latest.pt` there after every epoch (atomically: a temporary file, then a rename), and the final
weights as `model.pt`. A run that finds `latest.pt` at start continues from it: every rank loads
it, and rank 0 prints `resumed from checkpoint <path> at epoch=E/N (restart R)`. On SIGTERM the
ranks stop at the next step boundary, rank 0 saves where it stands mid-epoch
(`SIGTERM: saved checkpoint at epoch=E step=S/T; exiting`), and they exit with status 143;
`epoch=E step=S` means E whole epochs and then S batches of the next one. A resumed run sees the
data in the same order: the sampler's order is a function of --seed and the epoch, and the
batches of an interrupted epoch that were already trained are skipped.

Resuming with other settings works: another world size or batch size continues from the saved
weights and optimizer state with the learning-rate schedule of the new settings (rank 0 prints
a note saying what changed); a checkpoint from the middle of an epoch then starts that epoch
over, since its batch count means nothing with another sharding. More --epochs than the
checkpoint's run extends training; fewer, at or below the saved epoch, only evaluates.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.util
import json
import math
import os
import secrets
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from itertools import islice
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.optim import SGD
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

try:  # on the PYTHONPATH of every Trainyard trainer; run by hand, from the source tree
    import trainyard_metrics as metrics
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "trainer_lib"))
    import trainyard_metrics as metrics

# A peer that died or never started must fail the job instead of hanging it forever. Gloo's
# default is 30 minutes, far longer than this whole run should ever take.
COLLECTIVE_TIMEOUT = timedelta(seconds=120)

# The split is part of the experiment, not of the run: it never depends on --seed, so runs with
# different seeds or world sizes are scored on exactly the same held-out digits.
SPLIT_RANDOM_STATE = 42
TEST_FRACTION = 0.2

# Epochs over which the learning rate ramps from the base lr up to the world-size-scaled lr.
# Jumping straight to a 3x lr with freshly initialised weights is what makes large-batch runs
# fall behind; a ramp avoids that (5 epochs as in Goyal et al., "Accurate, Large Minibatch SGD").
# Measured here over ten seeds: with 5 epochs 3 ranks end within 0.9 points of 1 rank, with 2
# epochs up to 1.7 points behind.
WARMUP_EPOCHS = 5
# Loss and learning rate go to the metrics channel every this many steps.
METRIC_EVERY_STEPS = 5

# The platform gives every instance of a job, on every attempt, the same directory here.
CHECKPOINT_DIR_ENV = "TRAINYARD_CHECKPOINT_DIR"
# How many times the job was restarted (0 on the first attempt); torchrun's name as a fallback.
RESTART_COUNT_ENVS = ("TRAINYARD_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT")
CHECKPOINT_NAME = "latest.pt"
FINAL_WEIGHTS_NAME = "model.pt"  # the trained model alone, for whoever uses it after the job
# Bumped when the checkpoint's layout changes, so that an old file fails with a clear message.
CHECKPOINT_FORMAT = 1
# What a shell reports for a process that SIGTERM ended (128 + 15): a handled SIGTERM reads the
# same as an unhandled one to whoever watches the exit status.
SIGTERM_EXIT = 128 + signal.SIGTERM


@dataclass(frozen=True)
class Topology:
    """Where this process sits in the job, as read from the launcher's environment."""

    distributed: bool
    rank: int
    world_size: int
    local_rank: int
    label: str  # how the platform names this replica: "master", "worker-1", ...


@dataclass
class Data:
    train: TensorDataset
    test_x: torch.Tensor
    test_y: torch.Tensor


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20, help="passes over the data")
    parser.add_argument(
        "--batch-size",
        type=int,
        default=32,
        help="mini-batch size per rank, not global",
    )
    parser.add_argument(
        "--lr",
        type=float,
        default=0.05,
        help="learning rate for one rank; scaled linearly by the world size after warm-up",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="the same number gives the same initial weights and data order",
    )
    parser.add_argument(
        "--min-epoch-seconds",
        type=float,
        default=0,
        help="make every epoch last at least this long, as a larger data set's would (0: as fast "
        "as it goes): for trying what acts between epochs, early stopping or preemption",
    )
    args = parser.parse_args(argv)
    if args.epochs < 1 or args.batch_size < 1 or args.lr <= 0:
        parser.error("--epochs and --batch-size must be at least 1 and --lr positive")
    if args.min_epoch_seconds < 0:
        parser.error("--min-epoch-seconds must not be negative")
    return args


def pace(epoch_start: float, done: int, steps: int, min_epoch_seconds: float) -> None:
    """Wait, after `done` of an epoch's `steps` steps, until that share of min_epoch_seconds
    has passed since the epoch started: a step at a time, so that a SIGTERM still stops
    training within a step's share."""
    if min_epoch_seconds > 0 and steps > 0:
        wait = epoch_start + min_epoch_seconds * done / steps - time.perf_counter()
        if wait > 0:
            time.sleep(wait)


def read_topology() -> Topology:
    """Read rank and world size the way torchrun passes them; no WORLD_SIZE means run alone."""
    role = os.environ.get("TRAINYARD_ROLE")
    index = os.environ.get("TRAINYARD_INDEX", "0")
    if "WORLD_SIZE" not in os.environ:
        return Topology(
            distributed=False,
            rank=0,
            world_size=1,
            local_rank=0,
            label="local",
        )
    rank = int(os.environ["RANK"])
    # The same naming as the console uses for replicas, so log lines and the UI agree.
    if role in {"master", "scheduler"}:
        label = role
    elif role:
        label = f"{role}-{index}"
    else:
        label = f"rank-{rank}"
    return Topology(
        distributed=True,
        rank=rank,
        world_size=int(os.environ["WORLD_SIZE"]),
        local_rank=int(os.environ.get("LOCAL_RANK", "0")),
        label=label,
    )


def configure_threads() -> None:
    """Use the thread budget the agent gives us (OMP_NUM_THREADS), one thread if none.

    Several ranks may share a small machine; each one spinning up a thread per core would make
    them fight over the cores and run slower than with one thread each.
    """
    try:
        threads = int(os.environ.get("OMP_NUM_THREADS", "1"))
    except ValueError:
        threads = 1
    torch.set_num_threads(max(1, threads))


def pick_device(topo: Topology) -> tuple[str, torch.device]:
    """NCCL on this rank's GPU when there is one, otherwise Gloo on the CPU."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus > 0 and dist.is_nccl_available():
        # Several ranks on one host each take the GPU numbered by their local rank.
        device = torch.device("cuda", topo.local_rank % gpus)
        torch.cuda.set_device(device)
        return "nccl", device
    return "gloo", torch.device("cpu")


# Which of the digits' rows train and which evaluate: the split scikit-learn's
# train_test_split made with TEST_FRACTION, stratified by label, SPLIT_RANDOM_STATE, kept in a
# file so that a trainer need not import scikit-learn to make it again (its file says how it
# was made; tests/unit/test_digits_data.py makes it again and compares).
SPLIT_FILE = Path(__file__).resolve().with_name("digits_split.json")


def digits_rows() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits (1,797 8x8 images and their labels), read from the file the
    package ships without importing scikit-learn, whose import took 1.3 s of every trainer's
    start here (torch's own takes 1.6 s); through load_digits where the file is not where
    scikit-learn keeps it."""
    found = importlib.util.find_spec("sklearn")
    for folder in (found.submodule_search_locations or []) if found else []:
        path = Path(folder) / "datasets" / "data" / "digits.csv.gz"
        if path.is_file():
            rows = np.loadtxt(path, delimiter=",")
            return rows[:, :-1], rows[:, -1].astype(np.int64)
    from sklearn.datasets import load_digits

    digits = load_digits()
    return digits.data, digits.target.astype(np.int64)


def load_data() -> Data:
    """Every rank loads the whole (tiny) data set and applies the same split and scaling.

    Doing it identically everywhere is cheaper than shipping arrays between ranks, and the
    DistributedSampler then decides which training rows each rank actually reads.
    """
    features, labels = digits_rows()
    split = json.loads(SPLIT_FILE.read_text())
    train, test = np.array(split["train"]), np.array(split["test"])
    x_train, x_test = features[train], features[test]
    # Standardised with the training rows' statistics only, so nothing about the test set
    # leaks in; a feature constant there is left unscaled (as scikit-learn's StandardScaler).
    mean = x_train.mean(axis=0)
    scale = x_train.std(axis=0)
    scale[scale == 0] = 1.0
    x_train = ((x_train - mean) / scale).astype(np.float32)
    x_test = ((x_test - mean) / scale).astype(np.float32)
    return Data(
        train=TensorDataset(torch.from_numpy(x_train), torch.from_numpy(labels[train])),
        test_x=torch.from_numpy(x_test),
        test_y=torch.from_numpy(labels[test]),
    )


def build_model(seed: int) -> nn.Module:
    # Same seed on every rank gives identical initial weights; DDP would broadcast rank 0's
    # weights anyway, but this also makes the single-process run reproduce the same start.
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(64, 128),
        nn.ReLU(),
        nn.Linear(128, 64),
        nn.ReLU(),
        nn.Linear(64, 10),
    )


def learning_rate(epoch: int, epochs: int, base_lr: float, world_size: int) -> float:
    """Linear warm-up from base_lr to base_lr * world_size, then cosine decay towards zero.

    With N ranks each step averages N times as many samples and there are N times fewer steps
    per epoch, so the step size grows with N (linear scaling rule) to cover the same ground.
    """
    peak = base_lr * world_size
    # A short run keeps three quarters of its epochs for the decay; one rank needs no ramp.
    warmup = min(WARMUP_EPOCHS, epochs // 4) if world_size > 1 else 0
    if epoch < warmup:
        return base_lr + (peak - base_lr) * epoch / warmup
    progress = (epoch - warmup) / max(1, epochs - warmup)
    return peak * 0.5 * (1.0 + math.cos(math.pi * progress))


@torch.no_grad()
def evaluate(model: nn.Module, data: Data, device: torch.device) -> float:
    """Accuracy on the whole held-out test set (360 rows: one forward pass is enough)."""
    model.eval()
    logits = model(data.test_x.to(device))
    correct = int((logits.argmax(dim=1) == data.test_y.to(device)).sum().item())
    model.train()
    return correct / len(data.test_y)


# --- checkpoints: where they live, how they are written and read ---------------------------------


class CheckpointError(Exception):
    """The checkpoint exists but cannot be used; the message says which file and why."""


@dataclass
class Position:
    """How far training got: whole epochs, then batches of the next epoch.

    loss_sum and seen are this rank's running sums over those batches, so that after a resume in
    the middle of an epoch, that epoch's loss line still covers the whole epoch.
    """

    epochs_done: int = 0
    steps_done: int = 0
    loss_sum: float = 0.0
    seen: int = 0


def checkpoint_dir() -> Path | None:
    """The job's checkpoint directory, the same for every instance and attempt; None if unset."""
    value = os.environ.get(CHECKPOINT_DIR_ENV)
    return Path(value) if value else None


def restart_count() -> int:
    """How many times the job was restarted before this attempt (0 when nobody says)."""
    for name in RESTART_COUNT_ENVS:
        value = os.environ.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return 0


def save_atomically(state: dict[str, Any], path: Path) -> None:
    """Write `state` to `path` so that readers only ever see the old file or the new one.

    A process killed while torch.save runs leaves a half-written file. Writing to a temporary
    file in the same directory and renaming it over `path` (atomic within one file system) means
    that half-written file is never `path`. The fsyncs make the new file survive a node crash
    too, not just a killed process; for a model this size they cost milliseconds.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    # A name of our own ("x" refuses an existing file); unlike mkstemp's 0600, the file gets the
    # usual permissions, as the job's other processes may read it as another user.
    temporary = path.parent / f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp"
    file = open(temporary, "xb")  # outside the try: a failed open must not unlink the name
    try:
        with file:
            torch.save(state, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    # The rename itself is durable only once the directory entry is on disk. Some network file
    # systems refuse to fsync a directory; the rename has still happened there.
    with contextlib.suppress(OSError):
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)


def remove_temporary_files(directory: Path) -> None:
    """Delete what writers killed mid-save left behind: only `save_atomically`'s own names.

    Called by rank 0 once the job has met, when no process of an earlier attempt can still be
    writing (the platform stops all of them before it starts the next attempt).
    """
    for name in (CHECKPOINT_NAME, FINAL_WEIGHTS_NAME):
        for leftover in directory.glob(f".{name}.*.tmp"):
            with contextlib.suppress(FileNotFoundError):
                leftover.unlink()


def load_checkpoint(directory: Path) -> dict[str, Any] | None:
    """The saved state, or None if there is none yet. Temporary files are never looked at."""
    path = directory / CHECKPOINT_NAME
    if not path.exists():
        return None
    try:
        # weights_only: a checkpoint is data, and loading it must not run code from the file.
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CheckpointError(
            f"cannot read checkpoint {path}: {exc}; move it away to start from scratch"
        ) from None
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(
            f"{path} is not a checkpoint of this script (format {CHECKPOINT_FORMAT}); "
            "move it away to start from scratch"
        )
    return state


def checkpoint_state(
    model: dict[str, torch.Tensor],
    optimizer: dict[str, Any] | None,
    position: Position,
    settings: dict[str, Any],
) -> dict[str, Any]:
    """What a checkpoint holds: enough to continue exactly where `position` says."""
    return {
        "format": CHECKPOINT_FORMAT,
        "model": model,
        "optimizer": optimizer,
        "epochs_done": position.epochs_done,
        "steps_done": position.steps_done,
        "loss_sum": position.loss_sum,
        "seen": position.seen,
        # Nothing in this model draws random numbers after initialisation, but one with dropout
        # would; restoring the generator makes it draw what the uninterrupted run would have.
        "torch_rng": torch.get_rng_state(),
        "settings": settings,
    }


def run_settings(args: argparse.Namespace, world_size: int) -> dict[str, Any]:
    """The settings a checkpoint records, to tell the user when a resume changes them."""
    return {
        "world_size": world_size,
        "batch_size": args.batch_size,
        "epochs": args.epochs,
        "lr": args.lr,
        "seed": args.seed,
    }


def resume_position(
    saved: dict[str, Any], settings: dict[str, Any], keeps_sums: bool, announce: bool
) -> Position:
    """Where to continue from `saved`, given this run's settings; with `announce`, say so.

    A step count from the middle of an epoch only means something with the same sharding (world
    size) and batch size; with others, the interrupted epoch starts over. `keeps_sums`: whether
    the saved running loss sums are this process's (rank 0 wrote them).
    """
    then = saved.get("settings", {})
    changed = {name: (then.get(name), now) for name, now in settings.items()}
    changed = {name: pair for name, pair in changed.items() if pair[0] != pair[1]}
    position = Position(int(saved["epochs_done"]), int(saved["steps_done"]))
    if keeps_sums:
        position.loss_sum, position.seen = float(saved["loss_sum"]), int(saved["seen"])
    restart_epoch = position.steps_done > 0 and bool({"world_size", "batch_size"} & changed.keys())
    if restart_epoch:
        position = Position(position.epochs_done)
    if announce:
        if changed:
            what = ", ".join(f"{name} {old} -> {new}" for name, (old, new) in changed.items())
            print(f"note: settings differ from the checkpoint's: {what}", flush=True)
        if restart_epoch:
            print(
                f"note: the checkpoint is from the middle of epoch {position.epochs_done + 1}; "
                "with another world size or batch size that epoch starts over",
                flush=True,
            )
    return position


def describe_position(position: Position, epochs: int, steps_per_epoch: int) -> str:
    """`epoch=4/10`, or `epoch=4/10 step=12/45` in the middle of the fifth epoch."""
    where = f"epoch={position.epochs_done}/{epochs}"
    if position.steps_done:
        where += f" step={position.steps_done}/{steps_per_epoch}"
    return where


# --- SIGTERM: stop at a step boundary ------------------------------------------------------------


class StopRequest:
    """Notes a SIGTERM, so that training stops at the next step boundary and not mid-step.

    The handler only sets a flag. Saving from inside it could interrupt a torch.save, or an
    optimizer step half-way through the parameters, and save that.
    """

    def __init__(self) -> None:
        self.requested = False

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True


def exit_stopped() -> NoReturn:
    """Leave now with SIGTERM_EXIT, once what had to be saved is saved.

    os._exit skips the interpreter's and the process group's teardown: the peers are being
    stopped too, and one stuck in a collective could hold that teardown up until SIGKILL.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(SIGTERM_EXIT)


# --- training -------------------------------------------------------------------------------------


@dataclass
class Training:
    """Everything one rank trains with, built by `set_up`."""

    args: argparse.Namespace
    topo: Topology
    device: torch.device
    data: Data
    sampler: DistributedSampler[int]
    loader: DataLoader[tuple[torch.Tensor, ...]]
    model: nn.Module  # the plain module: evaluated and saved, without DDP's "module." prefix
    net: nn.Module  # what we train through: DDP all-reduces (averages) gradients in backward
    optimizer: SGD
    checkpoints: Path | None
    stop: StopRequest

    @property
    def steps_per_epoch(self) -> int:
        return len(self.loader)


def set_up(
    args: argparse.Namespace,
    topo: Topology,
    backend: str,
    device: torch.device,
    checkpoints: Path | None,
) -> Training:
    data = load_data()
    # Each rank iterates over its own 1/world_size of the rows; the sampler pads the last shard
    # by repeating a few rows so that every rank runs the same number of steps (DDP needs that,
    # as every step is a collective).
    sampler: DistributedSampler[int] = DistributedSampler(
        data.train,
        num_replicas=topo.world_size,
        rank=topo.rank,
        shuffle=True,
        seed=args.seed,
    )
    loader = DataLoader(data.train, batch_size=args.batch_size, sampler=sampler)
    print(
        f"rank {topo.rank}/{topo.world_size} ({topo.label}) backend={backend} "
        f"shard={len(sampler)} samples",
        flush=True,
    )
    model = build_model(args.seed).to(device)
    net: nn.Module = model
    if topo.distributed:
        device_ids = [device.index] if device.type == "cuda" else None
        net = DistributedDataParallel(model, device_ids=device_ids)
    # Nesterov momentum: the usual choice for SGD on small MLPs, and it tolerates the scaled lr.
    optimizer = SGD(net.parameters(), lr=args.lr, momentum=0.9, nesterov=True)
    return Training(
        args, topo, device, data, sampler, loader, model, net, optimizer, checkpoints, StopRequest()
    )


def restore(run: Training, saved: dict[str, Any] | None) -> Position:
    """Load a checkpoint into this rank's model and optimizer; return where to continue.

    Every rank loads the same file, so their weights and momentum agree, as DDP requires.
    """
    if saved is None:
        if run.topo.rank == 0 and restart_count() > 0:
            print(f"no checkpoint to resume from (restart {restart_count()})", flush=True)
        return Position()
    run.model.load_state_dict(saved["model"])
    run.optimizer.load_state_dict(saved["optimizer"])
    torch.set_rng_state(saved["torch_rng"])
    is_rank0 = run.topo.rank == 0
    position = resume_position(
        saved, run_settings(run.args, run.topo.world_size), keeps_sums=is_rank0, announce=is_rank0
    )
    if is_rank0:
        where = describe_position(position, run.args.epochs, run.steps_per_epoch)
        path = (run.checkpoints or Path()) / CHECKPOINT_NAME
        print(f"resumed from checkpoint {path} at {where} (restart {restart_count()})", flush=True)
    return position


def save_checkpoint(run: Training, position: Position) -> None:
    """Rank 0's save: the replicas are identical, and one writer keeps the file consistent."""
    if run.checkpoints is None:
        return
    state = checkpoint_state(
        run.model.state_dict(),
        run.optimizer.state_dict(),
        position,
        run_settings(run.args, run.topo.world_size),
    )
    save_atomically(state, run.checkpoints / CHECKPOINT_NAME)


def halt(run: Training, position: Position) -> NoReturn:
    """SIGTERM: rank 0 saves `position` (the last step boundary), then every rank exits 143.

    No collective is started here: the other ranks got SIGTERM too, and may already be gone.
    """
    where = f"epoch={position.epochs_done} step={position.steps_done}/{run.steps_per_epoch}"
    if run.topo.rank != 0:
        print(f"SIGTERM: rank {run.topo.rank} stopping at {where}; exiting", flush=True)
    elif run.checkpoints is None:
        print(f"SIGTERM: stopping at {where}; exiting ({CHECKPOINT_DIR_ENV} unset)", flush=True)
    else:
        save_checkpoint(run, position)
        print(f"SIGTERM: saved checkpoint at {where}; exiting", flush=True)
    exit_stopped()


@contextlib.contextmanager
def halting_on_failure(run: Training, position: Position) -> Iterator[None]:
    """Around a collective: if it fails after a SIGTERM, halt at `position` instead of failing.

    A peer that got SIGTERM a moment before us stopped at its step boundary while we had already
    entered the next collective, which then fails when the peer's process ends.
    """
    try:
        yield
    except RuntimeError:
        if not run.stop.requested:
            raise
        halt(run, position)


def train_step(run: Training, batch_x: torch.Tensor, batch_y: torch.Tensor) -> float:
    """One optimizer step on one batch; returns the batch's mean loss."""
    x, y = batch_x.to(run.device), batch_y.to(run.device)
    run.optimizer.zero_grad(set_to_none=True)
    loss = nn.functional.cross_entropy(run.net(x), y)
    loss.backward()
    run.optimizer.step()
    return float(loss.item())


def run_epoch(run: Training, epoch: int, start: Position) -> float | None:
    """Train epoch `epoch` (0-based) from `start` and print its line; rank 0 returns the eval
    accuracy and saves a checkpoint. On SIGTERM this does not return (see `halt`)."""
    args, topo = run.args, run.topo
    steps = run.steps_per_epoch
    # Without this every epoch would shuffle the same way; with it, the order is a function of
    # the seed and the epoch alone, which is what lets a resumed run see the same batches.
    run.sampler.set_epoch(epoch)
    lr = learning_rate(epoch, args.epochs, args.lr, topo.world_size)
    for group in run.optimizer.param_groups:
        group["lr"] = lr

    epoch_start = time.perf_counter()
    loss_sum, seen = start.loss_sum, start.seen
    # After a mid-epoch resume, the batches already trained are skipped (same sampler order).
    batches = islice(run.loader, start.steps_done, None)
    for k, (batch_x, batch_y) in enumerate(batches, start=start.steps_done):
        # Checked before each step, i.e. before each collective: once SIGTERM has come, no rank
        # starts one, so none can leave rank 0 waiting in one while it saves.
        if run.stop.requested:
            halt(run, Position(epoch, k, loss_sum, seen))
        # If the step fails, its optimizer step did not run: the state is that after batch k-1.
        with halting_on_failure(run, Position(epoch, k, loss_sum, seen)):
            loss = train_step(run, batch_x, batch_y)
        loss_sum += loss * len(batch_y)
        seen += len(batch_y)
        if k % METRIC_EVERY_STEPS == 0:
            # Epochs, not steps, line runs of different world sizes up (fewer steps each).
            metrics.report(step=epoch * steps + k, epoch=epoch + k / steps, loss=loss, lr=lr)
        pace(
            epoch_start, k + 1 - start.steps_done, steps - start.steps_done, args.min_epoch_seconds
        )
    if run.stop.requested:
        halt(run, Position(epoch, steps, loss_sum, seen))
    elapsed = time.perf_counter() - epoch_start
    local_rate = (seen - start.seen) / elapsed if elapsed > 0 else 0.0
    return finish_epoch(run, epoch, lr, loss_sum, seen, local_rate)


def finish_epoch(
    run: Training, epoch: int, lr: float, loss_sum: float, seen: int, local_rate: float
) -> float | None:
    """Print the epoch's line; rank 0 also evaluates and saves a checkpoint, before printing,
    so that every epoch a log shows as done is in the checkpoint."""
    args, topo = run.args, run.topo
    steps = run.steps_per_epoch
    # One small all-reduce per epoch: the global mean loss is total loss over total samples,
    # and the global throughput is the sum of what each rank processed per second.
    totals = torch.tensor([loss_sum, float(seen), local_rate], dtype=torch.float64)
    if topo.distributed:
        totals = totals.to(run.device)
        with halting_on_failure(run, Position(epoch, steps, loss_sum, seen)):
            dist.all_reduce(totals, op=dist.ReduceOp.SUM)
    global_loss = totals[0].item() / totals[1].item()
    global_rate = totals[2].item()

    tag = f"epoch={epoch + 1}/{args.epochs}"
    # Each rank reports its own throughput; the console adds them up.
    metrics.report(step=(epoch + 1) * steps, epoch=epoch + 1, samples_per_sec=local_rate)
    if topo.rank != 0:
        # seen is 0 here after a resume that found this epoch's batches all done by rank 0's
        # save (a SIGTERM after the last step); its sums are rank 0's alone.
        local_loss = loss_sum / seen if seen else float("nan")
        print(
            f"{tag} rank={topo.rank} local_loss={local_loss:.4f} "
            f"local_samples_per_sec={local_rate:.1f}",
            flush=True,
        )
        return None
    # The weights are identical on all ranks after each step, so rank 0's accuracy on the full
    # test set is the model's accuracy; the other ranks need not repeat it.
    accuracy = evaluate(run.model, run.data, run.device)
    metrics.report(step=(epoch + 1) * steps, epoch=epoch + 1, eval_accuracy=accuracy)
    save_checkpoint(run, Position(epoch + 1))
    print(
        f"{tag} loss={global_loss:.4f} lr={lr:.4f} samples_per_sec={global_rate:.1f} "
        f"eval_accuracy={accuracy:.4f}",
        flush=True,
    )
    return accuracy


def finish(run: Training, accuracy: float | None, started: float) -> None:
    """Rank 0 saves the final weights and prints the summary line."""
    if run.topo.rank == 0:
        if accuracy is None:  # resumed from a checkpoint with no epoch left to train
            accuracy = evaluate(run.model, run.data, run.device)
        if run.checkpoints is not None:
            path = run.checkpoints / FINAL_WEIGHTS_NAME
            save_atomically(run.model.state_dict(), path)
            print(f"saved checkpoint={path}", flush=True)
        print(
            f"final eval_accuracy={accuracy:.4f} wall_time_s={time.perf_counter() - started:.1f}",
            flush=True,
        )
    if run.topo.distributed:
        # Keep every rank alive until rank 0 has saved and printed: rank 0 hosts the rendezvous
        # store, and peers tearing down around it would log spurious connection errors.
        dist.barrier()


def train(
    args: argparse.Namespace,
    topo: Topology,
    backend: str,
    device: torch.device,
    started: float,
    checkpoints: Path | None,
    saved: dict[str, Any] | None,
) -> None:
    """Train, printing one metrics line per epoch; rank 0 also evaluates, saves and sums up."""
    run = set_up(args, topo, backend, device, checkpoints)
    position = restore(run, saved)
    if topo.rank == 0 and checkpoints is not None:
        remove_temporary_files(checkpoints)
    metrics.declare(total_steps=args.epochs * run.steps_per_epoch, total_epochs=args.epochs)
    # Until here a SIGTERM ends the process at once, which is right: there is nothing to save.
    run.stop.install()
    accuracy: float | None = None
    for epoch in range(position.epochs_done, args.epochs):
        accuracy = run_epoch(run, epoch, position)
        position = Position(epoch + 1)
    finish(run, accuracy, started)


@contextlib.contextmanager
def process_group(topo: Topology, backend: str) -> Iterator[None]:
    """Join the job's process group (when there is one) for the duration of the block."""
    if topo.distributed:
        # env:// reads MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE from the environment.
        dist.init_process_group(
            backend=backend,
            init_method="env://",
            rank=topo.rank,
            world_size=topo.world_size,
            timeout=COLLECTIVE_TIMEOUT,
        )
    try:
        yield
    finally:
        # Also on errors, so that the peers see this rank leave instead of waiting on it.
        if dist.is_available() and dist.is_initialized():
            # The DDP model (its reducer holds the process group) lives in reference cycles:
            # left to the collector, it is torn down after the group, sometimes as the
            # interpreter exits, and torch 2.13's gloo then aborts the process ("terminate
            # called without an active exception", SIGABRT) in about 1 run in 25 with 3 ranks,
            # under bare torchrun too. Collected first, it never did in 120 runs.
            gc.collect()
            dist.destroy_process_group()


def freeze_imports() -> None:
    """Leave what the imports made out of every later garbage collection: it lives as long as
    the process. torch, numpy and scikit-learn make some 240,000 objects, which every full
    collection walks, and two come at every run's end: the one before the group is destroyed
    (process_group) and Python's last one as it exits. Together they took about a second
    here (0.1 s frozen), between a trainer's last line and its exit: every job's end waited
    for it, and every restart, whose survivors are stopped and waited for (bench.recovery:
    every instance running again 1.5-1.7 s after a kill -9 before, 0.4 s after)."""
    gc.freeze()


def main(argv: list[str] | None = None) -> int:
    # Wall time counts rendezvous and data loading too (only interpreter start and imports are
    # left out), since that is what a user waits for.
    started = time.perf_counter()
    freeze_imports()
    args = parse_args(argv)
    configure_threads()
    topo = read_topology()
    backend, device = pick_device(topo)
    checkpoints = checkpoint_dir()
    try:
        # Before joining the others: once every rank has joined, rank 0 may overwrite the file.
        saved = load_checkpoint(checkpoints) if checkpoints is not None else None
    except CheckpointError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 1
    with process_group(topo, backend):
        train(args, topo, backend, device, started, checkpoints, saved)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
