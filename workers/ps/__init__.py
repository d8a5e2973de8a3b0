"""Trainyard's parameter-server runtime: MXNet's kvstore interface on torch.distributed.

MXNet is retired, but its parameter-server jobs are still how many people think about
distributed training: 1 scheduler, S servers that hold the parameters and run the
optimizer, W workers that compute gradients, and a kvstore mode (dist_sync, dist_device_sync,
dist_async). This package keeps that interface and its environment (DMLC_ROLE,
DMLC_PS_ROOT_URI, DMLC_PS_ROOT_PORT, DMLC_NUM_SERVER, DMLC_NUM_WORKER) so that the same job
description also runs a real MXNet image, and implements it with torch.distributed parts only:
a TCPStore hosted by the scheduler for rendezvous and control, gloo point-to-point for tensors.

A training script dispatches on its role:

    from workers import ps

    topo = ps.read_topology()
    if topo.role == "scheduler":
        raise SystemExit(ps.run_scheduler(topo))
    if topo.role == "server":
        raise SystemExit(ps.run_server(topo))
    kv = ps.create("dist_sync", topo)
    ...

Modules, one concern each: config (environment -> Topology, ranks), session (rendezvous and
leaving), liveness (heartbeats, abort), transport (gloo p2p with timeouts), protocol (messages),
sharding (which server holds what), optim (the update rule), server, scheduler, kvstore (the
worker's API), board (per-epoch figures for worker 0).

Timeouts: TRAINYARD_PS_TIMEOUT (default 20 s) bounds every wait for a reply, a barrier or a sign
of life; a process that dies or hangs stops the whole job within about that long, every other
process exiting non-zero with a message that names whom it lost and what it was waiting for. In
the sync modes it must exceed the longest pause a worker makes between two pushes (evaluation,
checkpointing), as a collective timeout must with DDP. TRAINYARD_PS_JOIN_TIMEOUT (default 120 s)
bounds how long the job's processes may take to all start.
"""

from workers.ps.config import SCHEDULER, SERVER, WORKER, Topology, read_topology
from workers.ps.errors import ConfigError, PeerError, ProtocolError, PSError
from workers.ps.kvstore import KVStore, create
from workers.ps.optim import OptimizerSpec, adam, sgd
from workers.ps.protocol import MODES, SYNC_MODES
from workers.ps.scheduler import run_scheduler
from workers.ps.server import run_server

__all__ = [
    "MODES",
    "SCHEDULER",
    "SERVER",
    "SYNC_MODES",
    "WORKER",
    "ConfigError",
    "KVStore",
    "OptimizerSpec",
    "PSError",
    "PeerError",
    "ProtocolError",
    "Topology",
    "adam",
    "create",
    "read_topology",
    "run_scheduler",
    "run_server",
    "sgd",
]
