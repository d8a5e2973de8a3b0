"""The parameter-server runtime end to end: real processes, one per role, as the platform starts
them (1 scheduler + 2 servers + 2 workers of workers/examples/digits_ps.py)."""

from __future__ import annotations

import os
import re
import signal
import time
from dataclasses import dataclass

import pytest

from tests.ps.launcher import Job, ddp_job, ps_job

pytestmark = pytest.mark.integration

EPOCHS = 4  # enough for >= 0.95 on digits in every mode, few enough to keep the suite short
ARGS = ["--epochs", str(EPOCHS), "--batch-size", "32", "--seed", "0"]
EPOCH_LINE = re.compile(r"^epoch=(\d+)/(\d+) loss=([0-9.]+) lr=([0-9.]+) .*eval_accuracy=([0-9.]+)")
FINAL = re.compile(r"^final eval_accuracy=([0-9.]+) wall_time_s=([0-9.]+)$")
SERVER_EPOCH = re.compile(
    r"^server=(\d) epoch=(\d+)/(\d+) pushes=(\d+) updates=(\d+) bytes_in=(\d+) bytes_out=(\d+) "
    r"keys=(\d+) params=(\d+)$"
)
RATE = re.compile(r"samples_per_sec=([0-9.]+)")


@dataclass
class Run:
    codes: dict[str, int]
    job: Job

    def lines(self, tag: str) -> list[str]:
        return self.job[tag].stdout_lines()

    def losses(self, tag: str) -> list[float]:
        return [float(m.group(3)) for m in map(EPOCH_LINE.match, self.lines(tag)) if m]

    def final_accuracy(self, tag: str) -> float:
        found = [float(m.group(1)) for m in map(FINAL.match, self.lines(tag)) if m]
        assert len(found) == 1, self.job.dump()
        return found[0]

    def mean_rate(self, tag: str) -> float:
        rates = [float(m.group(1)) for line in self.lines(tag) if (m := RATE.search(line))]
        return sum(rates) / len(rates)


def run_ps(mode: str) -> Run:
    with ps_job(servers=2, workers=2, args=["--kvstore", mode, *ARGS]) as job:
        codes = job.wait()
        return Run(codes, job)


@pytest.fixture(scope="module")
def runs() -> dict[str, Run]:
    """Each job runs once per module, on first use (get_run); the tests that read it share it."""
    return {}


def get_run(runs: dict[str, Run], mode: str) -> Run:
    if mode not in runs:
        if mode == "ddp":
            with ddp_job(ranks=2, args=ARGS) as job:
                runs[mode] = Run(job.wait(), job)
        else:
            runs[mode] = run_ps(mode)
    return runs[mode]


@pytest.mark.parametrize("mode", ["dist_sync", "dist_device_sync", "dist_async"])
def test_a_job_of_each_mode_trains_and_exits_cleanly(runs: dict[str, Run], mode: str) -> None:
    run = get_run(runs, mode)
    assert run.codes == {
        "scheduler": 0,
        "server-0": 0,
        "server-1": 0,
        "worker-0": 0,
        "worker-1": 0,
    }, run.job.dump()

    scheduler = run.lines("scheduler")
    joined = {line.split(" rank=")[0] for line in scheduler if line.startswith("joined ")}
    assert joined == {
        "joined role=scheduler index=0",
        "joined role=server index=0",
        "joined role=server index=1",
        "joined role=worker index=0",
        "joined role=worker index=1",
    }
    assert any(line.startswith("all joined: ") for line in scheduler)
    assert any(line.startswith("all finished: ") for line in scheduler)

    # Every server logs its traffic once per epoch; together they hold the whole model.
    params = 0
    for index in (0, 1):
        epochs = [m for m in map(SERVER_EPOCH.match, run.lines(f"server-{index}")) if m]
        assert [int(m.group(2)) for m in epochs] == list(range(1, EPOCHS + 1))
        # 719 rows per worker in batches of 32 -> 23 pushes per worker and epoch.
        assert all(int(m.group(4)) == 2 * 23 for m in epochs)
        updates = 23 if mode != "dist_async" else 2 * 23  # one per round, or one per push
        assert all(int(m.group(5)) == updates for m in epochs)
        held = int(epochs[0].group(9))
        # After the first epoch (which also carries init), an epoch's traffic is exactly its
        # pushes, each a 40-byte header plus 4 bytes per parameter held, the 2 workers' end of
        # epoch headers, and one reply of 4 bytes per parameter held per push.
        for m in epochs[1:]:
            assert int(m.group(6)) == 2 * 23 * (40 + 4 * held) + 2 * 40
            assert int(m.group(7)) == 2 * 23 * 4 * held
        params += held
    assert params == 64 * 128 + 128 + 128 * 64 + 64 + 64 * 10 + 10

    worker0 = run.lines("worker-0")
    batch = "global_batch=64" if mode != "dist_async" else "update_batch=32"
    assert any(f"kvstore={mode}" in line and batch in line for line in worker0)
    assert [int(m.group(1)) for m in map(EPOCH_LINE.match, worker0) if m] == list(
        range(1, EPOCHS + 1)
    )
    assert run.final_accuracy("worker-0") >= 0.95
    assert any(
        line.startswith(f"epoch={EPOCHS}/{EPOCHS} worker=1 ") for line in run.lines("worker-1")
    )


