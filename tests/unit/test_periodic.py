"""The console worker's periodic passes: every interval, and the experiment sweep also at once
when its worker starts (a killed worker's judgements in hand are not redelivered for an hour)."""

import threading

from jobs.services.experiments.sweep import ExperimentSweep
from jobs.services.periodic import PeriodicPass


class Counted(PeriodicPass[int]):
    what = "counted"

    def __init__(self, interval: float, at_start: bool) -> None:
        super().__init__(interval)
        self.pass_at_start = at_start
        self.passed = threading.Event()

    def one_pass(self) -> int:
        self.passed.set()
        return 1


def test_a_pass_at_start_runs_before_its_first_interval_and_others_wait_for_it() -> None:
    eager, patient = Counted(3600, at_start=True), Counted(3600, at_start=False)
    for loop in (eager, patient):
        loop.start()
    try:
        assert eager.passed.wait(timeout=60)  # a hang guard: an hour's interval never comes
        assert not patient.passed.is_set()
    finally:
        for loop in (eager, patient):
            loop.stop()
            loop.join(timeout=60)


def test_the_experiment_sweep_passes_at_start() -> None:
    assert ExperimentSweep.pass_at_start and not PeriodicPass.pass_at_start
