"""A search with early stopping, beside the same configurations all run to the end.

Starts the real stack (two nodes) and runs, one after the other:

1. the search: 12 trials, 3 at a time, over the digits example's learning rate and batch size
   (TPE, successive halving from epoch 1 with reduction factor 3), each trial a two-instance
   DDP job of 6 epochs (rungs at epochs 1 and 3): the search tests/integration/test_experiments.py
   runs, so that both halves of issue 48's done-when (within 1 point of the best run to the
   end, at most half their epochs) are judged on one search;
2. the baseline: the same 12 configurations (the trials' own parameters) as plain jobs, 3 at a
   time, every one run to its last epoch.

Printed side by side: epochs trained and core-hours used (the trials' attempts, as the console
counts them), wall time, and the best eval accuracy each found; whether the search's best is
within 1 point of the baseline's, and whether it trained at most half the baseline's epochs.

    python -m bench.experiments
"""

import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from stack.redis_server import free_port
from stack.run import Stack

# A judgement reaches a trainer an epoch or so after its rung on two busy cores: at 4 epochs
# that late epoch alone decided whether half the epochs were saved (26 of 48 in one run).
EPOCHS = 6
# Digits' epochs take a fifth of a second here, less than a judgement needs to reach the
# trainer (its point's way to the database, the judge, the stop: about a second on two busy
# cores, several while a console worker restarts): a trial would train to the end before its
# stop came, whatever the pruner decided. Epochs of a few seconds, as a real data set's take
# (minutes), let early stopping save what it decides to.
PACE = ["--min-epoch-seconds", "2"]
TRIALS = 12
PARALLEL = 3
GUARD_SECONDS = 1800.0  # stops a hung run; measures nothing
TEMPLATE: dict[str, Any] = {
    "image": "pytorch:2.13-cpu",
    "program": {"script": "digits-ddp", "args": ["--epochs", str(EPOCHS), *PACE]},
    "roles": {
        "master": {"package": "cpu-1", "instances": 1},
        "worker": {"package": "cpu-1", "instances": 1},
    },
}
SEARCH: dict[str, Any] = {
    "space": {
        "--lr": {"type": "float", "low": 0.002, "high": 2.0, "log": True},
        "--batch-size": {"type": "int", "low": 4, "high": 32, "log": True},
    },
    "objective": {"metric": "eval_accuracy", "goal": "max", "unit": "epoch"},
    "searcher": "tpe",
    "pruner": "successive_halving",
    "pruner_options": {"min_resource": 1, "reduction_factor": 3},
    "budget": {"trials": TRIALS, "parallel": PARALLEL},
    "seed": 11,
}


class Console:
    def __init__(self, url: str, token: str) -> None:
        self.http = httpx.Client(
            base_url=url, headers={"Authorization": f"Token {token}"}, timeout=60
        )

    def get(self, path: str, **params: Any) -> Any:
        response = self.http.get(path, params=params)
        response.raise_for_status()
        return response.json()

    def post(self, path: str, body: dict[str, Any]) -> Any:
        response = self.http.post(path, json=body)
        if response.status_code >= 400:
            raise RuntimeError(f"POST {path}: {response.status_code} {response.text}")
        return response.json()

    def epochs(self, job_id: int) -> list[float]:
        """The job's eval_accuracy values, one per epoch it trained."""
        points = self.get(f"/api/v1/jobs/{job_id}/metrics", name="eval_accuracy")["points"]
        return [p["value"] for p in points]

    def core_hours(self, job_id: int) -> float:
        job = self.get(f"/api/v1/jobs/{job_id}")
        seconds = sum(
            (
                datetime.fromisoformat(a["finished"]) - datetime.fromisoformat(a["started"])
            ).total_seconds()
            for a in job["attempts"]
            if a["started"] and a["finished"]
        )
        return seconds / 3600.0 * job["totals"]["cpu"]


def wait_for(what: str, check: Callable[[], Any]) -> Any:
    deadline = time.monotonic() + GUARD_SECONDS
    while not (value := check()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"gave up waiting for {what}")
        time.sleep(0.5)
    return value


def args_of(params: dict[str, Any]) -> list[str]:
    args = ["--epochs", str(EPOCHS), *PACE]
    for key, value in params.items():
        args += [key, repr(value) if isinstance(value, float) else str(value)]
    return args


