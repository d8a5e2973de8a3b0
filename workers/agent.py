"""The node agent: a Celery worker on its node's own queue, plus the supervisor and a heartbeat.

Run one per host:  trainyard-agent --node gpu-7 --address 10.0.0.7 --redis-url redis://...
(or python -m workers.agent ...; docs/deploy.md).

It needs Redis and the trainers' code only. The Celery tasks are thin: they hand a spec to the
supervisor (or ask it to stop a job) and return at once; the supervisor owns the processes.

Before it takes any task, the agent takes over the replicas an earlier agent on the same work dir
left to their keepers (workers/keeper.py), kills whatever else it left behind, and starts its
guardian (workers/guardian.py), which kills what no keeper holds if this agent dies.

On SIGTERM (a restart, an upgrade, `systemctl stop`) it leaves its running replicas to their
keepers: an agent that starts within --keeper-grace takes them over, else the keepers stop
them. On SIGUSR2 it stops its trainers, reports their exits, and ends. Either way it ends
within --stop-timeout, whether Redis answers or not.
"""

import argparse
import fcntl
import logging
import os
import platform
import shutil
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import redis
from celery import Celery
from kombu import Queue

from workers import (
    artifacts,
    cgroups,
    checkpoint_retention,
    containers,
    contract,
    credentials,
    diskspace,
    guardian,
    heartbeat_route,
    images,
    inventory,
    jobfolders,
    keeper,
    sandbox,
)
from workers.launcher import NodeNetwork
from workers.logship import LogShipper
from workers.procrecords import summary
from workers.redis_tls import celery_ssl_options
from workers.spec import ReplicaSpec
from workers.supervisor import Report, Supervisor

log = logging.getLogger("trainyard.agent")

HEARTBEAT_SECONDS_ENV = "TRAINYARD_HEARTBEAT_SECONDS"
DEFAULT_HEARTBEAT_SECONDS = 5.0
CHECKPOINT_ROOT_ENV = "TRAINYARD_CHECKPOINT_ROOT"
SPARE_KEEPERS_ENV = "TRAINYARD_SPARE_KEEPERS"
# Two: the instances of a job that one node runs arrive together, and most jobs put one or two
# on a node; more cost 17 MB each while idle (workers/keeperlink.py, SpareKeepers).
DEFAULT_SPARE_KEEPERS = 2
# A heartbeat older than this many intervals is worthless: the broker drops it.
HEARTBEAT_EXPIRES_INTERVALS = 6
# The local stack (like systemd's default) SIGKILLs an agent 30 s after SIGTERM; end well before.
DEFAULT_STOP_TIMEOUT_SECONDS = 20.0
# After the supervisor's shutdown: how long the log shipper gets for its last flush (and as long
# again for its thread to end), and the guardian to end.
SHIPPER_CLOSE_SECONDS = 0.75
GUARDIAN_RELEASE_SECONDS = 1.0
# Of the stop timeout, what is kept for the above and for the supervisor's own overrun (0.5 s).
CLOSING_MARGIN_SECONDS = 3.0
# The retry policy of a report outside a shutdown: outcomes must reach the console even across a
# broker outage of a few minutes.
PATIENT_RETRY_POLICY = {
    "max_retries": 60,
    "interval_start": 0.5,
    "interval_step": 0.5,
    "interval_max": 5,
}
HURRIED_RETRY_INTERVAL_SECONDS = 0.25
# (task name, payload) -> the payload as sent: signed for the console (workers/credentials.py).
Signer = Callable[[str, dict[str, Any]], dict[str, Any]]


def make_celery(broker_url: str, node: str | None = None) -> Celery:
    """The agent's Celery app; with `node`, set up for the node's own Redis ACL user
    (workers/credentials.py): its own unacked keys, queues that are only used, never declared
    (a declaration writes the exchange's binding table, which the console owns), and no remote
    control (its broadcast queues and pub/sub channels are shared by every worker)."""
    app = Celery("trainyard-agent", broker=broker_url)
    if node is not None:
        app.conf.update(
            broker_transport_options=credentials.transport_options(node),
            task_queues=[
                Queue(contract.node_queue(node), no_declare=True),
                Queue(contract.CONSOLE_QUEUE, no_declare=True),
            ],
            worker_enable_remote_control=False,
        )
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        task_ignore_result=True,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        broker_use_ssl=celery_ssl_options(broker_url),
    )
    return app


