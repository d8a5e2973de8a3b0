"""A short DDP run that says when each of its own start-up stages ended.

    torchrun --nproc_per_node 2 ddp_steps.py STEPS      (or one process per instance, as the
                                                          agent starts them)

Its first line, printed by rank 0 as soon as the process group is up, carries the times (unix
seconds) at which this process was created, its interpreter reached the script, torch was
imported and the rendezvous ended: bench/startup.py builds its timeline from them. Then each
rank takes STEPS small all-reduce steps, and rank 0 prints a line per step; the last line is
"last t=<time>", after which the script only leaves the process group and exits. The other
ranks print their own start-up times once, in a line "rank<N> t=... created=...".
"""

import os
import time

REACHED = time.time()  # the interpreter has started and reached the script

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

IMPORTED = time.time()


def created() -> float:
    """When this process was created (unix seconds, to the kernel's clock tick): its start time
    in /proc, as an age measured against the uptime, which a PID namespace does not change."""
    with open("/proc/self/stat") as stat:
        # The command name may hold spaces: the fields after it start past its ")".
        fields = stat.read().rsplit(")", 1)[1].split()
    started_ticks = int(fields[19])
    with open("/proc/uptime") as uptime:
        up = float(uptime.read().split()[0])
    return time.time() - (up - started_ticks / os.sysconf("SC_CLK_TCK"))


def main() -> None:
    import sys

    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    born = created()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rendezvous = time.time()
    rank = dist.get_rank()
    times = (
        f"t={time.time():.6f} created={born:.6f} reached={REACHED:.6f} "
        f"imported={IMPORTED:.6f} rendezvous={rendezvous:.6f}"
    )
    # Rank 0's is the first training line; the others' say when their own stages ended.
    print(f"first {times}" if rank == 0 else f"rank{rank} {times}", flush=True)
    value = torch.ones(1024)
    for step in range(steps):
        dist.all_reduce(value)
        value /= dist.get_world_size()
        if rank == 0 and step < steps - 1:
            print(f"step={step} t={time.time():.6f}", flush=True)
    if rank == 0:
        print(f"last t={time.time():.6f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
