"""A tiny parameter-server job for the tests: keyed pushes and pulls whose results are known.

    python kv_script.py MODE [MODE_OF_WORKER_1]

Every worker initialises keys a (3x4, split over both servers by a tiny big-array bound), b and
c; pushes a (as two "device" copies) and c with gradient rank+1; pulls. With SGD at lr 1 and
no momentum, a and c must move by the mean gradient 1.5 in the sync modes and by the sum 3 in
dist_async (after a barrier), and b must not move. Prints `ok ...` or raises.
"""

import sys

import torch

from workers import ps

A0 = torch.arange(12.0).reshape(3, 4)
B0 = torch.tensor([10.0, 20.0])
C0 = torch.full((3,), 5.0)


def work(kv: ps.KVStore) -> None:
    kv.set_optimizer(ps.sgd(lr=1.0))
    kv.init(["a", "b", "c"], [A0, B0, C0])
    print(f"sharding {kv.describe_sharding()}", flush=True)
    grad = float(kv.rank + 1)
    devices = [torch.full((3, 4), grad - 0.5), torch.full((3, 4), grad + 0.5)]
    kv.push(["a", "c"], [devices, torch.full((3,), grad)])
    a, b, c = torch.zeros(3, 4), torch.zeros(2), torch.zeros(3)
    kv.pull(["a", "b", "c"], out=[a, b, c])
    if kv.type in ps.SYNC_MODES:
        # Every worker sees the same values: the round waited for both pushes.
        shift = 1.5
    else:
        kv.barrier()  # both pushes applied, each on its own
        kv.pull(["a", "c"], out=[a, c])
        shift = 3.0
    kv.pull("b", out=b)
    assert torch.equal(a, A0 - shift), (a, A0 - shift)
    assert torch.equal(b, B0), b
    assert torch.equal(c, C0 - shift), c
    print(f"ok worker={kv.rank} mode={kv.type} shift={shift}", flush=True)


def main() -> int:
    topo = ps.read_topology()
    if topo.role == ps.SCHEDULER:
        return ps.run_scheduler(topo)
    if topo.role == ps.SERVER:
        return ps.run_server(topo)
    mode = sys.argv[2] if len(sys.argv) > 2 and topo.index == 1 else sys.argv[1]
    kv = ps.create(mode, topo, big_array_bound=5)
    try:
        work(kv)
    except Exception as exc:
        return kv.fail(exc)
    kv.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
