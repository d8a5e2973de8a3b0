"""Submit → first training line in containers, beside the same job on the host's Python, in
one run (issue 46's goal: at most 1.3 times the host's).

Starts the real stack (one node, code root bench/programs/, its agent given podman as the
stack gives it wherever podman is installed) and the trainer image built here (make
trainer-image; built now if missing, which is not timed). The job is bench.startup's:
bench/programs/ddp_steps.py as two instances (master and worker, cpu-1 each), followed on the
websocket as a browser does. Each round runs it on the host image (pytorch:2.13-cpu, in
bubblewrap) and then on a copy of it whose trainers run in the trainer image; one unmeasured
run of each first, so the page cache holds torch and the image's layers for both alike.

What the container adds is podman's own start (`podman run`: the OCI runtime, mounts, the
network and cgroup set-up, conmon) for each instance; torch's import is the same files read
from the image's layers instead of the host's virtualenv.

    python -m bench.container_startup [--rounds 3]
"""

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

from bench.logs import PROGRAMS, settle
from bench.startup import Console, Run, RunFailed
from stack import trainer_image
from stack.redis_server import free_port
from stack.run import Stack

ROUNDS = 3
TARGET_RATIO = 1.3
HOST_IMAGE = "pytorch:2.13-cpu"
CONTAINER_IMAGE = "pytorch:2.13-bench-container"


def container_startup(rounds: int = ROUNDS) -> bool:
    """Print both medians and their ratio against the target; False if a run failed."""
    missing = trainer_image.missing_tools()
    if missing:
        print(f"containers: SKIPPED ({', '.join(missing)} missing: make containers)")
        return True
    reference = trainer_image.ensure()
    with tempfile.TemporaryDirectory(prefix="bench-containers-") as folder:
        stack = Stack(var_dir=Path(folder) / "var", port=free_port(), nodes=1, code_root=PROGRAMS)
        console: Console | None = None
        try:
            stack.prepare()
            stack.start()
            stack.manage(
                "container_image", CONTAINER_IMAGE, "--like", HOST_IMAGE, "--reference", reference
            )
            console = Console(stack, stack.manage("token", "admin").strip())
            console.run("warm-up host", image=HOST_IMAGE)
            console.run("warm-up container", image=CONTAINER_IMAGE)
            runs: dict[str, list[Run]] = {"host": [], "container": []}
            for number in range(rounds):  # alternating, so a noisy moment hits both
                settle(stack)
                runs["host"].append(console.run(f"host-{number}", image=HOST_IMAGE))
                settle(stack)
                runs["container"].append(console.run(f"container-{number}", image=CONTAINER_IMAGE))
            _check_ran_in(stack, reference, rounds)
            report(runs, reference)
            return True
        except (RunFailed, RuntimeError, OSError) as exc:
            print(f"container_startup: FAILED {exc}")
            return False
        finally:
            if console is not None:
                console.close()
            stack.stop()


def _check_ran_in(stack: Stack, reference: str, rounds: int) -> None:
    """The timed container jobs were given the trainer image, the host ones none (a figure of
    two host runs side by side would read as a container's cost of nothing)."""
    code = (
        "from jobs.models import Job; "
        f"print(Job.objects.filter(name__startswith='container-', container_image={reference!r})"
        ".count(), Job.objects.filter(name__startswith='host-', container_image='').count())"
    )
    counted = stack.manage("shell", "-c", code).split()
    if counted != [str(rounds), str(rounds)]:
        raise RunFailed(f"jobs in {reference} and on the host: {counted}, not {rounds} each")


def report(runs: dict[str, list[Run]], reference: str) -> None:
    host = statistics.median(r.first_line for r in runs["host"])
    print(f"submit -> first training line, 2-instance DDP, median of {len(runs['host'])} (s)")
    for name, done in runs.items():
        median = statistics.median(r.first_line for r in done)
        each = " ".join(f"{r.first_line:.2f}" for r in done)
        print(f"  {name:<10} {median:5.2f} s  ({median / host:.2f}x the host's)   [{each}]")
    ratio = statistics.median(r.first_line for r in runs["container"]) / host
    verdict = "MET" if ratio <= TARGET_RATIO else "MISSED"
    print(
        f"  in {reference} vs the host's Python: {ratio:.2f}x "
        f"(target <= {TARGET_RATIO}x: {verdict})"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    args = parser.parse_args()
    return 0 if container_startup(args.rounds) else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