def test_dist_sync_reproduces_ddp_loss_curve(runs: dict[str, Run]) -> None:
    sync, ddp = get_run(runs, "dist_sync"), get_run(runs, "ddp")
    assert set(ddp.codes.values()) == {0}, ddp.job.dump()
    ps_losses, ddp_losses = sync.losses("worker-0"), ddp.losses("master")
    assert len(ps_losses) == len(ddp_losses) == EPOCHS
    deltas = [abs(a - b) for a, b in zip(ps_losses, ddp_losses, strict=True)]
    print(
        f"\nloss per epoch: dist_sync {ps_losses}, DDP {ddp_losses}, max |delta| {max(deltas):.1e}"
        f"\nsamples/s: dist_sync {sync.mean_rate('worker-0'):.0f}, "
        f"DDP {ddp.mean_rate('master'):.0f}"
    )
    # Printed with 4 decimals: equal curves may still round apart by one unit in the last place.
    assert max(deltas) <= 1.01e-4


def test_dist_device_sync_is_dist_sync_on_a_cpu(runs: dict[str, Run]) -> None:
    sync, device = get_run(runs, "dist_sync"), get_run(runs, "dist_device_sync")
    assert device.losses("worker-0") == sync.losses("worker-0")
    assert device.final_accuracy("worker-0") == sync.final_accuracy("worker-0")


def test_dist_async_gets_within_two_points_of_dist_sync(runs: dict[str, Run]) -> None:
    sync = get_run(runs, "dist_sync").final_accuracy("worker-0")
    asyn = get_run(runs, "dist_async").final_accuracy("worker-0")
    print(f"\nfinal eval_accuracy: dist_sync {sync:.4f}, dist_async {asyn:.4f}")
    assert asyn >= sync - 0.02


def test_killing_a_server_makes_every_other_process_fail_on_its_own() -> None:
    args = ["--kvstore", "dist_sync", "--epochs", "60", "--seed", "0"]
    with ps_job(servers=2, workers=2, args=args) as job:
        job.wait_for_line("worker-0", "epoch=2/60 ")
        killed_at = time.monotonic()
        os.kill(job["server-0"].popen.pid, signal.SIGKILL)
        codes = job.watch_exits()
        after = {
            tag: proc.exited_at - killed_at
            for tag, proc in job.procs.items()
            if tag != "server-0" and proc.exited_at is not None
        }
        print(
            "\nexit after killing server-0: "
            + ", ".join(f"{t} {s:.1f} s" for t, s in after.items())
        )
        assert codes["server-0"] == -signal.SIGKILL
        for tag in ("scheduler", "server-1", "worker-0", "worker-1"):
            assert codes[tag] != 0, job.dump()
            err = job[tag].text("stderr")
            # Each one says what went wrong, whom it concerns and what it was doing.
            assert "error: " in err and "server-0" in err, job.dump()
            assert re.search(r"(waiting for|while sending)", err), job.dump()
        assert not any("final eval_accuracy" in line for line in job["worker-0"].stdout_lines())
