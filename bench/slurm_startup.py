"""Submit → first training line, side by side in one run: on a Slurm pool, on the agents, and
under bare `srun` of the same script.

Starts a real three-node Slurm (stack/slurm.py, each slurmd in a network namespace of its own)
and a stack with one agent whose console also has that cluster as a Slurm pool. The program is
bench/programs/ddp_steps.py as two instances (master and worker, cpu-1 each), as bench.startup
runs it; each round runs it three ways, in turn:

- bare srun: `srun --nodelist=n1 --ntasks=2` of the script, with the torchrun contract set from
  Slurm's variables by a two-line launcher (what a Slurm user writes by hand), read through
  srun's pipe: from srun's start to the first training line on the pipe;
- the Slurm pool: the job through the API with "pool", followed on the websocket as a browser
  does: from the submit to the first training line at the client;
- the agents: the same job without a pool.

Medians of ROUNDS rounds after one unmeasured run of each. No asserts: figures and ratios.

    python -m bench.slurm_startup [--rounds 3]
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.logs import PROGRAMS, TRAINER_ENV, settle
from bench.startup import PROGRAM, STEPS, Console, Run, RunFailed
from stack import slurm
from stack.redis_server import free_port
from stack.run import Stack

ROUNDS = 3
POOL = "bench-slurm"
RUN_GUARD_S = 180.0
# What a Slurm user writes instead of torchrun: the contract from Slurm's variables.
LAUNCH = (
    "import os, runpy, sys; e = os.environ; "
    "e.update(RANK=e['SLURM_PROCID'], WORLD_SIZE=e['SLURM_NTASKS'], "
    "LOCAL_RANK=e['SLURM_LOCALID']); "
    "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
)


def bare_srun(cluster: slurm.SlurmCluster) -> Run:
    first = cluster.nodes[0]
    env = {
        **cluster.env(),
        **TRAINER_ENV,
        "MASTER_ADDR": first.address,
        "MASTER_PORT": str(29_500 + os.getpid() % 1000),
    }
    run = Run()
    run.times["start"] = time.time()
    argv = [
        "srun", f"--partition={cluster.partition}", f"--nodelist={first.name}", "--ntasks=2",
        "--cpus-per-task=1", "--unbuffered", "--export=ALL",
        sys.executable, "-c", LAUNCH, str(PROGRAMS / PROGRAM), str(STEPS),
    ]  # fmt: skip
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdout is not None
    with proc.stdout:
        for raw in proc.stdout:
            run.read(raw.decode(errors="replace"), time.time())
    code = proc.wait(timeout=RUN_GUARD_S)
    run.times["end"] = time.time()
    if code != 0 or "first line" not in run.times:
        raise RunFailed(f"srun exited with code {code} (seen: {sorted(run.times)})")
    return run


def add_pool(stack: Stack, cluster: slurm.SlurmCluster, shared: Path) -> None:
    stack.manage(
        "slurm_pool", POOL,
        "--partition", cluster.partition,
        "--shared-root", str(shared),
        "--python", sys.executable,
        "--code-root", str(PROGRAMS),
        "--slurm-conf", str(cluster.conf),
        "--redis-host", cluster.controller_address,
        "--all-images", "--all-packages",
    )  # fmt: skip


def run(rounds: int) -> bool:
    cluster = slurm.SlurmCluster.start()
    with tempfile.TemporaryDirectory(prefix="bench-slurm-") as folder:
        also = () if cluster.controller_address == "127.0.0.1" else (cluster.controller_address,)
        stack = Stack(
            var_dir=Path(folder) / "var", port=free_port(), nodes=1, code_root=PROGRAMS,
            redis_also_on=also,
        )  # fmt: skip
        console: Console | None = None
        try:
            stack.prepare()
            stack.start()
            shared = cluster.root / "shared"
            shared.mkdir()
            add_pool(stack, cluster, shared)
            console = Console(stack, stack.manage("token", "admin").strip())
            bare_srun(cluster)
            console.run("warm-up slurm", POOL)
            console.run("warm-up agents")
            runs: dict[str, list[Run]] = {"bare srun": [], "Slurm pool": [], "agents": []}
            for number in range(rounds):
                settle(stack)
                runs["bare srun"].append(bare_srun(cluster))
                settle(stack)
                runs["Slurm pool"].append(console.run(f"slurm-{number}", POOL))
                settle(stack)
                runs["agents"].append(console.run(f"agents-{number}"))
            base = statistics.median(r.first_line for r in runs["bare srun"])
            print(f"submit -> first training line, median of {rounds} (each run: s)")
            for name, done in runs.items():
                median = statistics.median(r.first_line for r in done)
                each = " ".join(f"{r.first_line:.2f}" for r in done)
                print(f"  {name:<11} {median:5.2f} s  ({median / base:.2f}x bare srun)   [{each}]")
            return True
        except (RunFailed, RuntimeError, OSError) as exc:
            print(f"slurm_startup: FAILED {exc}")
            return False
        finally:
            if console is not None:
                console.close()
            stack.stop()
            cluster.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    args = parser.parse_args()
    return 0 if run(args.rounds) else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
