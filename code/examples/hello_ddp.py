"""The smallest distributed program: every rank joins the group and sums its rank.

Launch it from Trainyard with any number of instances; each prints what the platform set.
"""

import os

import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    role, index = os.environ.get("TRAINYARD_ROLE", "?"), os.environ.get("TRAINYARD_INDEX", "?")
    print(f"hello from rank {rank}/{world} ({role}-{index}), master {os.environ['MASTER_ADDR']}")
    total = torch.tensor([rank])
    dist.all_reduce(total)
    print(f"sum of ranks = {int(total)} (expected {world * (world - 1) // 2})")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
