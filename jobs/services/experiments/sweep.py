"""The console worker's experiment sweep: on a timer, judge every running trial and advance
every active experiment. The hints (a trial's job ended, its objective archived) do this at
once; the sweep is what makes a hint lost with a killed console worker cost only a delay."""

from jobs.services.experiments import driver
from jobs.services.periodic import PeriodicPass


class ExperimentSweep(PeriodicPass[int]):
    what = "experiment sweep"

    def one_pass(self) -> int:
        return driver.sweep()