def register_tasks(app: Celery, supervisor: Supervisor, client: redis.Redis) -> None:
    @app.task(name=contract.TASK_START_REPLICA)
    def start_replica(spec: dict[str, Any]) -> None:
        supervisor.start(ReplicaSpec.from_dict(spec))

    @app.task(name=contract.TASK_STOP_JOB)
    def stop_job(
        job_id: int,
        reason: str,
        replicas: list[dict[str, Any]] | None = None,
        up_to_attempt: int | None = None,
        grace_seconds: float | None = None,
        only_listed: bool = False,
    ) -> None:
        supervisor.stop_job(job_id, reason, replicas, up_to_attempt, grace_seconds, only_listed)

    @app.task(name=contract.TASK_REMOVE_CHECKPOINTS)
    def remove_checkpoints(job_id: int, checkpoint_key: str) -> None:
        supervisor.remove_checkpoints(job_id, checkpoint_key)

    @app.task(name=contract.TASK_REMOVE_WORKING_FOLDER)
    def remove_working_folder(job_id: int, checkpoint_key: str) -> None:
        supervisor.remove_working_folder(job_id, checkpoint_key)

    # A job's artifacts (workers/artifacts.py): the console waits for the answer.
    @app.task(name=contract.TASK_LIST_ARTIFACTS)
    def list_artifacts(request: dict[str, Any]) -> None:
        _serve_artifacts(supervisor, client, request)

    @app.task(name=contract.TASK_READ_ARTIFACT)
    def read_artifact(request: dict[str, Any]) -> None:
        _serve_artifacts(supervisor, client, request)


def _serve_artifacts(supervisor: Supervisor, client: redis.Redis, request: dict[str, Any]) -> None:
    artifacts.serve(
        request,
        client=client,
        node=supervisor.node,
        checkpoint_root=supervisor.checkpoint_root,
        sandbox=supervisor.sandbox,
    )


def retry_policy(deadline: float | None) -> dict[str, Any]:
    """Patient by default; with a deadline (time.monotonic()), retries that fit before it."""
    if deadline is None:
        return dict(PATIENT_RETRY_POLICY)
    left = deadline - time.monotonic()
    return {
        "max_retries": max(0, int(left / HURRIED_RETRY_INTERVAL_SECONDS)),
        "interval_start": 0,
        "interval_step": HURRIED_RETRY_INTERVAL_SECONDS,
        "interval_max": HURRIED_RETRY_INTERVAL_SECONDS,
    }


def signer(broker_url: str) -> Signer:
    """Signs a report for the console with the key derived from the agent's secret (in its
    Redis URL); an agent without credentials (a development set-up on the console's own Redis
    URL) sends reports as they are."""
    found = credentials.secret_from_url(broker_url)
    if found is None:
        return lambda task, payload: payload
    key = credentials.signing_key(found[1])
    return lambda task, payload: credentials.sign(payload, key, task)


def stamped(payload: dict[str, Any]) -> dict[str, Any]:
    """What the agent sends the console, with the protocol version it speaks (one place, for
    heartbeats and reports alike): the console starts nothing on an agent too old for it."""
    return dict(payload, **{contract.PROTOCOL_FIELD: contract.PROTOCOL_VERSION})


def make_reporter(app: Celery, sign: Signer | None = None) -> Report:
    def report(task_name: str, payload: dict[str, Any], deadline: float | None = None) -> None:
        payload = stamped(payload)
        if sign is not None:
            payload = sign(task_name, payload)
        app.send_task(
            task_name,
            kwargs={"payload": payload},
            queue=contract.CONSOLE_QUEUE,
            retry=True,
            retry_policy=retry_policy(deadline),
        )

    return report


def heartbeat_payload(inventory: dict[str, Any], supervisor: Supervisor) -> dict[str, Any]:
    """What the node has, and what it runs and ran lately, by this agent process; whether its
    work disk is full ("disk_full": the reason, empty while there is room)."""
    full = supervisor.disk.full_reason() if supervisor.disk is not None else None
    return stamped(
        dict(
            inventory,
            disk_full=full or "",
            incarnation=supervisor.incarnation,
            running=supervisor.running(),
            finished=supervisor.finished(),
            sent=time.time(),
        )
    )