def run_to_the_end(console: Console, configurations: list[dict[str, Any]]) -> list[int]:
    """Every configuration as a plain job, PARALLEL at a time, each to its last epoch."""
    waiting = list(enumerate(configurations))
    running: list[int] = []
    done: list[int] = []
    while waiting or running:
        while waiting and len(running) < PARALLEL:
            number, params = waiting.pop(0)
            request = {**TEMPLATE, "name": f"to the end #{number}"}
            request["program"] = {**TEMPLATE["program"], "args": args_of(params)}
            running.append(console.post("/api/v1/jobs", request)["id"])
        ended = wait_for(
            "a baseline job to end",
            lambda: [j for j in running if console.get(f"/api/v1/jobs/{j}")["log_complete"]],
        )
        for job_id in ended:
            state = console.get(f"/api/v1/jobs/{job_id}")["state"]
            if state != "succeeded":
                raise RuntimeError(f"baseline job {job_id} ended {state}")
            running.remove(job_id)
            done.append(job_id)
    return done


def measure(console: Console) -> bool:
    began = time.monotonic()
    experiment = console.post("/api/v1/experiments", {"name": "bench search", "template": {
        **TEMPLATE, "name": "bench search"}, **SEARCH})  # fmt: skip
    path = f"/api/v1/experiments/{experiment['id']}"
    found = wait_for(
        "the search to end", lambda: (e := console.get(path))["state"] != "running" and e
    )
    search_seconds = time.monotonic() - began
    if found["state"] != "finished":
        print(f"experiments: FAILED the search ended {found['state']}: {found['reason']}")
        return False
    trials = found["trials"]
    search_epochs = sum(len(console.epochs(t["job"])) for t in trials)
    search_hours = sum(console.core_hours(t["job"]) for t in trials)
    pruned = sum(1 for t in trials if t["state"] == "pruned")
    best = found["best"]

    began = time.monotonic()
    baseline = run_to_the_end(console, [t["params"] for t in trials])
    baseline_seconds = time.monotonic() - began
    finals = [console.epochs(j) for j in baseline]
    baseline_epochs = sum(len(f) for f in finals)
    baseline_hours = sum(console.core_hours(j) for j in baseline)
    baseline_best = max(f[-1] for f in finals)
    best_number = max(range(len(finals)), key=lambda k: finals[k][-1])

    print(f"{'':<28}{'search (stopped early)':>24}{'all 12 to the end':>20}{'ratio':>8}")
    print(
        f"{'epochs trained':<28}{search_epochs:>24}{baseline_epochs:>20}"
        f"{search_epochs / baseline_epochs:>8.2f}"
    )
    print(
        f"{'core-hours':<28}{search_hours:>24.4f}{baseline_hours:>20.4f}"
        f"{search_hours / baseline_hours:>8.2f}"
    )
    print(
        f"{'wall time (s)':<28}{search_seconds:>24.0f}{baseline_seconds:>20.0f}"
        f"{search_seconds / baseline_seconds:>8.2f}"
    )
    print(
        f"{'best eval accuracy':<28}{best['value']:>24.4f}{baseline_best:>20.4f}"
        f"{best['value'] - baseline_best:>+8.4f}"
    )
    print(
        f"  search: {pruned} of {TRIALS} trials stopped early; best trial {best['trial']} "
        f"{best['params']}; to the end, best configuration: trial {best_number} "
        f"{trials[best_number]['params']}"
    )
    within = best["value"] >= baseline_best - 0.01
    halved = search_epochs <= baseline_epochs / 2
    print(
        f"  best within 1 point of the best run to the end: {'yes' if within else 'NO'}; "
        f"at most half the epochs: {'yes' if halved else 'NO'}"
    )
    return within and halved


def experiments() -> bool:
    with tempfile.TemporaryDirectory(prefix="bench-experiments-") as folder:
        stack = Stack(var_dir=Path(folder) / "var", port=free_port(), nodes=2)
        try:
            stack.prepare()
            stack.start()
            console = Console(stack.url, stack.manage("token", "admin").strip())
            return measure(console)
        except (RuntimeError, OSError, KeyError, httpx.HTTPError) as exc:
            print(f"experiments: FAILED {exc}")
            return False
        finally:
            stack.stop()


if __name__ == "__main__":
    sys.exit(0 if experiments() else 1)
