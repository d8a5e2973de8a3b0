"""The node agent: a Celery worker on its node's own queue, plus the supervisor and a heartbeat.

Run one per host:  python -m workers.agent --node gpu-7 --address 10.0.0.7 --redis-url redis://...

It needs Redis and the trainers' code only. The Celery tasks are thin: they hand a spec to the
supervisor (or ask it to stop a job) and return at once; the supervisor owns the processes.
"""

import argparse
import logging
import os
import platform
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

import redis
from celery import Celery

from workers import contract, inventory
from workers.logship import LogShipper
from workers.spec import ReplicaSpec
from workers.supervisor import Supervisor

log = logging.getLogger("trainyard.agent")

HEARTBEAT_SECONDS = 5.0


def make_celery(broker_url: str) -> Celery:
    app = Celery("trainyard-agent", broker=broker_url)
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        task_ignore_result=True,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
    )
    return app


def register_tasks(app: Celery, supervisor: Supervisor) -> None:
    @app.task(name=contract.TASK_START_REPLICA)
    def start_replica(spec: dict[str, Any]) -> None:
        supervisor.start(ReplicaSpec.from_dict(spec))

    @app.task(name=contract.TASK_STOP_JOB)
    def stop_job(job_id: int, reason: str) -> None:
        supervisor.stop_job(job_id, reason)


def make_reporter(app: Celery) -> Any:
    def report(task_name: str, payload: dict[str, Any]) -> None:
        # Outcomes must reach the console even across a short broker outage.
        app.send_task(
            task_name,
            kwargs={"payload": payload},
            queue=contract.CONSOLE_QUEUE,
            retry=True,
            retry_policy={
                "max_retries": 60,
                "interval_start": 0.5,
                "interval_step": 0.5,
                "interval_max": 5,
            },
        )

    return report


class Heartbeat(threading.Thread):
    """Tells the console, every few seconds, that this node lives, what it has and what it runs."""

    def __init__(self, app: Celery, inventory: dict[str, Any], supervisor: Supervisor) -> None:
        super().__init__(name="heartbeat", daemon=True)
        self._app = app
        self._inventory = inventory
        self._supervisor = supervisor
        self._stopped = threading.Event()

    def run(self) -> None:
        while not self._stopped.is_set():
            payload = dict(self._inventory, running=self._supervisor.running(), sent=time.time())
            try:
                self._app.send_task(
                    contract.TASK_NODE_HEARTBEAT,
                    kwargs={"payload": payload},
                    queue=contract.CONSOLE_QUEUE,
                    expires=HEARTBEAT_SECONDS * 6,  # a stale heartbeat is worthless
                )
            except Exception:
                log.warning("heartbeat not sent; broker unreachable?", exc_info=True)
            self._stopped.wait(HEARTBEAT_SECONDS)

    def stop(self) -> None:
        self._stopped.set()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--node", default=socket.gethostname(), help="this node's unique name")
    parser.add_argument(
        "--address", default="127.0.0.1", help="address other nodes reach this one at"
    )
    parser.add_argument("--redis-url", default=os.environ.get("REDIS_URL", ""))
    # Left unset, capacity is what the host has (GPUs through NVML); set them to advertise
    # less (or, for a local demo, more) than that.
    found = inventory.detect()
    parser.add_argument("--cpus", type=int, default=found.cpus)
    parser.add_argument("--memory-gb", type=int, default=found.memory_gb)
    parser.add_argument("--gpus", type=int, default=found.gpus)
    parser.add_argument("--gpu-model", default=found.gpu_model)
    parser.add_argument("--workdir", type=Path, default=Path("var/agents"))
    parser.add_argument(
        "--code-root",
        type=Path,
        default=Path(os.environ.get(contract.TRAINYARD_CODE_ROOT, "code")),
        help="users' scripts must resolve inside this folder",
    )
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args(argv)
    if not args.redis_url:
        parser.error("set --redis-url or REDIS_URL")
    for name in ("cpus", "memory_gb"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.gpus < 0:
        parser.error("--gpus must not be negative")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s %(levelname)s [{args.node}] %(message)s"
    )
    client = redis.Redis.from_url(args.redis_url)
    app = make_celery(args.redis_url)
    workdir = args.workdir.resolve() / args.node
    # Lines wait here while Redis is unreachable, and survive a restart of this agent.
    shipper = LogShipper(client, spool_dir=workdir / "log-spool")
    supervisor = Supervisor(
        node=args.node,
        client=client,
        shipper=shipper,
        report=make_reporter(app),
        workdir=workdir,
        code_root=args.code_root.resolve(),
        gpus=args.gpus,
    )
    register_tasks(app, supervisor)
    inventory = {
        "node": args.node,
        "address": args.address,
        "cpus": args.cpus,
        "memory_gb": args.memory_gb,
        "gpus": args.gpus,
        "gpu_model": args.gpu_model,
        "hostname": platform.node(),
        "pid": os.getpid(),
    }
    heartbeat = Heartbeat(app, inventory, supervisor)
    heartbeat.start()
    worker = app.Worker(
        hostname=f"agent@{args.node}",
        queues=[contract.node_queue(args.node)],
        pool_cls="threads",
        concurrency=args.concurrency,
        loglevel="INFO",
        without_mingle=True,
        without_gossip=True,
    )
    log.info("agent %s serving queue %s", args.node, contract.node_queue(args.node))
    try:
        worker.start()
    finally:
        heartbeat.stop()
        supervisor.shutdown()
        shipper.close()
    return int(worker.exitcode or 0)


if __name__ == "__main__":
    sys.exit(main())