class Heartbeat(threading.Thread):
    """Tells the console, every few seconds, that this node lives, what it has and what it runs:
    onto the console's heartbeat list while it drains one, else as a Celery task
    (workers/heartbeat_route.py)."""

    def __init__(
        self,
        app: Celery,
        inventory: dict[str, Any],
        supervisor: Supervisor,
        interval: float = DEFAULT_HEARTBEAT_SECONDS,
        sign: Signer | None = None,
        client: redis.Redis | None = None,
    ) -> None:
        super().__init__(name="heartbeat", daemon=True)
        self._sign = sign or (lambda task, payload: payload)
        self._app = app
        self._client = client  # None: always the Celery task
        self._inventory = inventory
        self._supervisor = supervisor
        self._interval = interval
        self._stopped = threading.Event()

    def run(self) -> None:
        # The first one at once: the console learns of the node (and its incarnation) now.
        while not self._stopped.is_set():
            try:
                self.send(
                    self._sign(
                        contract.TASK_NODE_HEARTBEAT,
                        heartbeat_payload(self._inventory, self._supervisor),
                    )
                )
            except Exception:
                log.warning("heartbeat not sent; broker unreachable?", exc_info=True)
            self._stopped.wait(self._interval)

    def send(self, payload: dict[str, Any]) -> None:
        if self._client is not None:
            try:
                message = heartbeat_route.route(
                    self._client.get(contract.HEARTBEATS_DRAINED_KEY), payload
                )
                if message is not None:
                    self._client.rpush(contract.HEARTBEATS_KEY, message)
                    return
            except redis.RedisError as exc:
                # Quietly: an older console's ACL refuses the flag on every heartbeat; and where
                # Redis is down the task below says so.
                log.debug("heartbeat not pushed (%s); sending it as a task", exc)
        self._app.send_task(
            contract.TASK_NODE_HEARTBEAT,
            kwargs={"payload": payload},
            queue=contract.CONSOLE_QUEUE,
            expires=self._interval * HEARTBEAT_EXPIRES_INTERVALS,
        )

    def stop(self) -> None:
        self._stopped.set()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--node", default=socket.gethostname(), help="this node's unique name")
    parser.add_argument(
        "--address",
        default="127.0.0.1",
        help="the address other nodes reach this one at (a job's MASTER_ADDR / "
        "DMLC_PS_ROOT_URI when its master or scheduler runs here)",
    )
    parser.add_argument(
        "--interface",
        default=None,
        help="the network interface trainers talk over (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME, "
        "DMLC_INTERFACE); default: the interface that holds --address",
    )
    parser.add_argument(
        "--container-runtime",
        default=None,
        help="podman or docker (a name or a path), for jobs whose image is a container; "
        "default: podman, else docker, if installed",
    )
    parser.add_argument(
        "--container-config",
        type=Path,
        default=None,
        help="podman's settings file for this host (CONTAINERS_CONF), e.g. "
        "deploy/podman/containers.conf: runc, cgroupfs, no raised rlimits (docs/deploy.md)",
    )
    parser.add_argument(
        "--image-cache-gb",
        type=float,
        default=images.DEFAULT_CACHE_BYTES / (1 << 30),
        help="the most the container images this agent pulled may take on disk; beyond it the "
        "least recently used unused ones are removed (never localhost/ images)",
    )
    parser.add_argument(
        "--trainer-python",
        default=sys.executable,
        help="the Python that runs trainers (a virtualenv or conda environment with the "
        "frameworks); default: the agent's own",
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
    parser.add_argument(
        "--checkpoint-root",
        type=Path,
        default=os.environ.get(CHECKPOINT_ROOT_ENV) or None,
        help="where jobs' checkpoint folders are; every node must see the same folder (a "
        "shared file system) for a job to resume on another node after a restart "
        f"(default: ${CHECKPOINT_ROOT_ENV}, else checkpoints/ in --workdir)",
    )
    parser.add_argument(
        "--no-sandbox",
        dest="sandbox",
        action="store_false",
        help="run trainers outside the bubblewrap sandbox: they can then read what the agent "
        "can, and the node is shown as not isolated (docs/security.md)",
    )
    parser.add_argument(
        "--no-limits",
        dest="limits",
        action="store_false",
        help="run instances without a cgroup of their own: nothing then holds a job to its "
        "package's cores, memory and processes, and the node is shown as \"limits not "
        'enforced" (docs/security.md)',
    )
    parser.add_argument(
        "--sandbox-uid-base",
        type=int,
        default=int(os.environ.get("TRAINYARD_SANDBOX_UID_BASE", sandbox.DEFAULT_UID_BASE)),
        help="a root agent runs each console user's trainers as this uid + the user's id; the "
        "same on every node (default: $TRAINYARD_SANDBOX_UID_BASE or "
        f"{sandbox.DEFAULT_UID_BASE})",
    )
    parser.add_argument(
        "--sandbox-share",
        type=Path,
        action="append",
        default=sandbox.shared_from_env(),
        help="a folder every trainer on this node may read (a shared data set); repeat for "
        f"more (default: ${sandbox.SHARED_ENV}, folders separated by '{os.pathsep}')",
    )
    parser.add_argument(
        "--keep-job-folders",
        type=int,
        default=int(os.environ.get(jobfolders.KEEP_ENV, jobfolders.DEFAULT_KEEP)),
        help="how many ended jobs' folders (their scratch files and unpacked code, not their "
        "checkpoints) stay on this node for inspection; older ones are removed (default: "
        f"${jobfolders.KEEP_ENV} or {jobfolders.DEFAULT_KEEP})",
    )
    parser.add_argument(
        "--keep-checkpoints",
        type=int,
        default=int(
            os.environ.get(checkpoint_retention.KEEP_ENV, checkpoint_retention.DEFAULT_KEEP)
        ),
        help="how many of a job's newest checkpoints (entries of its checkpoint folder) stay "
        "once it no longer runs on this node; 0 keeps them all (default: "
        f"${checkpoint_retention.KEEP_ENV} or {checkpoint_retention.DEFAULT_KEEP})",
    )
    parser.add_argument(
        "--keeper-grace",
        type=float,
        default=float(os.environ.get(keeper.GRACE_ENV, keeper.DEFAULT_GRACE_SECONDS)),
        help="how long a replica's keeper keeps its processes running with no agent (after a "
        "crash or a SIGTERM); an agent that starts on this work dir within it takes them over "
        f"(default: ${keeper.GRACE_ENV} or {keeper.DEFAULT_GRACE_SECONDS:g})",
    )
    parser.add_argument(
        "--spare-keepers",
        type=int,
        default=int(os.environ.get(SPARE_KEEPERS_ENV, DEFAULT_SPARE_KEEPERS)),
        help="how many replica keepers wait started ahead of need, so that replicas arriving "
        "together start without waiting for a keeper's interpreter; each takes about 17 MB "
        f"while it waits; 0 starts every keeper when its replica comes (default: "
        f"${SPARE_KEEPERS_ENV} or {DEFAULT_SPARE_KEEPERS})",
    )
    parser.add_argument(
        "--min-free-mb",
        type=int,
        default=int(os.environ.get(diskspace.MIN_FREE_ENV, diskspace.DEFAULT_MIN_FREE_MB)),
        help="with no more free than this on the work dir's disk, the node takes no new work "
        "and says so in its heartbeat (default: "
        f"${diskspace.MIN_FREE_ENV} or {diskspace.DEFAULT_MIN_FREE_MB})",
    )
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument(
        "--heartbeat-seconds",
        type=float,
        default=float(os.environ.get(HEARTBEAT_SECONDS_ENV, DEFAULT_HEARTBEAT_SECONDS)),
        help=f"between heartbeats (default: ${HEARTBEAT_SECONDS_ENV} or "
        f"{DEFAULT_HEARTBEAT_SECONDS:g})",
    )
    parser.add_argument(
        "--stop-timeout",
        type=float,
        default=DEFAULT_STOP_TIMEOUT_SECONDS,
        help="after SIGTERM, the agent has stopped its trainers and exited within this many "
        "seconds, even when Redis is unreachable",
    )
    args = parser.parse_args(argv)
    if not args.redis_url:
        parser.error("set --redis-url or REDIS_URL")
    if args.min_free_mb < 0:
        parser.error("--min-free-mb must be 0 or more")
    if args.keep_job_folders < 0 or args.keep_checkpoints < 0:
        parser.error("--keep-job-folders and --keep-checkpoints must be 0 or more")
    for name in ("cpus", "memory_gb"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.gpus < 0:
        parser.error("--gpus must not be negative")
    for shared in args.sandbox_share:
        if not shared.is_dir():
            parser.error(f"--sandbox-share {shared}: no such folder")
    if not 0 < args.sandbox_uid_base < 2**31 - 2**24:
        parser.error("--sandbox-uid-base must leave room for 2^24 users below 2^31")
    if args.heartbeat_seconds <= 0:
        parser.error("--heartbeat-seconds must be positive")
    if args.keeper_grace <= 0:
        parser.error("--keeper-grace must be positive")
    if args.spare_keepers < 0:
        parser.error("--spare-keepers must be 0 or more")
    if args.stop_timeout <= CLOSING_MARGIN_SECONDS:
        parser.error(f"--stop-timeout must be more than {CLOSING_MARGIN_SECONDS:g}")
    here = inventory.interfaces()
    if args.interface is not None and args.interface not in here:
        parser.error(
            f"--interface {args.interface}: no such interface here (there are: "
            f"{', '.join(sorted(here))})"
        )
    if args.container_runtime and containers.find_runtime(args.container_runtime) is None:
        parser.error(f"--container-runtime {args.container_runtime}: no such executable")
    if args.container_config is not None and not args.container_config.is_file():
        parser.error(f"--container-config {args.container_config}: no such file")
    python = shutil.which(args.trainer_python)
    if python is None:
        parser.error(f"--trainer-python {args.trainer_python}: no such executable")
    args.trainer_python = python
    return args


def node_network(address: str, interface: str | None) -> NodeNetwork:
    """The address and interface trainers of this node use; an address that no interface here
    holds is left to the frameworks' own choice of interface, with a warning."""
    if interface is None:
        interface = inventory.interface_of(address)
        if interface is None:
            log.warning(
                "--address %s is on no interface of this host: gloo and NCCL pick their own "
                "(set --interface if peers cannot reach it)",
                address,
            )
    return NodeNetwork(address=address, interface=interface)


class StopRequest:
    """What a stop asks for: SIGTERM leaves the trainers to their keepers, SIGUSR2 stops them."""

    def __init__(self) -> None:
        self.trainers = False

    def stop_trainers(self, signum: int, frame: object) -> None:
        self.trainers = True
        # Then the same warm shutdown as SIGTERM, through Celery's own handler.
        os.kill(os.getpid(), signal.SIGTERM)


def hold_workdir(workdir: Path) -> IO[str]:
    """Lock the work dir for this agent's lifetime (the kernel drops the lock when it dies).

    A second agent on the same work dir would take the first one's trainers for leftovers of
    a dead agent, and kill them.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    # Jobs' folders, the log spool and the code cache are the agent's: no other user's
    # process, a trainer's included, may walk in.
    workdir.chmod(0o700)
    lock = open(workdir / "agent.lock", "w")  # held, open, until this process ends
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise SystemExit(f"another agent already runs on {workdir}") from None
    return lock


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s %(levelname)s [{args.node}] %(message)s"
    )
    # Time-outs on connecting: a Redis host that does not answer at all must not hang a thread
    # for the minutes the kernel would give a connection attempt.
    client = redis.Redis.from_url(args.redis_url, socket_connect_timeout=5, socket_timeout=30)
    app = make_celery(args.redis_url, args.node)
    sign = signer(args.redis_url)
    owner = credentials.secret_from_url(args.redis_url)
    if owner is not None and owner[0] != args.node:
        raise SystemExit(f"REDIS_URL holds the credentials of {owner[0]}, not of {args.node}")
    workdir = args.workdir.resolve() / args.node
    workdir_lock = hold_workdir(workdir)
    trainer_sandbox = sandbox.probe(
        args.sandbox_uid_base, wanted=args.sandbox, shared=args.sandbox_share
    )
    if trainer_sandbox.isolation.isolated:
        log.info("trainers are isolated: %s", trainer_sandbox.reason)
    else:
        log.warning(
            "NOT ISOLATED: trainers can read what this agent can: %s", trainer_sandbox.reason
        )
    instance_limits = cgroups.probe(args.node, str(workdir), wanted=args.limits).sharing_cores(
        args.cpus
    )
    if instance_limits.enforced:
        log.info("instances are held to their packages: %s", instance_limits.reason)
    else:
        log.warning("LIMITS NOT ENFORCED: %s", instance_limits.reason)
    # The agent (and the keepers and Redis it starts) is the OOM killer's last choice; its
    # trainers take a normal score back (workers/deathsig.py).
    not_lowered = cgroups.lower_oom_priority()
    if not_lowered is not None:
        log.info("the agent's OOM score stays as it was: %s", not_lowered)
    # Lines wait here while Redis is unreachable, and survive a restart of this agent.
    shipper = LogShipper(client, spool_dir=workdir / "log-spool")
    supervisor = Supervisor(
        node=args.node,
        client=client,
        shipper=shipper,
        report=make_reporter(app, sign),
        workdir=workdir,
        code_root=args.code_root.resolve(),
        gpus=args.gpus,
        checkpoint_root=(args.checkpoint_root or args.workdir / "checkpoints").resolve(),
        network=node_network(args.address, args.interface),
        trainer_python=args.trainer_python,
        container_runtime=containers.find_runtime(
            args.container_runtime,
            args.container_config.resolve() if args.container_config else None,
        ),
        image_cache_bytes=int(args.image_cache_gb * (1 << 30)),
        trainer_sandbox=trainer_sandbox,
        keep_job_folders=args.keep_job_folders,
        keep_checkpoints=args.keep_checkpoints,
        keeper_grace=args.keeper_grace,
        disk=diskspace.DiskWatch(args.node, workdir, args.min_free_mb * 1024 * 1024),
        spare_keepers=args.spare_keepers,
        instance_limits=instance_limits,
        agent_oom_lowered=not_lowered is None,
    )
    # Before any task and the first heartbeat: what an earlier agent here left to keepers is
    # ours now (the console sees it running under this incarnation), whatever else it left
    # running must go, and this agent's own trainers are looked after from the first one on.
    leftovers = supervisor.reap_leftovers()
    if any(r.killed for r in leftovers):
        log.info("cleaned up %s", summary(leftovers, "an earlier agent"))
    adopted = supervisor.adopt()
    if adopted:
        log.info("took over from an earlier agent: %s", ", ".join(adopted))
    if instance_limits.enforced and (swept := instance_limits.sweep()):
        log.info("removed %d empty cgroups an earlier agent left", swept)
    reaper = guardian.start(supervisor.records.directory)
    stopping = StopRequest()
    signal.signal(signal.SIGUSR2, stopping.stop_trainers)
    register_tasks(app, supervisor, client)
    inventory = {
        "node": args.node,
        "address": args.address,
        "cpus": args.cpus,
        "memory_gb": args.memory_gb,
        "gpus": args.gpus,
        "gpu_model": args.gpu_model,
        "hostname": platform.node(),
        "pid": os.getpid(),
        "isolation": trainer_sandbox.isolation.value,
        "isolation_reason": trainer_sandbox.reason,
        "limits": instance_limits.layout.value,
        "limits_reason": instance_limits.reason,
    }
    heartbeat = Heartbeat(
        app, inventory, supervisor, interval=args.heartbeat_seconds, sign=sign, client=client
    )
    heartbeat.start()
    worker = app.Worker(
        hostname=f"agent@{args.node}",
        queues=[contract.node_queue(args.node)],
        pool_cls="threads",
        concurrency=args.concurrency,
        loglevel="INFO",
        without_mingle=True,
        without_gossip=True,
        without_heartbeat=True,
    )
    log.info(
        "agent %s (incarnation %s) serving queue %s",
        args.node, supervisor.incarnation, contract.node_queue(args.node),
    )  # fmt: skip
    try:
        worker.start()
    finally:
        # Celery has stopped taking tasks (moments after SIGTERM): the stop timeout runs from here.
        heartbeat.stop()
        supervisor.shutdown(
            timeout=args.stop_timeout - CLOSING_MARGIN_SECONDS, hand_over=not stopping.trainers
        )
        # Lines Redis did not take stay in the spool; the next agent sends them.
        shipper.close(timeout=SHIPPER_CLOSE_SECONDS)
        guardian.release(reaper, timeout=GUARDIAN_RELEASE_SECONDS)
        # The node's cgroup folders go with the last instance's (those keepers still hold for
        # the next agent stay, with their folders).
        instance_limits.remove_node_folders()
        log.info("agent %s stopped", args.node)
        workdir_lock.close()
    return int(worker.exitcode or 0)


if __name__ == "__main__":
    sys.exit(main())
