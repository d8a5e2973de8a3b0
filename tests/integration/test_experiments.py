"""An experiment over the real stack (issue 48's done-when): a 12-trial, 3-parallel search over
the digits example's learning rate and batch size, each trial a two-instance DDP job, stopped
early by successive halving, with the console worker killed mid-search.

It finishes; at least a third of its trials are stopped early (through Cancel's path, the
pruner's reason on the job); it trains at most half the epochs that its 12 trials run to the
end would; and the kill loses no trial. The comparison with the same 12 configurations all run
to the end (best objective, compute saved) is bench/experiments.py's.
"""

import signal
import time
from collections.abc import Callable
from typing import Any

import pytest

from bench.experiments import EPOCHS, PACE, PARALLEL, SEARCH, TRIALS
from tests.conftest import RunningStack, StackClient, pytorch_request

pytestmark = pytest.mark.integration

# Successive halving's rungs are at epochs 1 and 3 (min_resource 1, reduction factor 3): a
# trial is stopped after its first or third epoch, or runs its 6 (a judgement reaches the
# trainer an epoch or so late on two busy cores: 6 epochs, not 4, keep that from deciding
# whether half the epochs were saved). Each epoch lasts at least 2 s (bench.experiments.PACE),
# long next to the time a judgement takes to reach the trainer (the point's way to the
# database, the judge, the stop), so that a stopped trial trains little past its rung: at a
# fifth of a second an epoch, the first trials ran to their end before their stop came, and
# the search once trained 43 of 72 epochs with 11 of 12 trials stopped early. Very
# low and very high learning rates in the space are what there is to stop. The search itself
# is the bench's (bench/experiments.py), which also runs its 12 configurations to the end.
#
# Long enough for a search of a few minutes on two busy cores; it only stops a hung test.
SEARCH_GUARD = 480.0
# How often the search is looked at: its answer lists every trial, and two cores also run the
# trainers.
LOOK_EVERY_SECONDS = 1.0


def search_request(name: str) -> dict[str, Any]:
    template = pytorch_request(name, "digits-ddp", 2, args=["--epochs", str(EPOCHS), *PACE])
    return {"name": name, "template": template, **SEARCH}


def experiment(client: StackClient, experiment_id: int) -> dict[str, Any]:
    response = client.http.get(f"/api/v1/experiments/{experiment_id}")
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def until(what: str, check: Callable[[], Any]) -> Any:
    """wait_until, looking less often."""
    deadline = time.monotonic() + SEARCH_GUARD
    while not (value := check()):
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(LOOK_EVERY_SECONDS)
    return value


def epochs_trained(client: StackClient, job_id: int) -> int:
    """Epochs the job's trainer finished: its eval_accuracy points (one per epoch)."""
    response = client.http.get(f"/api/v1/jobs/{job_id}/metrics", params={"name": "eval_accuracy"})
    assert response.status_code == 200, response.text
    return len(response.json()["points"])


def test_a_search_stops_trials_early_and_survives_a_console_worker_restart(
    stack: RunningStack,
) -> None:
    dana = stack.create_user(
        "dana-search",
        "dana-search-password",
        quota={"cpu": 2 * PARALLEL, "gpus": 0, "memory_gb": 32, "running_jobs": PARALLEL},
    )
    created = dana.http.post("/api/v1/experiments", json=search_request("digits-search"))
    assert created.status_code == 201, created.text
    experiment_id = created.json()["id"]

    # Mid-search: some trials ended, others running. The console worker dies (kill -9) and
    # is started again; the search goes on from the database.
    until(
        "a third of the trials asked",
        lambda: experiment(dana, experiment_id)["used"]["trials"] >= TRIALS // 3,
    )
    old_pid = stack.stack.pid("console-worker")
    stack.stack.kill("console-worker", signal.SIGKILL)
    stack.stack.wait_restarted("console-worker", old_pid)

    done = until(
        "the search to finish",
        lambda: (e := experiment(dana, experiment_id))["state"] != "running" and e,
    )
    assert done["state"] == "finished", done["reason"]
    trials = done["trials"]
    assert [t["number"] for t in trials] == list(range(TRIALS)), "no trial lost"
    assert all(t["job"] is not None for t in trials)
    # Whole, in the captured output: the assertion's message is cut short where it is long.
    for t in trials:
        print(f"trial {t['number']}: {t['state']}: {t['reason']}")
    assert {t["state"] for t in trials} <= {"completed", "pruned"}, [
        (t["number"], t["state"], t["reason"]) for t in trials
    ]
    for trial in trials:
        job = dana.job(trial["job"])
        if trial["state"] == "pruned":
            assert job["state"] == "cancelled"
            assert job["reason"] == trial["reason"]
            assert trial["reason"].startswith("stopped early: eval_accuracy "), trial["reason"]
            assert "cut-off" in trial["reason"]
        else:
            assert job["state"] == "succeeded"
            assert trial["judged_through"] == EPOCHS
    pruned = [t for t in trials if t["state"] == "pruned"]
    epochs = sum(epochs_trained(dana, t["job"]) for t in trials)
    print(
        f"\nsearch: {len(pruned)} of {TRIALS} trials stopped early, {epochs} epochs trained "
        f"of {TRIALS * EPOCHS} ({epochs / (TRIALS * EPOCHS):.0%}); best {done['best']}"
    )
    assert len(pruned) >= TRIALS / 3
    assert epochs <= TRIALS * EPOCHS / 2
    assert done["best"] is not None and done["best"]["value"] >= 0.9
    assert done["used"] == {**done["used"], "trials": TRIALS, "running": 0}
