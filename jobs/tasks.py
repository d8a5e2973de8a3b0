"""Console-side Celery tasks: what agents report, and scheduling. Thin: each hands its payload
to a service.

Every task is safe to receive twice (Celery redelivers after a crash); the services ignore a
report that no longer applies. A report, or heartbeat, that is not signed by the node it names
is refused (jobs.services.agent_access.authentic). The console worker also runs the
reconciliation loop (jobs.services.reconcile) and the retention loop (jobs.services.retention),
started once the worker is ready.
"""

from typing import Any

from celery import shared_task
from celery.signals import worker_ready, worker_shutdown
from django.conf import settings

from jobs.services import (
    agent_access,
    heartbeat_batch,
    heartbeat_drain,
    heartbeat_limits,
    planner_stats,
    reconcile,
    retention,
)
from jobs.services.experiments import driver as experiments
from jobs.services.experiments.sweep import ExperimentSweep
from jobs.services.lifecycle import experiment_requests, reports, restarts
from jobs.services.periodic import PeriodicPass
from jobs.services.scheduler import scheduling
from jobs.services.slurm import slurm_pass
from workers import contract


@shared_task(name=contract.TASK_NODE_HEARTBEAT)
def node_heartbeat(payload: dict[str, Any]) -> None:
    # Heartbeats of agents that find no console worker draining its Redis list (heartbeat_drain,
    # which hands them on as this does). The size first (checking a signature serialises the
    # payload); then the signature and the rate (heartbeat_limits) are checked, and the
    # heartbeat written, in a batch with those arriving close to it (heartbeat_batch): this may
    # return before it is written, and a console worker killed outright loses the few held in
    # memory (the next comes within seconds).
    if heartbeat_limits.too_large(payload):
        return
    heartbeat_batch.submit(payload)


@shared_task(name=contract.TASK_REPLICA_STARTED)
def replica_started(payload: dict[str, Any]) -> None:
    if not agent_access.authentic(contract.TASK_REPLICA_STARTED, payload):
        return
    reports.replica_started(
        payload["job_id"],
        payload["role"],
        payload["index"],
        payload["node"],
        str(payload.get("incarnation", "")),
        attempt=int(payload.get("attempt", 0)),
    )


@shared_task(name=contract.TASK_REPLICA_EXITED)
def replica_exited(payload: dict[str, Any]) -> None:
    if not agent_access.authentic(contract.TASK_REPLICA_EXITED, payload):
        return
    reports.replica_exited(
        payload["job_id"],
        payload["role"],
        payload["index"],
        payload["node"],
        payload["state"],
        payload.get("exit_code"),
        payload.get("reason", ""),
        payload.get("stderr_tail", []),
        payload.get("ended_at"),
        attempt=int(payload.get("attempt", 0)),
        log_ends=payload.get("log_ends") or {},
        usage=payload.get("usage"),
    )


@shared_task(name=contract.TASK_SLURM_NOW)
def slurm_pass_now() -> None:
    slurm_pass.run_pass()


@shared_task(name=contract.TASK_SCHEDULE)
def schedule() -> None:
    scheduling.schedule()


@shared_task(name=contract.TASK_RESUME_RESTART)
def resume_restart(job_id: int) -> None:
    restarts.resume(job_id)


@shared_task(name=experiment_requests.TASK_ADVANCE_EXPERIMENT)
def advance_experiment(experiment_id: int) -> None:
    experiments.advance(experiment_id)


@shared_task(name=experiment_requests.TASK_JUDGE_TRIAL)
def judge_trial(job_id: int) -> None:
    experiments.judge(job_id)


# Threads of the console worker, each started once it is ready: on a timer, if its interval is
# set, reconciliation, and retention and the planner's statistics beside it (a pass is a few
# queries, and every console worker may run one: removals are re-checked under a lock); and,
# unless TRAINYARD_HEARTBEAT_DRAIN is off, the heartbeat drain, which takes agents' heartbeats
# off a Redis list past Celery (every console worker may run one: LPOP is atomic).
_periodic: list[PeriodicPass[Any]] = []


@worker_ready.connect
def start_periodic_passes(**_: Any) -> None:
    if _periodic:
        return
    for loop_class, interval in (
        (reconcile.ReconcileLoop, settings.TRAINYARD_RECONCILE_SECONDS),
        (retention.RetentionLoop, settings.TRAINYARD_RETENTION_SECONDS),
        (planner_stats.StatisticsLoop, settings.TRAINYARD_DB_STATISTICS_SECONDS),
        (slurm_pass.SlurmLoop, settings.TRAINYARD_SLURM_SECONDS),
        (ExperimentSweep, settings.TRAINYARD_EXPERIMENT_SWEEP_SECONDS),
    ):
        if interval > 0:
            loop: PeriodicPass[Any] = loop_class(interval)
            loop.start()
            _periodic.append(loop)
    if settings.TRAINYARD_LDAP_URL and settings.TRAINYARD_LDAP_CHECK_SECONDS > 0:
        from jobs.directory import DirectoryCheck  # python-ldap: only where a directory is set

        check = DirectoryCheck(settings.TRAINYARD_LDAP_CHECK_SECONDS)
        check.start()
        _periodic.append(check)
    if settings.TRAINYARD_HEARTBEAT_DRAIN:
        drain = heartbeat_drain.DrainLoop()
        drain.start()
        _periodic.append(drain)


@worker_shutdown.connect
def stop_periodic_passes(**_: Any) -> None:
    # The drain's stop waits for it to delete its flag (agents send tasks again at once) and
    # write what is left on its list.
    for loop in _periodic:
        loop.stop()
